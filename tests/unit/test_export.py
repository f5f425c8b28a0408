"""The model artifact: export/load round trip, refusal of pickles and bad meta, drift helpers."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from aicluster.train import env
from aicluster.train.export import (
    Predictor,
    categorical_reference,
    check_artifact,
    default_export_dir,
    export_model,
    file_sha256,
    load_predictor,
    numeric_reference,
    read_model_meta,
    tree_sha256,
)

SCRIPT = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Doubler:
        def __init__(self, weights, config):
            self.model = nn.Linear(config["features"], 1)
            self.model.load_state_dict(weights)

        def predict(self, inputs):
            x = inputs.get("x")
            if not isinstance(x, list):
                raise ValueError("'x' must be a list of numbers")
            with torch.no_grad():
                return {"y": self.model(torch.tensor([x], dtype=torch.float32)).item()}


    def load(weights, config):
        return Doubler(weights, config)


    def not_a_predictor(weights, config):
        return 42
    """
)


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "src"
    directory.mkdir()
    (directory / "linear.py").write_text(SCRIPT)
    return directory


def make_model() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(3, 1)


def export(code_dir: Path, target: Path, **kwargs: object) -> Path:
    options: dict[str, object] = {"entrypoint": "linear.py:load", "config": {"features": 3}}
    options.update(kwargs)
    return export_model(make_model(), directory=target, code_dir=code_dir, **options)  # type: ignore[arg-type]


def test_round_trip_predicts_what_the_model_computes(code_dir: Path, tmp_path: Path) -> None:
    digest = "ab" * 32
    path = export(code_dir, tmp_path / "export", metrics={"loss": 0.5}, dataset_hash=digest)
    assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*")) == [
        "code",
        "code/linear.py",
        "model.json",
        "weights.safetensors",
    ]
    meta = read_model_meta(path)
    assert meta["entrypoint"] == "linear.py:load" and meta["metrics"] == {"loss": 0.5}
    assert meta["dataset_hash"] == digest and "drift" not in meta
    predictor = load_predictor(path)
    assert isinstance(predictor, Predictor)
    x = [1.0, -2.0, 0.5]
    with torch.no_grad():
        expected = make_model()(torch.tensor([x])).item()
    assert predictor.predict({"x": x}) == {"y": pytest.approx(expected)}
    with pytest.raises(ValueError, match="'x' must be a list"):
        predictor.predict({"x": "nope"})


def test_two_versions_of_one_script_load_side_by_side(code_dir: Path, tmp_path: Path) -> None:
    first = load_predictor(export(code_dir, tmp_path / "a"))
    (code_dir / "linear.py").write_text(SCRIPT.replace('{"y":', '{"v2": True, "y":'))
    second = load_predictor(export(code_dir, tmp_path / "b"))
    assert "v2" not in first.predict({"x": [0.0, 0.0, 0.0]})
    assert second.predict({"x": [0.0, 0.0, 0.0]})["v2"] is True


def test_export_replaces_an_older_export_atomically(code_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "export"
    export(code_dir, target, metrics={"loss": 2.0})
    export(code_dir, target, metrics={"loss": 1.0})
    assert read_model_meta(target)["metrics"] == {"loss": 1.0}
    assert [p.name for p in tmp_path.iterdir() if p.name != "src"] == ["export"]  # no leftovers


def test_a_pickled_weights_file_is_refused(code_dir: Path, tmp_path: Path) -> None:
    path = export(code_dir, tmp_path / "export")
    assert check_artifact(path)["entrypoint"] == "linear.py:load"
    torch.save(make_model().state_dict(), path / "weights.safetensors")  # a pickle
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_predictor(path)
    with pytest.raises(ValueError, match="not a safetensors file"):
        check_artifact(path)
    (path / "weights.safetensors").write_bytes(b"\x05" + b"\x00" * 7 + b"[1,2]")
    with pytest.raises(ValueError, match="not a safetensors file"):
        check_artifact(path)
    (path / "weights.safetensors").unlink()
    with pytest.raises(ValueError, match="missing"):
        check_artifact(path)


def test_bad_entrypoint_in_model_json_is_a_readable_error(code_dir: Path, tmp_path: Path) -> None:
    path = export(code_dir, tmp_path / "export")
    meta = json.loads((path / "model.json").read_text())
    for entrypoint, message in [
        ("linear", "is not '<file>.py:<function>'"),
        ("../linear.py:load", "is not '<file>.py:<function>'"),
    ]:
        (path / "model.json").write_text(json.dumps({**meta, "entrypoint": entrypoint}))
        with pytest.raises(ValueError, match=message):
            load_predictor(path)
    (path / "model.json").write_text(json.dumps({**meta, "entrypoint": "linear.py:missing"}))
    with pytest.raises(ValueError, match="has no function 'missing'"):
        load_predictor(path)
    (path / "model.json").write_text(json.dumps({**meta, "entrypoint": "other.py:load"}))
    with pytest.raises(ValueError, match="code is missing"):
        load_predictor(path)
    (path / "model.json").write_text(
        json.dumps({**meta, "entrypoint": "linear.py:not_a_predictor"})
    )
    with pytest.raises(ValueError, match="no predict"):
        load_predictor(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": 2}, "unsupported format 2"),
        ({"config": []}, "'config' must be an object"),
        ({"metrics": {"loss": "low"}}, "metric 'loss' must be a number"),
        ({"dataset_hash": "xyz"}, "dataset_hash must be a SHA-256"),
        ({"drift": {"feature": "x", "kind": "other", "reference": []}}, "drift.kind"),
        (
            {"drift": {"feature": "x", "kind": "numeric", "edges": [1], "reference": [1]}},
            "one shorter",
        ),
    ],
)
def test_invalid_model_json_is_refused(
    code_dir: Path, tmp_path: Path, change: dict[str, object], message: str
) -> None:
    path = export(code_dir, tmp_path / "export")
    meta = json.loads((path / "model.json").read_text())
    (path / "model.json").write_text(json.dumps({**meta, **change}))
    with pytest.raises(ValueError, match=message):
        read_model_meta(path)


def test_missing_or_unparsable_model_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a model artifact"):
        read_model_meta(tmp_path)
    (tmp_path / "model.json").write_text("{")
    with pytest.raises(ValueError, match="unreadable"):
        read_model_meta(tmp_path)


def test_export_refuses_bad_arguments(code_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"is not '<file>\.py:<function>'"):
        export(code_dir, tmp_path / "e", entrypoint="linear.load")
    with pytest.raises(FileNotFoundError, match=r"other\.py"):
        export(code_dir, tmp_path / "e", entrypoint="other.py:load")
    with pytest.raises(ValueError, match="not a tensor"):
        export_model(
            {"a": 1},
            entrypoint="linear.py:load",
            config={},
            directory=tmp_path / "e",
            code_dir=code_dir,
        )
    with pytest.raises(ValueError, match="drift"):
        export(code_dir, tmp_path / "e", drift={"feature": "x", "kind": "categorical"})
    assert not (tmp_path / "e").exists()


def test_default_export_dir_is_next_to_the_checkpoints(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(env.CHECKPOINT_DIR, str(tmp_path / "runs" / "j-1" / "checkpoints"))
    assert default_export_dir() == tmp_path / "runs" / "j-1" / "export"
    monkeypatch.delenv(env.CHECKPOINT_DIR)
    monkeypatch.setenv(env.RUN_DIR, str(tmp_path / "runs" / "j-2" / "3"))
    assert default_export_dir() == tmp_path / "runs" / "j-2" / "export"


def test_categorical_reference_counts_shares() -> None:
    drift = categorical_reference("aabz", ["a", "b", "c"], feature="prompt")
    assert drift == {
        "feature": "prompt",
        "kind": "categorical",
        "categories": ["a", "b", "c"],
        "reference": [2 / 3, 1 / 3, 0.0],
    }
    with pytest.raises(ValueError):
        categorical_reference("zz", ["a"], feature="prompt")


def test_numeric_reference_has_quantile_bins() -> None:
    drift = numeric_reference(range(100), bins=4, feature="x")
    assert drift["edges"] == [25.0, 50.0, 75.0]
    assert drift["reference"] == [0.25, 0.25, 0.25, 0.25]
    with pytest.raises(ValueError):
        numeric_reference([], feature="x")


def test_hashes_ignore_timestamps_but_not_content(code_dir: Path, tmp_path: Path) -> None:
    first = export(code_dir, tmp_path / "a")
    second = export(code_dir, tmp_path / "b")
    assert tree_sha256(first / "code") == tree_sha256(second / "code")
    assert file_sha256(first / "code" / "linear.py") == file_sha256(code_dir / "linear.py")
    (second / "code" / "linear.py").write_text("changed")
    assert tree_sha256(first / "code") != tree_sha256(second / "code")
