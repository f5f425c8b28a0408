"""The user-facing job specification, parsed from YAML or JSON text, and its canonical form.

``JobSpec`` is a pydantic model: one schema serves job files, the CLI and the REST API's request
body (FastAPI derives the OpenAPI schema from it), and pydantic does no I/O, so core stays pure.
Parsing YAML here keeps line numbers, so every error names the field, the problem and the line.

A spec is what a user wrote (``priority: high``, optional fields left out); :meth:`JobSpec.to_job`
turns it into the scheduler's :class:`~aicluster.core.job.Job`. :meth:`JobSpec.canonical_json`
leaves out every field at its default, so a spec's hash does not change when a later version adds
an optional field, and ``workers: 1`` hashes like a spec that omits ``workers``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from aicluster.core.configfile import ConfigError
from aicluster.core.job import Job, Parallelism, priority_of
from aicluster.core.resources import ANY_GPU_TYPE
from aicluster.core.topology import DomainLevel

__all__ = [
    "CODE_HASH",
    "MAX_SPEC_BYTES",
    "MAX_WORKERS",
    "JobSpec",
    "JobSpecError",
    "ModelSpec",
    "ParallelismSpec",
    "ResourcesSpec",
    "SpecProblem",
    "UnsafeEntrypoint",
    "check_entrypoint",
    "jobspec_from_mapping",
    "parse_jobspec",
]

MAX_WORKERS = 4096
MAX_SPEC_BYTES = 256 * 1024
_MAX_ENV_BYTES = 64 * 1024
_MAX_ARGS_BYTES = 64 * 1024
_MAX_DEPTH = 32  # mappings and lists inside each other; a spec needs 3
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_ENV_KEY = r"^[A-Za-z_][A-Za-z0-9_]*$"
_MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
#: A shipped tree's SHA-256 (hex, lower case): the name of its archive in the code store.
CODE_HASH = r"^[0-9a-f]{64}$"

Name = Annotated[str, Field(min_length=1, max_length=63, pattern=_NAME)]
Seconds = Annotated[float, Field(gt=0, le=365 * 24 * 3600)]


def _refuse_nul(texts: Iterable[str], what: str) -> None:
    """exec() refuses NUL in arguments and environment values, and PostgreSQL cannot store it."""
    if any("\x00" in text for text in texts):
        raise ValueError(f"{what} cannot contain NUL characters")


class _FieldError(ValueError):
    """A cross-field check that failed, naming the field to blame (for the line number)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class _Model(BaseModel):
    # strict: "4" is not 4 and true is not 1; YAML already gives typed scalars.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ResourcesSpec(_Model):
    """What each worker holds: GPUs of one type (``any`` accepts every type), CPUs, memory."""

    gpus: Annotated[int, Field(ge=0, le=64)] = 1
    cpus: Annotated[float, Field(ge=0, le=1024)] = 1.0
    memory_gb: Annotated[float, Field(ge=0, le=16384)] = 2.0
    gpu_type: Annotated[str, Field(min_length=1, max_length=63, pattern=_NAME)] = ANY_GPU_TYPE


class ParallelismSpec(_Model):
    """Degrees of data, tensor and pipeline parallelism; their product is the job's world size."""

    data: Annotated[int, Field(ge=1, le=1 << 20)] = 1
    tensor: Annotated[int, Field(ge=1, le=1024)] = 1
    pipeline: Annotated[int, Field(ge=1, le=1024)] = 1


class ModelSpec(_Model):
    """Where a successful job's exported model is registered (see the model registry)."""

    name: Name


class JobSpec(_Model):
    """A job as a user submits it. Validation errors become :class:`JobSpecError` when parsed
    with :func:`parse_jobspec` or :func:`jobspec_from_mapping`."""

    name: Name
    tenant: Name | None = None
    # A file inside the shipped tree (``python -u entrypoint``), or ``module`` (``python -m``).
    entrypoint: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    module: Annotated[str, Field(max_length=255, pattern=_MODULE)] | None = None
    # The SHA-256 of the job's shipped code (``aicluster submit`` uploads it and fills this in).
    code: Annotated[str, Field(pattern=CODE_HASH)] | None = None
    # The folder ``aicluster submit`` ships, relative to the spec's own folder (default: that
    # folder). Read on the submitting machine only: the CLI replaces it with ``code``.
    workdir: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    # Constrained strings: pydantic then also refuses lone surrogates (text nothing can encode).
    args: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=1024)] = []
    workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)] = 1
    min_workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)] | None = None
    resources: ResourcesSpec = ResourcesSpec()
    parallelism: ParallelismSpec | None = None
    priority: str | int = "normal"
    preemptible: bool = True
    checkpoint_interval: Seconds | None = None
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    max_domain: Literal["node", "rack", "pod", "cluster"] = "cluster"
    duration_estimate: Seconds | None = None
    env: Annotated[
        dict[str, Annotated[str, Field(max_length=_MAX_ENV_BYTES)]], Field(max_length=256)
    ] = {}
    model: ModelSpec | None = None  # registers the export under this name (default: the job's)

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, str):
            value = value.strip().lower()
        if isinstance(value, str | int) and not isinstance(value, bool):
            priority_of(value)  # ValueError names the accepted classes
            if isinstance(value, int) and not 0 <= value <= 10_000:
                raise ValueError(f"an integer priority must be between 0 and 10000, got {value}")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        env: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(item, bool) or item is None:
                raise ValueError(f"{key}: write the value as a quoted string, got {item!r}")
            env[key] = str(item) if isinstance(item, int | float) else item
        return env

    @field_validator("env")
    @classmethod
    def _env_size(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.match(_ENV_KEY, key) or len(key) > 256:
                raise ValueError(f"{key!r} is not a valid variable name")
        if sum(len(k) + len(v) for k, v in value.items()) > _MAX_ENV_BYTES:
            raise ValueError(f"env is larger than {_MAX_ENV_BYTES // 1024} KiB")
        _refuse_nul(value.values(), "values")
        return value

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: str | None) -> str | None:
        if value is not None:
            check_entrypoint(value)
        return value

    @field_validator("args")
    @classmethod
    def _args_size(cls, value: list[str]) -> list[str]:
        if sum(len(arg) for arg in value) > _MAX_ARGS_BYTES:
            raise ValueError(f"args are longer than {_MAX_ARGS_BYTES // 1024} KiB in all")
        _refuse_nul(value, "arguments")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if (self.entrypoint is None) == (self.module is None):
            raise _FieldError(
                "entrypoint", "give either entrypoint (a file of the job's code) or module"
            )
        if self.min_workers is not None and self.min_workers > self.workers:
            raise _FieldError(
                "min_workers", f"is {self.min_workers}, more than workers ({self.workers})"
            )
        if self.parallelism is not None:
            p, world = self.parallelism, self.world_size
            if p.data * p.tensor * p.pipeline != world:
                raise _FieldError(
                    "parallelism",
                    f"data × tensor × pipeline = {p.data * p.tensor * p.pipeline}, but the job "
                    f"has a world of {world} ({self._world_unit()})",
                )
        try:
            self.to_job("validate", 0.0, tenant=self.tenant or "validate")
        except ValueError as error:  # the scheduler's own rules (tensor groups vs GPUs per worker)
            text = str(error).removeprefix("job validate: ")
            raise _FieldError("parallelism", text) from None
        return self

    def _world_unit(self) -> str:
        if self.resources.gpus:
            return f"{self.workers} workers × {self.resources.gpus} GPUs"
        return f"{self.workers} CPU workers"

    @property
    def world_size(self) -> int:
        """Ranks of the job: its GPUs, or its workers when it uses no GPU."""
        return self.workers * self.resources.gpus if self.resources.gpus else self.workers

    @property
    def model_name(self) -> str:
        """The registered model's name: ``model.name``, else the job's name."""
        return self.model.name if self.model is not None else self.name

    @property
    def priority_value(self) -> int:
        return priority_of(self.priority)

    def with_tenant(self, tenant: str) -> JobSpec:
        """This spec with ``tenant`` filled in. Raises :class:`JobSpecError` on a mismatch."""
        if self.tenant not in (None, tenant):
            problem = SpecProblem(
                "tenant", None, f"the spec names tenant {self.tenant!r}, not {tenant!r}"
            )
            raise JobSpecError("<jobspec>", (problem,))
        return self if self.tenant == tenant else self.model_copy(update={"tenant": tenant})

    def canonical_dict(self) -> dict[str, Any]:
        """The spec as plain JSON data, fields at their defaults left out."""
        return self.model_dump(mode="json", exclude_defaults=True)

    def canonical_json(self) -> str:
        """Compact ASCII JSON with sorted keys: equal specs give equal text."""
        return json.dumps(
            self.canonical_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True
        )

    @property
    def spec_hash(self) -> str:
        """SHA-256 (hex) of :meth:`canonical_json`; stable across releases that add fields."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def to_job(self, job_id: str, submit_time: float, tenant: str | None = None) -> Job:
        """The scheduler's view of this spec. Raises ``ValueError`` when no tenant is known."""
        owner = tenant or self.tenant
        if owner is None:
            raise ValueError(f"job {job_id}: the spec names no tenant")
        p = self.parallelism
        parallelism = (
            Parallelism(p.data, p.tensor, p.pipeline) if p else Parallelism(data=self.world_size)
        )
        return Job(
            id=job_id,
            tenant=owner,
            workers=self.workers,
            gpus_per_worker=self.resources.gpus,
            gpu_type=self.resources.gpu_type,
            cpus_per_worker=self.resources.cpus,
            memory_gb_per_worker=self.resources.memory_gb,
            priority=self.priority_value,
            submit_time=submit_time,
            duration_estimate=self.duration_estimate,
            checkpoint_interval=self.checkpoint_interval,
            parallelism=parallelism,
            max_domain=DomainLevel.parse(self.max_domain),
            preemptible=self.preemptible,
            min_workers=self.min_workers,
        )


class UnsafeEntrypoint(ValueError):
    """An entrypoint that would run something else than a file of the job's shipped code."""


def check_entrypoint(path: str) -> None:
    """Refuse an entrypoint that is not a plain relative path inside the job's code: it runs as
    ``python -u PATH`` in the job's working directory, so ``-c``, an interpreter flag, an absolute
    path or ``..`` would run something else than the shipped file."""
    if any(char in path for char in "\x00\n\r\\"):
        raise UnsafeEntrypoint("must be a plain path (no NUL, line breaks or backslashes)")
    if path.startswith("-"):
        raise UnsafeEntrypoint(
            f"{path!r} looks like an interpreter flag: give a file of the job's code "
            "(or module: for python -m)"
        )
    if path.startswith("/") or path.startswith("~"):
        raise UnsafeEntrypoint(
            f"{path!r} is absolute: give a path inside the job's code (its workdir)"
        )
    parts = path.split("/")
    if ".." in parts:
        raise UnsafeEntrypoint(f"{path!r} leaves the job's code ('..'): give a path inside it")
    if all(part in ("", ".") for part in parts):
        raise UnsafeEntrypoint(f"{path!r} names no file")


class SpecProblem:
    """One thing wrong with a spec: the field path (``resources.gpus``), its line, the message."""

    __slots__ = ("field", "line", "message", "unsafe")

    def __init__(self, field: str, line: int | None, message: str, unsafe: bool = False) -> None:
        self.field, self.line, self.message = field, line, message
        self.unsafe = unsafe  # an entrypoint that would run something else than the job's code

    def __repr__(self) -> str:
        return f"SpecProblem({self.field!r}, {self.line!r}, {self.message!r})"

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class JobSpecError(ConfigError):
    """A job spec is invalid. ``problems`` lists every problem found; the message shows them all,
    the first one as ``source:line: field: message``."""

    def __init__(self, source: str, problems: tuple[SpecProblem, ...]) -> None:
        self.problems = problems
        #: Whether the spec asks to run something else than its shipped code (the API: a 400).
        self.unsafe = any(problem.unsafe for problem in problems)
        first, rest = problems[0], problems[1:]
        message = "\n".join([str(first), *(_located(source, p) for p in rest)])
        super().__init__(source, first.line, message)


def _located(source: str, problem: SpecProblem) -> str:
    where = f"{source}:{problem.line}" if problem.line else source
    return f"{where}: {problem}"


class _Mapping(dict[str, Any]):
    """A YAML mapping that remembers its own line and the line of each key."""

    line: int = 0
    key_lines: dict[str, int]


class _LineLoader(yaml.SafeLoader):
    """Records lines (see ``_construct_mapping``) and refuses nesting deeper than any spec needs:
    PyYAML composes recursively, so a few hundred ``[`` would otherwise exhaust the stack."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > _MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                problem = f"nested deeper than {_MAX_DEPTH} levels"
                raise yaml.composer.ComposerError(None, None, problem, mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> _Mapping:
    mapping = _Mapping()
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if str(key) in mapping:
            line = key_node.start_mark.line + 1
            problem = SpecProblem(str(key), line, "is given twice")
            raise _DuplicateKey(problem)
        mapping[str(key)] = loader.construct_object(value_node, deep=True)
        mapping.key_lines[str(key)] = key_node.start_mark.line + 1
    return mapping


class _DuplicateKey(Exception):
    def __init__(self, problem: SpecProblem) -> None:
        self.problem = problem


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_jobspec(text: str, source: str = "<jobspec>") -> JobSpec:
    """Parse a job spec from YAML or JSON text (an invalid JSON spec is read again as YAML, so
    its problems have lines too).

    Raises :class:`JobSpecError` (a :class:`ConfigError`) naming the source, line, field and
    problem for malformed text and for every invalid field.
    """
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise JobSpecError(source, (SpecProblem("", None, "the spec is larger than 256 KiB"),))
    if not text.lstrip().startswith("{"):
        return jobspec_from_mapping(_load_yaml(text, source), source)
    data = _load_json(text, source)
    try:
        return jobspec_from_mapping(data, source)
    except JobSpecError:
        # Only now learn each key's line: the pure-Python YAML pass cost more than the rest of
        # an API submission together.
        return jobspec_from_mapping(_json_lines(text, data), source)


def _load_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_LineLoader)  # a SafeLoader subclass
    except _DuplicateKey as duplicate:
        raise JobSpecError(source, (duplicate.problem,)) from None
    except yaml.MarkedYAMLError as error:
        line = error.problem_mark.line + 1 if error.problem_mark else None
        problem = SpecProblem("", line, f"not valid YAML: {error.problem}")
        raise JobSpecError(source, (problem,)) from None
    except (yaml.YAMLError, ValueError) as error:  # ValueError: an integer of 5,000 digits
        raise JobSpecError(source, (SpecProblem("", None, f"not valid YAML: {error}"),)) from None


def _load_json(text: str, source: str) -> Any:
    """Strict JSON (duplicate keys refused)."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        for key in keys:
            if keys.count(key) > 1:
                raise JobSpecError(source, (SpecProblem(key, None, "is given twice"),))
        return dict(pairs)

    try:
        data = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as error:
        problem = SpecProblem("", error.lineno, f"not valid JSON: {error.msg}")
        raise JobSpecError(source, (problem,)) from None
    except JobSpecError:
        raise
    except RecursionError:
        problem = SpecProblem("", None, "not valid JSON: nested too deeply")
        raise JobSpecError(source, (problem,)) from None
    except ValueError as error:  # an integer of 5,000 digits
        problem = SpecProblem("", None, f"not valid JSON: {error}")
        raise JobSpecError(source, (problem,)) from None
    return data


def _json_lines(text: str, data: Any) -> Any:
    """``data`` as read by the line-recording YAML loader (JSON is nearly a subset of YAML)."""
    try:
        with_lines = yaml.load(text, Loader=_LineLoader)
    except (yaml.YAMLError, _DuplicateKey, ValueError):
        return data
    return with_lines if with_lines == data else data


def jobspec_from_mapping(data: Any, source: str = "<jobspec>") -> JobSpec:
    """Validate already-decoded data (a JSON request body, a parsed file) into a spec.

    Raises :class:`JobSpecError` listing every problem; lines are known for YAML from
    :func:`parse_jobspec`.
    """
    if not isinstance(data, Mapping):
        problem = SpecProblem("", 1, "expected a mapping of fields at the top level")
        raise JobSpecError(source, (problem,))
    try:
        return JobSpec.model_validate(dict(data))
    except ValidationError as error:
        problems = tuple(_problem(data, detail) for detail in error.errors(include_url=False))
        raise JobSpecError(source, problems) from None


def _problem(data: Mapping[str, Any], detail: ErrorDetails) -> SpecProblem:
    loc = tuple(detail["loc"])
    cause = (detail.get("ctx") or {}).get("error")
    if isinstance(cause, _FieldError):
        return SpecProblem(cause.field, _line_of(data, (cause.field,)), str(cause))
    field = ".".join(str(part) for part in loc)
    if isinstance(cause, UnsafeEntrypoint):
        return SpecProblem(field, _line_of(data, loc), str(cause), unsafe=True)
    kind, got = detail["type"], detail.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_fields(loc[:-1])
        message = f"unknown field (expected one of {', '.join(allowed)})"
    elif kind == "missing":
        return SpecProblem(field, _line_of(data, loc[:-1]), "is required")
    else:
        message = detail["msg"].removeprefix("Value error, ")
        message = message.replace("Input should", "should").replace("String should", "should")
        if kind != "value_error" and not isinstance(got, Mapping | list):
            message += f" (got {got!r})"
    parent = _at(data, loc)
    return SpecProblem(field, _line_of(data, loc) or getattr(parent, "line", None), message)


def _allowed_fields(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = JobSpec
    nested: dict[str, type[BaseModel]] = {
        "resources": ResourcesSpec,
        "parallelism": ParallelismSpec,
    }
    if loc and str(loc[0]) in nested:
        model = nested[str(loc[0])]
    return sorted(model.model_fields)


def _at(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        in_list = isinstance(data, list) and isinstance(part, int) and part < len(data)
        if not (in_list or (isinstance(data, Mapping) and part in data)):
            break
        data = data[part]
    return data


def _line_of(data: Any, loc: tuple[Any, ...]) -> int | None:
    """The line of the deepest key of ``loc`` found in YAML-loaded ``data`` (None for dicts)."""
    line: int | None = getattr(data, "line", None) or None
    for part in loc:
        if isinstance(data, Mapping):
            key_line = getattr(data, "key_lines", {}).get(str(part))
            if key_line is None:
                break
            line, data = key_line, data[str(part)]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            break
    return line
