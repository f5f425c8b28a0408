"""The user-facing job specification, parsed from YAML or JSON text, and its canonical form.

``JobSpec`` is a pydantic model: one schema serves job files, the CLI and the REST API's request
body (FastAPI derives the OpenAPI schema from it), and pydantic does no I/O, so core stays pure.
Parsing YAML here keeps line numbers, so every error names the field, the problem and the line.

A spec is what a user wrote (``priority: high``, optional fields left out); :meth:`JobSpec.to_job`
turns it into the scheduler's :class:`~aicluster.core.job.Job`. :meth:`JobSpec.canonical_json`
leaves out every field at its default, so a spec's hash does not change when a later version adds
an optional field, and ``workers: 1`` hashes like a spec that omits ``workers``.

``secrets:`` (beside ``env:``) are variables whose values are never shown back: a spec holds them
as :class:`~pydantic.SecretStr`, every dump of it (:meth:`JobSpec.canonical_dict`, the API's
views, the hash) has :data:`REDACTED` in their place, and only
:meth:`JobSpec.secret_values` gives them. In a spec parsed from a user they are the plain
values; the control plane seals them (``aicluster.runtime.secretbox``) before the store sees them,
so a spec read back from the store holds sealed tokens (:data:`SEALED_PREFIX`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from aicluster.core.bounded import BoundedLoader, json_shape_problem
from aicluster.core.configfile import ConfigError
from aicluster.core.job import Job, Parallelism, priority_of
from aicluster.core.resources import ANY_GPU_TYPE
from aicluster.core.topology import DomainLevel

__all__ = [
    "CODE_HASH",
    "MAX_SECRETS",
    "MAX_SECRET_BYTES",
    "MAX_SPEC_BYTES",
    "MAX_WORKERS",
    "REDACTED",
    "SEALED_PREFIX",
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
#: At most this many ``secrets:`` per job, each value at most this many bytes (UTF-8), and
#: :data:`_MAX_SECRETS_BYTES` in all.
MAX_SECRETS = 64
MAX_SECRET_BYTES = 4096
_MAX_SECRETS_BYTES = 64 * 1024
#: What every view of a spec shows in place of a secret's value.
REDACTED = "***"
#: How a sealed (encrypted) secret value begins; see ``aicluster.runtime.secretbox``.
SEALED_PREFIX = "aicsec1:"
#: A sealed value of MAX_SECRET_BYTES is about 6,000 characters (Fernet, base64).
_MAX_SEALED_CHARS = 8192
_MAX_ARGS_BYTES = 64 * 1024
_MAX_DEPTH = 32  # mappings and lists inside each other; a spec needs 3
_MAX_NODES = 10_000  # values, keys included; a spec with every field at its largest: ~1,600
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_ENV_KEY = r"^[A-Za-z_][A-Za-z0-9_]*$"
_MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
#: A shipped tree's SHA-256 (hex, lower case): the name of its archive in the code store.
CODE_HASH = r"^[0-9a-f]{64}$"

Name = Annotated[str, Field(min_length=1, max_length=63, pattern=_NAME)]
#: A secret's value: every dump of a spec shows REDACTED in its place (the API, the CLI, the hash).
Secret = Annotated[SecretStr, PlainSerializer(lambda _: REDACTED, return_type=str)]
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

    # A ValidationError's text shows no input (it could be a secret's value); errors() keeps it.
    model_config = ConfigDict(**_Model.model_config, hide_input_in_errors=True)

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
    # Variables whose values are never shown back (see the module's docstring).
    secrets: dict[str, Secret] = {}
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

    @field_validator("secrets", mode="before")
    @classmethod
    def _secrets_given(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        for key, item in value.items():
            if not isinstance(item, str | SecretStr):
                # Not converted as env: does: YAML reads 0123 as 83 and 1e3 as 1000.0.
                raise ValueError(f"{key}: write the value as a quoted string")
        return value

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        # The messages name variables, never values.
        if len(value) > MAX_SECRETS:
            raise ValueError(f"at most {MAX_SECRETS} secrets, got {len(value)}")
        total = 0
        for key, secret in value.items():
            if not re.match(_ENV_KEY, key) or len(key) > 256:
                raise ValueError(f"{key!r} is not a valid variable name")
            text = secret.get_secret_value()
            if "\x00" in text:
                raise ValueError(f"{key}: a secret cannot contain NUL characters")
            try:
                size = len(text.encode("utf-8"))
            except UnicodeEncodeError:
                raise ValueError(f"{key}: the value is not valid text (a lone surrogate)") from None
            if text.startswith(SEALED_PREFIX):  # as read back from the store
                if size > _MAX_SEALED_CHARS:
                    raise ValueError(f"{key}: a sealed value is longer than {_MAX_SEALED_CHARS}")
                continue
            if size > MAX_SECRET_BYTES:
                raise ValueError(f"{key}: a secret is larger than {MAX_SECRET_BYTES} bytes")
            total += size
        if total > _MAX_SECRETS_BYTES:
            raise ValueError(f"secrets are larger than {_MAX_SECRETS_BYTES // 1024} KiB in all")
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
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise _FieldError("secrets", f"{', '.join(both)}: given in env too")
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

    def secret_values(self) -> dict[str, str]:
        """The ``secrets:`` as held: plain values in a spec parsed from a user, sealed tokens in
        one read from the store. Nothing else in this class gives them."""
        return {key: secret.get_secret_value() for key, secret in self.secrets.items()}

    def with_secret_values(self, values: Mapping[str, str]) -> JobSpec:
        """This spec with its secrets' values replaced (sealing keeps the names)."""
        if set(values) != set(self.secrets):
            raise ValueError("the secrets' names cannot change")
        return self.model_copy(update={"secrets": {k: SecretStr(v) for k, v in values.items()}})

    def canonical_dict(self, *, reveal_secrets: bool = False) -> dict[str, Any]:
        """The spec as plain JSON data, fields at their defaults left out. Secrets' values are
        :data:`REDACTED` unless ``reveal_secrets`` (the CLI's request body, the store's row of
        sealed values)."""
        data = self.model_dump(mode="json", exclude_defaults=True)
        if reveal_secrets and self.secrets:
            data["secrets"] = self.secret_values()
        return data

    def canonical_json(self, *, reveal_secrets: bool = False) -> str:
        """Compact ASCII JSON with sorted keys: equal specs give equal text."""
        return json.dumps(
            self.canonical_dict(reveal_secrets=reveal_secrets),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=True,
        )

    @property
    def spec_hash(self) -> str:
        """SHA-256 (hex) of :meth:`canonical_json`; stable across releases that add fields.
        Secrets count by name only: a hash must not let anyone test guesses of a value."""
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
    """A job spec is invalid. ``problems`` lists every problem found; the message shows the
    first :data:`_SHOWN_PROBLEMS` (and how many more), the first as ``source:line: field:
    message``."""

    def __init__(self, source: str, problems: tuple[SpecProblem, ...]) -> None:
        self.problems = problems
        #: Whether the spec asks to run something else than its shipped code (the API: a 400).
        self.unsafe = any(problem.unsafe for problem in problems)
        first, rest = problems[0], problems[1:_SHOWN_PROBLEMS]
        lines = [str(first), *(_located(source, p) for p in rest)]
        if len(problems) > _SHOWN_PROBLEMS:  # 1,024 bad args: the answer stays small
            lines.append(f"{source}: and {len(problems) - _SHOWN_PROBLEMS} more problems")
        super().__init__(source, first.line, "\n".join(lines))


_SHOWN_PROBLEMS = 20


def _located(source: str, problem: SpecProblem) -> str:
    where = f"{source}:{problem.line}" if problem.line else source
    return f"{where}: {problem}"


class _Mapping(dict[str, Any]):
    """A YAML mapping that remembers its own line and the line of each key."""

    line: int = 0
    key_lines: dict[str, int]


class _LineLoader(BoundedLoader):
    """Records lines (see ``_construct_mapping``); refuses aliases (a spec never needs one, and
    they are how a few hundred bytes expand to millions of values), explicit tags (``!!int ''``
    broke PyYAML's constructors), and nesting deeper and more values than any spec needs
    (PyYAML composes recursively: a few hundred ``[`` would otherwise exhaust the stack)."""

    max_depth, max_nodes, what = _MAX_DEPTH, _MAX_NODES, "a job spec"
    allow_aliases = allow_tags = False


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
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:  # (lone surrogates too)
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
        data = dict(pairs)
        if len(data) < len(pairs):  # a set, not list.count: 40,000 keys fit in 256 KiB
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise JobSpecError(source, (SpecProblem(key, None, "is given twice"),))
                seen.add(key)
        return data

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
    shape = json_shape_problem(data, _MAX_DEPTH, _MAX_NODES)
    if shape is not None:
        raise JobSpecError(source, (SpecProblem("", None, f"not a job spec: {shape}"),))
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
        secret = bool(loc) and loc[0] == "secrets"  # a value the error must not echo
        if kind != "value_error" and not secret and not isinstance(got, Mapping | list):
            shown = repr(got)  # the answer to a 256 KiB value stays small
            message += f" (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
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
