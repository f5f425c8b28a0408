"""A pipeline's spec: the deployment it keeps fresh, the training job it submits, the triggers
that fire it and the canary its result goes through.

``pipeline.yaml``::

    name: retrain-digits
    deployment: digits            # a served model of the tenant (its deployment's name)
    job: {...}                    # a job spec; its model is registered as the deployment's model
    triggers:
      drift: {threshold: 0.2, sustained_s: 60}
      new_data: [digits]          # a new version of a dataset the job reads
      schedule_s: 86400           # at most this long between runs
    canary: {steps: [10, 50, 100], interval_s: 30, max_error_rate: 0.01, max_p99_ms: 500}
    cooldown_s: 300               # after a run ends, no drift or schedule run before this
"""

from __future__ import annotations

import itertools
from typing import Annotated

from pydantic import Field, model_validator

from aicluster.core.jobspec import JobSpec
from aicluster.core.jobspec.parts import Name, Seconds, SpecModel

__all__ = ["CanarySpec", "DriftTrigger", "PipelineSpec", "Triggers"]

DatasetName = Annotated[str, Field(max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


class DriftTrigger(SpecModel):
    """Fires once the served version's drift score has stayed at or over ``threshold`` for
    ``sustained_s`` seconds."""

    threshold: Annotated[float, Field(gt=0, le=1)] = 0.2
    sustained_s: Annotated[float, Field(ge=0, le=7 * 24 * 3600)] = 60.0


class Triggers(SpecModel):
    drift: DriftTrigger | None = None
    new_data: Annotated[list[DatasetName], Field(max_length=32)] = []
    schedule_s: Seconds | None = None

    @model_validator(mode="after")
    def _some(self) -> Triggers:
        if self.drift is None and not self.new_data and self.schedule_s is None:
            raise ValueError("name at least one trigger: drift, new_data or schedule_s")
        return self

    def names(self) -> list[str]:
        """Each trigger in words (what the API and the dashboard show)."""
        found = []
        if self.drift is not None:
            found.append(f"drift >= {self.drift.threshold:g} for {self.drift.sustained_s:g} s")
        found += [f"new version of {name}" for name in self.new_data]
        if self.schedule_s is not None:
            found.append(f"every {self.schedule_s:g} s")
        return found


class CanarySpec(SpecModel):
    """The canary rollout of a retrained version (as ``aicluster rollout`` takes it)."""

    steps: Annotated[
        list[Annotated[int, Field(gt=0, le=100)]], Field(min_length=1, max_length=20)
    ] = [10, 50, 100]
    interval_s: Annotated[float, Field(ge=1, le=24 * 3600)] = 30.0
    max_error_rate: Annotated[float, Field(ge=0, le=1)] = 0.01
    max_p99_ms: Annotated[float, Field(gt=0, le=3_600_000)] = 500.0

    @model_validator(mode="after")
    def _plan(self) -> CanarySpec:
        if any(b <= a for a, b in itertools.pairwise(self.steps)) or self.steps[-1] != 100:
            raise ValueError("canary steps must increase strictly and end at 100")
        return self


class PipelineSpec(SpecModel):
    name: Name
    tenant: Name | None = None
    deployment: Name
    job: JobSpec
    triggers: Triggers
    canary: CanarySpec = CanarySpec()
    cooldown_s: Annotated[float, Field(ge=0, le=30 * 24 * 3600)] = 300.0

    @model_validator(mode="after")
    def _consistent(self) -> PipelineSpec:
        if self.job.model_name != self.deployment:
            raise ValueError(
                f"the job registers model {self.job.model_name!r}, not the deployment's "
                f"{self.deployment!r}: set the job's model.name (or name) to {self.deployment}"
            )
        if self.job.secrets:
            raise ValueError("a pipeline's job cannot hold secrets (its spec is kept as given)")
        if self.job.tenant not in (None, self.tenant) and self.tenant is not None:
            raise ValueError(f"the job names tenant {self.job.tenant!r}, not {self.tenant!r}")
        read = {name for name, _ in self.job.data_refs()}
        unread = sorted(set(self.triggers.new_data) - read)
        if unread:
            raise ValueError(f"new_data: the job does not read {', '.join(unread)} (data:)")
        return self
