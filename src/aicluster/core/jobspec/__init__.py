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
values; the control plane seals them (``aicluster.runtime.sandbox.secretbox``) before the store sees
them, so a spec read back from the store holds sealed tokens (:data:`SEALED_PREFIX`).

Changes to the spec (also in ``docs/cli.md``, "Job specs"):

- ``resources.gpus`` defaults to 0: a spec that does not ask for GPUs holds none (it held one
  before). Specs already stored that relied on the implicit GPU keep it (store migration 0016
  writes ``gpus: 1`` into them); ``examples/jobs`` and the tests' specs name their GPUs. Traces
  are unaffected: the simulator builds its jobs from the trace's GPU counts, not from specs.
- Durations (``duration_estimate``, ``checkpoint_interval``) take units (``20s``, ``90m``,
  ``2h``; :func:`aicluster.core.durations.parse_duration`, which the CLI's flags share) and
  are stored as seconds; a plain number is still seconds.
"""

from aicluster.core.jobspec.parse import jobspec_from_mapping, parse_jobspec
from aicluster.core.jobspec.parts import (
    CODE_HASH,
    DATA_REF,
    MAX_SECRET_BYTES,
    MAX_SECRETS,
    MAX_SPEC_BYTES,
    MAX_WORKERS,
    REDACTED,
    SEALED_PREFIX,
    CommSpec,
    ModelSpec,
    ParallelismSpec,
    ResourcesSpec,
)
from aicluster.core.jobspec.problems import (
    JobSpecError,
    SpecProblem,
    UnsafeEntrypoint,
    check_entrypoint,
)
from aicluster.core.jobspec.spec import JobSpec

__all__ = [
    "CODE_HASH",
    "DATA_REF",
    "MAX_SECRETS",
    "MAX_SECRET_BYTES",
    "MAX_SPEC_BYTES",
    "MAX_WORKERS",
    "REDACTED",
    "SEALED_PREFIX",
    "CommSpec",
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
