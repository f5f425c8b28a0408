"""The parts of a job spec: its limits, the field types it shares, and the nested models
(``resources:``, ``parallelism:``, ``model:``). See :mod:`aicluster.core.jobspec`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, SecretStr

from aicluster.core.durations import parse_duration
from aicluster.core.resources import ANY_GPU_TYPE

__all__ = [
    "CODE_HASH",
    "DATA_REF",
    "ENV_KEY",
    "MAX_ARGS_BYTES",
    "MAX_DEPTH",
    "MAX_ENV_BYTES",
    "MAX_NODES",
    "MAX_SEALED_CHARS",
    "MAX_SECRETS",
    "MAX_SECRETS_BYTES",
    "MAX_SECRET_BYTES",
    "MAX_SPEC_BYTES",
    "MAX_WORKERS",
    "MODEL_REF",
    "MODULE",
    "REDACTED",
    "SEALED_PREFIX",
    "ModelSpec",
    "Name",
    "ParallelismSpec",
    "ResourcesSpec",
    "Seconds",
    "Secret",
    "SpecModel",
    "refuse_nul",
]

MAX_WORKERS = 4096
MAX_SPEC_BYTES = 256 * 1024
MAX_ENV_BYTES = 64 * 1024
#: At most this many ``secrets:`` per job, each value at most this many bytes (UTF-8), and
#: :data:`MAX_SECRETS_BYTES` in all.
MAX_SECRETS = 64
MAX_SECRET_BYTES = 4096
MAX_SECRETS_BYTES = 64 * 1024
#: What every view of a spec shows in place of a secret's value.
REDACTED = "***"
#: How a sealed (encrypted) secret value begins; see ``aicluster.runtime.sandbox.secretbox``.
SEALED_PREFIX = "aicsec1:"
#: A sealed value of MAX_SECRET_BYTES is about 6,000 characters (Fernet, base64).
MAX_SEALED_CHARS = 8192
MAX_ARGS_BYTES = 64 * 1024
MAX_DEPTH = 32  # mappings and lists inside each other; a spec needs 3
MAX_NODES = 10_000  # values, keys included; a spec with every field at its largest: ~1,600
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
ENV_KEY = r"^[A-Za-z_][A-Za-z0-9_]*$"
MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
#: A shipped tree's SHA-256 (hex, lower case): the name of its archive in the code store.
CODE_HASH = r"^[0-9a-f]{64}$"
#: A dataset the job reads: ``NAME:VERSION`` or ``NAME:latest`` (resolved to a version at submit).
DATA_REF = r"^[a-z0-9][a-z0-9._-]{0,62}:(latest|[1-9][0-9]{0,8})$"
#: A registered model version of the job's tenant: ``NAME:VERSION``.
MODEL_REF = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}:[1-9][0-9]{0,8}$"

Name = Annotated[str, Field(min_length=1, max_length=63, pattern=_NAME)]
#: A secret's value: every dump of a spec shows REDACTED in its place (the API, the CLI, the hash).
Secret = Annotated[SecretStr, PlainSerializer(lambda _: REDACTED, return_type=str)]


def _duration(value: object) -> object:
    """``20s``, ``90m``, ``2h`` as seconds (:func:`parse_duration`); other values as given (a
    number stays a number, true is refused by the strict float)."""
    return parse_duration(value) if isinstance(value, str) else value


#: A duration: a number of seconds, or text with a unit (``20s``, ``90m``, ``2h``); stored as
#: seconds, so ``2h`` and ``7200`` are the same spec.
Seconds = Annotated[float, BeforeValidator(_duration), Field(gt=0, le=365 * 24 * 3600)]


def refuse_nul(texts: Iterable[str], what: str) -> None:
    """exec() refuses NUL in arguments and environment values, and PostgreSQL cannot store it."""
    if any("\x00" in text for text in texts):
        raise ValueError(f"{what} cannot contain NUL characters")


class SpecModel(BaseModel):
    """A spec's model: unknown fields refused, values frozen and never coerced."""

    # strict: "4" is not 4 and true is not 1; YAML already gives typed scalars.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ResourcesSpec(SpecModel):
    """What each worker holds: GPUs of one type (``any`` accepts every type; none unless
    ``gpus`` asks), CPUs, memory."""

    gpus: Annotated[int, Field(ge=0, le=64)] = 0
    cpus: Annotated[float, Field(ge=0, le=1024)] = 1.0
    memory_gb: Annotated[float, Field(ge=0, le=16384)] = 2.0
    gpu_type: Annotated[str, Field(min_length=1, max_length=63, pattern=_NAME)] = ANY_GPU_TYPE


class ParallelismSpec(SpecModel):
    """Degrees of data, tensor and pipeline parallelism; their product is the job's world size."""

    data: Annotated[int, Field(ge=1, le=1 << 20)] = 1
    tensor: Annotated[int, Field(ge=1, le=1024)] = 1
    pipeline: Annotated[int, Field(ge=1, le=1024)] = 1


class CommSpec(SpecModel):
    """Gradient compression for a DDP job: one of PyTorch's comm hooks, which the runtime
    registers on the job's ``DistributedDataParallel`` module (the job writes nothing for it).
    ``rank`` and ``start_iter`` are PowerSGD's matrix approximation rank and the iteration it
    starts compressing at (PyTorch's minimum is 2)."""

    hook: Literal["powersgd", "fp16", "bf16"]
    rank: Annotated[int, Field(ge=1, le=1024)] = 2
    start_iter: Annotated[int, Field(ge=2, le=1_000_000_000)] = 2


class ModelSpec(SpecModel):
    """Where a successful job's exported model is registered (see the model registry)."""

    name: Name
    # The tenant's model version this job starts from: its lineage's parent (checked at submit).
    parent: Annotated[str, Field(max_length=80, pattern=MODEL_REF)] | None = None
