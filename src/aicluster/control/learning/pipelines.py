"""The continuous-learning driver: fires pipelines and moves their runs along, on the leader.

A leader task of :class:`aicluster.serve.Serving` (beside the rollout controller, in the same
thread, run only while this server holds the lease). Every ``every_s`` it looks at each
pipeline: a run in progress is followed (its job, then its canary); otherwise the pure evaluator
(:mod:`aicluster.core.pipelines.triggers`) decides from the served version's drift score and the
watched datasets' newest versions whether to fire. Firing stores the run first (one transaction
that refuses a second run), then submits the job as any job of the tenant (its quota, its
queue) with the run's idempotency key, so a leader that dies in between submits it once. The
job reads the newest versions of its datasets (``latest`` resolved now) and names the served
version as its model's parent. The control loop registers what it exports; the driver then
starts a canary with the pipeline's plan, and the rollout controller promotes or rolls it back.
A job that fails or registers nothing ends the run as ``failed``, and serving is not touched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from aicluster.core import JobSpec, JobState
from aicluster.core.pipelines import Memory, Observation, PipelineSpec, evaluate
from aicluster.serve.rollout import start_rollout
from aicluster.store import NotFound, StaleState, Store, StoreError
from aicluster.store.pipelines import PipelineRecord, PipelineRunRecord

__all__ = ["ACTOR", "PipelineDriver", "install"]

log = logging.getLogger(__name__)
ACTOR = "pipeline"
#: (tenant, model, version) -> drift score, for versions with enough samples.
Scores = Callable[[], Mapping[tuple[str, str, int], float]]


class PipelineDriver:
    def __init__(
        self,
        store: Store,
        scores: Scores,
        *,
        confirm: Callable[[], bool] = lambda: True,
        every_s: float = 1.0,
    ) -> None:
        self.store, self.scores, self.confirm, self.every_s = store, scores, confirm, every_s
        self._last: float | None = None

    def __call__(self, now: float) -> None:
        if self._last is not None and now - self._last < self.every_s:
            return
        self._last = now
        self.tick(now)

    def tick(self, now: float) -> None:
        """One look at every pipeline (one pipeline's fault is logged, never raised)."""
        scores = self.scores()
        for pipeline in self.store.list_pipelines(None):
            try:
                self._look(pipeline, scores, now)
            except StaleState:
                pass  # paused, or moved by another leader: the next look sees it
            except Exception as error:
                log.warning("pipeline %s/%s: %s", pipeline.tenant, pipeline.name, error)

    def _look(
        self,
        pipeline: PipelineRecord,
        scores: Mapping[tuple[str, str, int], float],
        now: float,
    ) -> None:
        spec = PipelineSpec.model_validate(pipeline.spec)
        latest = self.store.pipeline_runs(pipeline.id, limit=1)
        if latest and latest[0].active:
            self._follow(pipeline, spec, latest[0])
            return  # the run's end updates the memory: evaluate from the next look
        memory = Memory.from_json(pipeline.memory)
        seen = Observation(
            now=now,
            drift_score=self._score(pipeline.tenant, spec.deployment, scores),
            newest=self._newest(pipeline.tenant, spec.triggers.new_data),
            paused=pipeline.paused,
        )
        decision = evaluate(spec.triggers, spec.cooldown_s, memory, seen)
        if decision.fire and self.confirm():
            run = self.store.start_pipeline_run(
                pipeline, decision.reasons, decision.memory.to_json(), ACTOR
            )
            log.info("pipeline %s/%s fired: %s", pipeline.tenant, pipeline.name, decision.reasons)
            self._submit(pipeline, spec, run)
        elif decision.memory != memory:
            self.store.save_pipeline_memory(pipeline.id, decision.memory.to_json())

    def _score(
        self, tenant: str, name: str, scores: Mapping[tuple[str, str, int], float]
    ) -> float | None:
        """The drift score of the version taking most of the deployment's traffic."""
        try:
            deployment = self.store.get_deployment(tenant, name)
        except NotFound:
            return None
        if not deployment.traffic:
            return None
        served = max(deployment.traffic, key=lambda v: deployment.traffic[v])
        return scores.get((tenant, name, int(served)))

    def _newest(self, tenant: str, names: list[str]) -> dict[str, int]:
        found = {}
        for name in names:
            try:
                found[name] = self.store.get_dataset_version(tenant, name).version
            except NotFound:
                continue
        return found

    # -- a run ------------------------------------------------------------------------------

    def _follow(self, pipeline: PipelineRecord, spec: PipelineSpec, run: PipelineRunRecord) -> None:
        if run.state == "starting":
            self._submit(pipeline, spec, run)
        elif run.state == "training":
            self._trained(spec, run)
        elif run.state == "rolling_out":
            self._rolled(run)

    def _submit(self, pipeline: PipelineRecord, spec: PipelineSpec, run: PipelineRunRecord) -> None:
        """Submit the run's job (idempotent per run). A spec that cannot be submitted now (a
        dataset gone, a tenant removed) fails the run with the reason."""
        if not self.confirm():
            return
        try:
            job = self._job_spec(pipeline.tenant, spec)
            record, _ = self.store.submit_job(
                pipeline.tenant, job, f"{ACTOR}/{pipeline.name}", f"pipeline-run-{run.id}"
            )
        except (NotFound, ValueError, StoreError) as error:
            self.store.move_pipeline_run(run, "failed", ACTOR, detail=f"not submitted: {error}")
            return
        self.store.move_pipeline_run(run, "training", ACTOR, job_id=record.id)

    def _job_spec(self, tenant: str, spec: PipelineSpec) -> JobSpec:
        """The template with the newest version of each dataset and the served version as its
        model's parent."""
        job = spec.job.with_tenant(tenant)
        resolved = {
            name: self.store.get_dataset_version(tenant, name).version
            for name, _ in job.data_refs()
        }
        if resolved:
            job = job.with_data(resolved)
        parent = self._served(tenant, spec.deployment)
        if parent is not None:
            model = {"name": spec.deployment, "parent": parent}
            if job.model is not None:
                model = {**job.model.model_dump(exclude_defaults=True), **model}
            job = JobSpec.model_validate({**job.canonical_dict(), "model": model})
        return job

    def _served(self, tenant: str, name: str) -> str | None:
        try:
            traffic = self.store.get_deployment(tenant, name).traffic
        except NotFound:
            return None
        return f"{name}:{max(traffic, key=lambda v: traffic[v])}" if traffic else None

    def _trained(self, spec: PipelineSpec, run: PipelineRunRecord) -> None:
        assert run.job_id is not None
        job = self.store.get_job(run.tenant, run.job_id)
        if not job.state.terminal:
            return
        if job.state is not JobState.SUCCEEDED:
            why = f"job {job.id} {job.state.value}: {job.exit_message or 'no message'}"
            self.store.move_pipeline_run(run, "failed", ACTOR, detail=why[:1000])
            return
        version = self.store.model_version_of_job(run.tenant, spec.deployment, job.id)
        if version is None:
            why = f"job {job.id} registered no model {spec.deployment}"
            self.store.move_pipeline_run(run, "failed", ACTOR, detail=why)
            return
        if not self.confirm():
            return
        try:
            canary = spec.canary
            rollout = start_rollout(
                self.store,
                run.tenant,
                spec.deployment,
                version=version.version,
                steps=canary.steps,
                interval_s=canary.interval_s,
                max_error_rate=canary.max_error_rate,
                max_p99_ms=canary.max_p99_ms,
                actor=ACTOR,
            )
        except (NotFound, ValueError, StoreError) as error:  # Conflict: a rollout of a person's
            why = f"{version.ref} registered; no canary: {error}"
            self.store.move_pipeline_run(
                run, "failed", ACTOR, model_version=version.version, detail=why[:1000]
            )
            return
        self.store.move_pipeline_run(
            run, "rolling_out", ACTOR, model_version=version.version, rollout_id=rollout.id
        )

    def _rolled(self, run: PipelineRunRecord) -> None:
        assert run.rollout_id is not None
        rollout = self.store.get_rollout(run.tenant, run.rollout_id)
        if rollout.state == "running":
            return
        state = "promoted" if rollout.state == "promoted" else "rolled_back"
        detail = f"rollout {rollout.id} {rollout.state}: {rollout.reason or ''}"
        self.store.move_pipeline_run(run, state, ACTOR, detail=detail[:1000])


def install(serving: Any, store: Store, drift: Any) -> PipelineDriver:
    """Run a pipeline driver among ``serving``'s leader tasks (``aicluster.serve.Serving``),
    reading ``drift``'s scores (``aicluster.serve.drift.DriftMonitor``; none: no drift)."""

    def scores() -> Mapping[tuple[str, str, int], float]:
        return drift.scores() if drift is not None else {}

    def confirm() -> bool:
        return bool(serving.deployer.confirm())

    driver = PipelineDriver(store, scores, confirm=confirm)
    serving.leader_tasks.append(driver)
    return driver
