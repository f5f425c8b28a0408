"""The job spec itself: :class:`JobSpec`, its checks, canonical form and the scheduler's view
of it. See :mod:`aicluster.core.jobspec`."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from aicluster.core.job import Job, Parallelism, priority_of
from aicluster.core.jobspec.parts import (
    CODE_HASH,
    DATA_REF,
    ENV_KEY,
    MAX_ARGS_BYTES,
    MAX_ENV_BYTES,
    MAX_SEALED_CHARS,
    MAX_SECRET_BYTES,
    MAX_SECRETS,
    MAX_SECRETS_BYTES,
    MAX_WORKERS,
    MODULE,
    SEALED_PREFIX,
    CommSpec,
    ModelSpec,
    Name,
    ParallelismSpec,
    ResourcesSpec,
    Seconds,
    Secret,
    SpecModel,
    refuse_nul,
)
from aicluster.core.jobspec.problems import FieldError, JobSpecError, SpecProblem, check_entrypoint
from aicluster.core.topology import DomainLevel

__all__ = ["JobSpec"]


class JobSpec(SpecModel):
    """A job as a user submits it. Validation errors become :class:`JobSpecError` when parsed
    with :func:`parse_jobspec` or :func:`jobspec_from_mapping`."""

    # A ValidationError's text shows no input (it could be a secret's value); errors() keeps it.
    model_config = ConfigDict(**SpecModel.model_config, hide_input_in_errors=True)

    name: Name
    tenant: Name | None = None
    # A file inside the shipped tree (``python -u entrypoint``), or ``module`` (``python -m``).
    entrypoint: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    module: Annotated[str, Field(max_length=255, pattern=MODULE)] | None = None
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
    comm: CommSpec | None = None  # gradient compression (DDP)
    priority: str | int = "normal"
    preemptible: bool = True
    checkpoint_interval: Seconds | None = None
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    # Which failures restart the job (aicluster.scheduler.restarts): ``infrastructure`` also
    # restarts its own error, but not the same error twice in a row; ``any``: every failure.
    restart_on: Literal["infrastructure", "any"] = "infrastructure"
    # When a rank counts as hung (aicluster.control.loop.health): ``auto`` once it stepped or
    # said it would; ``from_start``: every rank must step within the startup grace; ``off``.
    hang_check: Literal["auto", "from_start", "off"] = "auto"
    max_domain: Literal["node", "rack", "pod", "cluster"] = "cluster"
    duration_estimate: Seconds | None = None
    env: Annotated[
        dict[str, Annotated[str, Field(max_length=MAX_ENV_BYTES)]], Field(max_length=256)
    ] = {}
    # Variables whose values are never shown back (see the module's docstring).
    secrets: dict[str, Secret] = {}
    model: ModelSpec | None = None  # registers the export under this name (default: the job's)
    # Datasets the job reads (``NAME:VERSION`` or ``NAME:latest``); the server stores the spec
    # with each resolved to its version, so a job never re-resolves ``latest``.
    data: Annotated[list[Annotated[str, Field(pattern=DATA_REF)]], Field(max_length=32)] = []

    @field_validator("data")
    @classmethod
    def _data_once(cls, value: list[str]) -> list[str]:
        names = [ref.split(":")[0] for ref in value]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)}: named more than once")
        return value

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
            if not re.match(ENV_KEY, key) or len(key) > 256:
                raise ValueError(f"{key!r} is not a valid variable name")
        if sum(len(k) + len(v) for k, v in value.items()) > MAX_ENV_BYTES:
            raise ValueError(f"env is larger than {MAX_ENV_BYTES // 1024} KiB")
        refuse_nul(value.values(), "values")
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
            if not re.match(ENV_KEY, key) or len(key) > 256:
                raise ValueError(f"{key!r} is not a valid variable name")
            text = secret.get_secret_value()
            if "\x00" in text:
                raise ValueError(f"{key}: a secret cannot contain NUL characters")
            try:
                size = len(text.encode("utf-8"))
            except UnicodeEncodeError:
                raise ValueError(f"{key}: the value is not valid text (a lone surrogate)") from None
            if text.startswith(SEALED_PREFIX):  # as read back from the store
                if size > MAX_SEALED_CHARS:
                    raise ValueError(f"{key}: a sealed value is longer than {MAX_SEALED_CHARS}")
                continue
            if size > MAX_SECRET_BYTES:
                raise ValueError(f"{key}: a secret is larger than {MAX_SECRET_BYTES} bytes")
            total += size
        if total > MAX_SECRETS_BYTES:
            raise ValueError(f"secrets are larger than {MAX_SECRETS_BYTES // 1024} KiB in all")
        return value

    @field_validator("hang_check", mode="before")
    @classmethod
    def _hang_check(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads an unquoted off as false

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: str | None) -> str | None:
        if value is not None:
            check_entrypoint(value)
        return value

    @field_validator("args")
    @classmethod
    def _args_size(cls, value: list[str]) -> list[str]:
        if sum(len(arg) for arg in value) > MAX_ARGS_BYTES:
            raise ValueError(f"args are longer than {MAX_ARGS_BYTES // 1024} KiB in all")
        refuse_nul(value, "arguments")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if (self.entrypoint is None) == (self.module is None):
            raise FieldError(
                "entrypoint", "give either entrypoint (a file of the job's code) or module"
            )
        if self.min_workers is not None and self.min_workers > self.workers:
            raise FieldError(
                "min_workers", f"is {self.min_workers}, more than workers ({self.workers})"
            )
        if self.parallelism is not None:
            p, world = self.parallelism, self.world_size
            if p.data * p.tensor * p.pipeline != world:
                raise FieldError(
                    "parallelism",
                    f"data × tensor × pipeline = {p.data * p.tensor * p.pipeline}, but the job "
                    f"has a world of {world} ({self._world_unit()})",
                )
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise FieldError("secrets", f"{', '.join(both)}: given in env too")
        try:
            self.to_job("validate", 0.0, tenant=self.tenant or "validate")
        except ValueError as error:  # the scheduler's own rules (tensor groups vs GPUs per worker)
            text = str(error).removeprefix("job validate: ")
            raise FieldError("parallelism", text) from None
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

    def data_refs(self) -> list[tuple[str, int | None]]:
        """``data:`` as ``(name, version)``; None for ``latest``."""
        pairs = [ref.split(":") for ref in self.data]
        return [(name, None if version == "latest" else int(version)) for name, version in pairs]

    def with_data(self, resolved: Mapping[str, int]) -> JobSpec:
        """This spec with each dataset at the version ``resolved`` names (name -> version)."""
        refs = [f"{name}:{resolved[name]}" for name, _ in self.data_refs()]
        return self.model_copy(update={"data": refs})

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
