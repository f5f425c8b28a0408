"""The model artifact a job exports for serving, and the loader serving uses.

A model version is an immutable directory::

    weights.safetensors   safetensors.torch.save_file(state_dict): tensors only, no pickle
    model.json            {"format": 1, "entrypoint": "<file>.py:<function>", "config": {...},
                           "metrics": {...}, "dataset_hash": "<sha256>" | null, "drift": {...}?}
    code/<file>.py        snapshot of the training script that holds the entrypoint

``drift`` (optional) is the training data's reference distribution of one predict input:
``{"feature", "kind": "categorical", "categories", "reference"}`` or
``{"feature", "kind": "numeric", "edges", "reference"}`` (see :func:`categorical_reference`,
:func:`numeric_reference`). The values of a feature are its characters when it is a string and
its elements, flattened, when it is a list (``[[...], ...]`` rows of numbers); a numeric value
``v`` falls in bin ``bisect_right(edges, v)``, a categorical one outside ``categories`` in none.

Safetensors rather than ``torch.save``: loading a pickle runs code from the file, and the
registry serves one tenant's files in processes shared by many.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.util
import json
import math
import os
import re
import secrets
import shutil
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from aicluster.train import env
from aicluster.train.ckptdir import fsync_dir

if TYPE_CHECKING:
    import torch

__all__ = [
    "CODE_DIR",
    "FORMAT",
    "META_FILE",
    "WEIGHTS_FILE",
    "Predictor",
    "categorical_reference",
    "check_artifact",
    "default_export_dir",
    "export_model",
    "file_sha256",
    "load_predictor",
    "numeric_reference",
    "read_model_meta",
    "tree_sha256",
]

FORMAT = 1
WEIGHTS_FILE = "weights.safetensors"
META_FILE = "model.json"
CODE_DIR = "code"
_ENTRYPOINT = re.compile(r"^([A-Za-z_][A-Za-z0-9_\-]*\.py):([A-Za-z_][A-Za-z0-9_]*)$")


@runtime_checkable
class Predictor(Protocol):
    """What an entrypoint returns: ``predict`` maps one JSON request to one JSON answer.

    Raises ``ValueError`` with a readable message for bad inputs (serving answers 422).
    """

    def predict(self, inputs: dict[str, Any]) -> dict[str, Any]: ...


# -- hashes ---------------------------------------------------------------------------------------


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a file's bytes: a dataset hash."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tree_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a directory: every file's relative path and bytes, in sorted order.

    Independent of timestamps and permissions, so a copy hashes the same (a code version).
    """
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        digest.update(file_sha256(file).encode() + b"\n")
    return digest.hexdigest()


# -- drift references -----------------------------------------------------------------------------


def categorical_reference(
    values: Iterable[Any], categories: Iterable[Any], *, feature: str
) -> dict[str, Any]:
    """The drift reference of a categorical input: each category's share of ``values``.

    Values outside ``categories`` are not counted. Raises ``ValueError`` if none is counted.
    """
    names = [str(c) for c in categories]
    counts = Counter(str(v) for v in values)
    total = sum(counts[name] for name in names)
    if not names or total == 0:
        raise ValueError("categorical_reference: no value falls in the categories")
    return {
        "feature": feature,
        "kind": "categorical",
        "categories": names,
        "reference": [counts[name] / total for name in names],
    }


def numeric_reference(values: Iterable[float], bins: int = 10, *, feature: str) -> dict[str, Any]:
    """The drift reference of a numeric input: ``bins`` quantile bins of the training values.

    ``edges`` are the ``bins - 1`` inner quantiles (a value ``v`` falls in bin
    ``bisect_right(edges, v)``), so each bin holds about ``1 / bins`` of the training data.
    Raises ``ValueError`` for no finite values or fewer than 2 bins.
    """
    data = sorted(float(v) for v in values if math.isfinite(float(v)))
    if not data or bins < 2:
        raise ValueError("numeric_reference: need finite values and at least 2 bins")
    edges = [data[min(len(data) - 1, (len(data) * i) // bins)] for i in range(1, bins)]
    counts = [0] * bins
    for value in data:
        counts[bisect.bisect_right(edges, value)] += 1
    return {
        "feature": feature,
        "kind": "numeric",
        "edges": edges,
        "reference": [count / len(data) for count in counts],
    }


# -- export ---------------------------------------------------------------------------------------


def default_export_dir() -> Path:
    """``<state_dir>/runs/<job_id>/data/export``, next to the job's checkpoints; ``./export``
    when the script runs outside aicluster."""
    checkpoints = os.environ.get(env.CHECKPOINT_DIR)
    if checkpoints:
        return Path(checkpoints).parent / "export"
    run_dir = os.environ.get(env.RUN_DIR)
    if run_dir:
        return Path(run_dir).parent / "export"
    return Path.cwd() / "export"


def _script_dir() -> Path:
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv else "")
    return Path(main_file).resolve().parent if main_file else Path.cwd()


def _parse_entrypoint(entrypoint: Any) -> tuple[str, str]:
    match = _ENTRYPOINT.match(entrypoint) if isinstance(entrypoint, str) else None
    if match is None:
        raise ValueError(
            f"entrypoint {entrypoint!r} is not '<file>.py:<function>' (e.g. 'train.py:load')"
        )
    return match.group(1), match.group(2)


def export_model(
    model_or_state_dict: Any,
    *,
    entrypoint: str,
    config: Mapping[str, Any],
    metrics: Mapping[str, float] | None = None,
    dataset_hash: str | None = None,
    drift: Mapping[str, Any] | None = None,
    directory: str | os.PathLike[str] | None = None,
    code_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the model artifact (module docstring) and return its directory. Call on rank 0.

    ``model_or_state_dict`` is an ``nn.Module`` (a DDP wrapper is unwrapped) or a state dict.
    The entrypoint's file is copied from ``code_dir`` (default: the running script's
    directory). ``directory`` defaults to :func:`default_export_dir`. Atomic: written
    into a temporary sibling, fsynced, then renamed over any older export, so a reader sees the
    old export or the new one. Raises ``ValueError`` for a bad entrypoint, config or drift, and
    ``FileNotFoundError`` when the entrypoint's file is not next to the script.
    """
    from safetensors.torch import save_file

    file_name, _ = _parse_entrypoint(entrypoint)
    source = (Path(code_dir) if code_dir is not None else _script_dir()) / file_name
    if not source.is_file():
        raise FileNotFoundError(f"the entrypoint's file {source} does not exist")
    meta = _meta(entrypoint, config, metrics, dataset_hash, drift)
    tensors = _tensors(model_or_state_dict)
    target = Path(directory) if directory is not None else default_export_dir()
    target = target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{secrets.token_hex(4)}")
    try:
        (tmp / CODE_DIR).mkdir(parents=True)
        save_file(tensors, str(tmp / WEIGHTS_FILE))
        shutil.copyfile(source, tmp / CODE_DIR / file_name)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")
        for path in (tmp / WEIGHTS_FILE, tmp / META_FILE, tmp / CODE_DIR / file_name):
            _fsync(path)
        fsync_dir(tmp / CODE_DIR)
        fsync_dir(tmp)
        _replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _meta(
    entrypoint: str,
    config: Mapping[str, Any],
    metrics: Mapping[str, float] | None,
    dataset_hash: str | None,
    drift: Mapping[str, Any] | None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "format": FORMAT,
        "entrypoint": entrypoint,
        "config": dict(config),
        "metrics": {str(k): float(v) for k, v in (metrics or {}).items()},
        "dataset_hash": dataset_hash,
    }
    if drift is not None:
        meta["drift"] = dict(drift)
    validate_meta(meta)
    json.dumps(meta)  # the config must be JSON (raises TypeError naming the bad value)
    return meta


def _tensors(model_or_state_dict: Any) -> dict[str, torch.Tensor]:
    import torch

    module = getattr(model_or_state_dict, "module", model_or_state_dict)  # DDP → its model
    state = module.state_dict() if isinstance(module, torch.nn.Module) else model_or_state_dict
    if not isinstance(state, Mapping):
        raise ValueError("export_model needs an nn.Module or a state dict of tensors")
    tensors: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"state dict entry {key!r} is not a tensor")
        # safetensors refuses shared storage and views: one contiguous CPU copy per entry.
        tensors[str(key)] = value.detach().to("cpu").contiguous().clone()
    return tensors


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _replace_dir(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``; an older ``target`` is renamed aside first, then removed."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{secrets.token_hex(4)}")
        os.rename(target, old)
    os.rename(tmp, target)
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- reading and loading --------------------------------------------------------------------------


def validate_meta(meta: Any, where: str = META_FILE) -> dict[str, Any]:
    """Check a parsed ``model.json``; raises ``ValueError`` saying what is wrong."""
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: expected a JSON object")
    if meta.get("format") != FORMAT:
        raise ValueError(f"{where}: unsupported format {meta.get('format')!r} (expected {FORMAT})")
    try:
        _parse_entrypoint(meta.get("entrypoint"))
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    for key in ("config", "metrics"):
        if not isinstance(meta.get(key), dict):
            raise ValueError(f"{where}: {key!r} must be an object")
    for key, value in meta["metrics"].items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"{where}: metric {key!r} must be a number")
    dataset_hash = meta.get("dataset_hash")
    if dataset_hash is not None and not re.fullmatch(r"[0-9a-f]{64}", str(dataset_hash)):
        raise ValueError(f"{where}: dataset_hash must be a SHA-256 hex digest or null")
    if meta.get("drift") is not None:
        _validate_drift(meta["drift"], where)
    return meta


def _validate_drift(drift: Any, where: str) -> None:
    if not isinstance(drift, dict) or not isinstance(drift.get("feature"), str):
        raise ValueError(f"{where}: drift must be an object with a 'feature' name")
    reference = drift.get("reference")
    if not isinstance(reference, list) or not all(isinstance(p, int | float) for p in reference):
        raise ValueError(f"{where}: drift.reference must be a list of proportions")
    kind = drift.get("kind")
    if kind == "categorical":
        categories = drift.get("categories")
        if not isinstance(categories, list) or len(categories) != len(reference):
            raise ValueError(f"{where}: drift.categories must match drift.reference in length")
    elif kind == "numeric":
        edges = drift.get("edges")
        if not isinstance(edges, list) or len(edges) + 1 != len(reference):
            raise ValueError(f"{where}: drift.edges must be one shorter than drift.reference")
    else:
        raise ValueError(f"{where}: drift.kind must be 'categorical' or 'numeric', not {kind!r}")


def read_model_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The validated ``model.json`` of the artifact at ``path``.

    Raises ``ValueError`` with a readable message for a missing, unparsable or invalid file.
    """
    file = Path(path) / META_FILE
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{file}: no {META_FILE} (not a model artifact)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{file}: unreadable: {error}") from None
    return validate_meta(meta, str(file))


def check_artifact(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Validate an artifact without loading torch or running its code; returns its meta.

    Checks ``model.json`` (:func:`read_model_meta`), that the weights are a safetensors file
    (its header, read as JSON: never a pickle), and that the entrypoint's file is in ``code/``.
    Raises ``ValueError`` naming what is wrong.
    """
    root = Path(path)
    meta = read_model_meta(root)
    _check_safetensors(root / WEIGHTS_FILE)
    file_name, _ = _parse_entrypoint(meta["entrypoint"])
    if not (root / CODE_DIR / file_name).is_file():
        raise ValueError(f"{root / CODE_DIR / file_name}: the entrypoint's code is missing")
    return meta


def _check_safetensors(file: Path) -> None:
    """The safetensors layout: an 8-byte little-endian header length, then a JSON header."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            valid = 2 <= length <= min(size - 8, 100 << 20)
            header = json.loads(handle.read(length)) if valid else None
    except FileNotFoundError:
        raise ValueError(f"{file}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict) or not all(
        isinstance(entry, dict) and {"dtype", "shape", "data_offsets"} <= entry.keys()
        for key, entry in header.items()
        if key != "__metadata__"
    ):
        raise ValueError(f"{file}: not a safetensors file (weights must be saved without pickle)")


def load_predictor(path: str | os.PathLike[str]) -> Predictor:
    """Load the artifact at ``path`` and return its predictor.

    Weights through ``safetensors.torch.load_file`` (never a pickle); the entrypoint's file is
    imported from ``code/`` under a module name of its own (two versions of one script can live
    in one process); the function is called as ``function(weights, config)``. Raises
    ``ValueError`` for a bad artifact (meta, weights, missing code or function, or a result
    without ``predict``); errors raised by the entrypoint itself propagate.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    root = Path(path)
    meta = read_model_meta(root)
    file_name, function_name = _parse_entrypoint(meta["entrypoint"])
    try:
        weights = load_file(str(root / WEIGHTS_FILE))
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(
            f"{root / WEIGHTS_FILE}: not a readable safetensors file: {error}"
        ) from None
    function = _load_function(root / CODE_DIR / file_name, function_name)
    predictor = function(weights, dict(meta["config"]))
    if not callable(getattr(predictor, "predict", None)):
        raise ValueError(f"{meta['entrypoint']} returned {type(predictor).__name__}, no predict()")
    return predictor  # type: ignore[no-any-return]


def _load_function(file: Path, name: str) -> Any:
    if not file.is_file():
        raise ValueError(f"{file}: the entrypoint's code is missing from the artifact")
    module_name = f"aicluster_model_{file.stem}_{secrets.token_hex(6)}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ValueError(f"{file}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and typing look their module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{file.name} has no function {name!r}")
    return function
