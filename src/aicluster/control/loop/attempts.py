"""One attempt of a job as :class:`~aicluster.control.loop.lifecycle.GangLifecycle` starts it: the
gang to launch for it (or, for a service job, none), whether it has ended, and how it failed
(whose failure it was, for the restart rule: :mod:`aicluster.scheduler.restarts`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aicluster.control.loop.ports import GangRuntime
from aicluster.control.settings import ACTOR
from aicluster.core import Job, JobSpec, JobState
from aicluster.runtime import GangSpec, GangStatus, RankState, RankStatus, RunDir
from aicluster.runtime.gang.datacache import read_data_stats
from aicluster.scheduler.restarts import FailedAttempt
from aicluster.store import JobRecord, Store, placement_from_json
from aicluster.train import data as train_data
from aicluster.train import env as train_env

__all__ = [
    "attempt_ended",
    "data_inputs",
    "failed_attempt",
    "gang_spec",
    "record_data",
    "spec_env",
    "start_service",
    "stopper",
]


def spec_env(spec: JobSpec) -> dict[str, str]:
    """What the spec tells the ranks besides its ``env``: the tensor and pipeline degrees
    (``train.mesh()`` gives data parallelism the ranks left, so an elastic job that runs short
    of workers still gets a mesh) and the gradient compression the step shim registers."""
    made: dict[str, str] = {}
    if spec.parallelism is not None:
        p = spec.parallelism
        made[train_env.PARALLELISM] = f"tensor={p.tensor},pipeline={p.pipeline}"
    if spec.comm is not None:
        made[train_env.COMM_HOOK] = spec.comm.hook
        made[train_env.COMM_RANK] = str(spec.comm.rank)
        made[train_env.COMM_START_ITER] = str(spec.comm.start_iter)
    return made


def gang_spec(record: JobRecord, job: Job, store: Store, runtime: GangRuntime) -> GangSpec:
    """The gang of the job's current attempt at ``job``'s size (an elastic job may run short
    of its workers): its placement, code, environment, sandbox user and sealed secrets."""
    spec = record.spec
    env = {
        **spec.env,
        **spec_env(spec),
        "AICLUSTER_JOB_ID": record.id,
        "AICLUSTER_TENANT": record.tenant,
    }
    if job.workers != spec.workers:
        env["AICLUSTER_REQUESTED_WORKERS"] = str(spec.workers)
    env.pop(train_data.INPUTS, None)  # only the control plane names the datasets to prepare
    if spec.data:
        env[train_data.INPUTS] = data_inputs(store, record)
    user, disk_gb = None, None
    if runtime.sandbox is not None:
        uid = store.tenant_uid(record.tenant, runtime.sandbox.uid_first, runtime.sandbox.uid_last)
        user, disk_gb = (uid, uid), runtime.sandbox.job_disk_gb
    assert record.placement is not None
    return GangSpec.for_job(
        job,
        placement_from_json(record.placement),
        spec.entrypoint,
        args=spec.args,
        env=env,
        attempt=record.attempt,
        module=spec.module,
        code=spec.code,
        user=user,
        disk_gb=disk_gb,
        secrets=spec.secret_values(),  # sealed: the rank's actor opens them
    )


def data_inputs(store: Store, record: JobRecord) -> str:
    """The dataset versions the job reads (resolved at submit), with their manifests' hashes,
    as the JSON the ranks' nodes prepare them from."""
    inputs = []
    for name, version in record.spec.data_refs():
        found = store.get_dataset_version(record.tenant, name, version)
        inputs.append({"name": name, "version": found.version, "manifest": found.manifest_sha256})
    return json.dumps(inputs)


def record_data(store: Store, runtime: GangRuntime | None, record: JobRecord) -> None:
    """An ended attempt's data figures (cache hits, shards and bytes fetched, seconds waited),
    as one ``job.data`` event that ``/metrics`` sums per tenant."""
    if runtime is None or not record.spec.data:
        return
    run = RunDir(runtime.state_dir, record.id, record.attempt)
    total = read_data_stats(run.path)["total"]
    if total["cache_hits"] or total["shards_fetched"] or total["wait_seconds"]:
        store.record_event(record.id, "job.data", ACTOR, total)


def record_run(store: Store, runtime: GangRuntime | None, record: JobRecord) -> None:
    """An ended attempt's run as the runtime measured it (its ranks' first process start to
    their last exit, from their exit records), as one ``job.ran`` event: usage counts it
    instead of the store's RUNNING transitions (store/usage.py)."""
    if runtime is None:
        return
    run = RunDir(runtime.state_dir, record.id, record.attempt)
    # At most the spec's ranks (an elastic attempt may have fewer): the run directory is
    # the job's to write in, so its file names are not trusted for a count.
    exits = [run.exit_record(rank) for rank in range(record.spec.world_size)]
    starts = [e["started_at"] for e in exits if e is not None and e.get("started_at")]
    ends = [e["finished_at"] for e in exits if e is not None and e.get("finished_at")]
    if starts and ends and max(ends) > min(starts):
        began, ended = min(starts), max(ends)
        details = {"attempt": record.attempt, "started_at": began, "finished_at": ended}
        store.record_event(record.id, "job.ran", ACTOR, details | {"seconds": ended - began})


def attempt_ended(runtime: GangRuntime | None, record: JobRecord) -> bool:
    """Whether the job's current attempt was stopped or one of its rank processes exited
    (then there is nothing left to launch, only an end to settle)."""
    handle = runtime.gang(record.id, record.attempt) if runtime else None
    return handle is not None and handle.ended()


def stopper(
    runtime: GangRuntime | None, job_id: str, attempt: int, grace_s: float
) -> Callable[[], Any]:
    """A call that stops the attempt's gang (``grace_s`` to checkpoint); it looks the gang up
    when it runs, after any launch queued before it has landed."""

    def stop() -> Any:
        handle = runtime.gang(job_id, attempt) if runtime is not None else None
        return handle.stop(grace_s) if handle is not None else None

    return stop


def start_service(store: Store, record: JobRecord) -> JobRecord:
    """A service job (a model deployment's replica) has no gang: once admitted it is RUNNING
    (the record returned), and the serving leader runs one Serve replica on its node for it
    (see ``aicluster.serve.deployer``). Stopping it (preemption, cancel, a drain) goes the usual
    way, and its stop call finds no gang: the deployer drops the replica once the job is no
    longer RUNNING, and Ray frees its GPUs for whatever the scheduler placed there."""
    if record.state is not JobState.STARTING:
        return record
    return store.transition(
        record.id,
        JobState.RUNNING,
        ACTOR,
        expected_from=JobState.STARTING,
        reason="service replica admitted: the serving leader runs it",
    )


def failed_attempt(status: GangStatus | None) -> FailedAttempt:
    """How an attempt whose gang ended ``status`` failed: the infrastructure's when its gang
    vanished, a rank was lost (its node or actor died), the launcher could not start a rank (no
    exit code), a rank was SIGKILLed from outside (not by the launcher for its own limits: the
    kernel's OOM killer for the node, an operator, a chaos test) or nothing failed (stopped
    behind the loop's back); else the job's own, its first failed rank's exit code and last line
    of stderr."""
    ranks = status.failed_ranks if status is not None else ()
    if not ranks or any(_not_its_own(r) for r in ranks):
        codes = [r.exit_code for r in ranks if r.exit_code is not None]
        return FailedAttempt(True, codes[0] if codes else None)
    return FailedAttempt(False, ranks[0].exit_code, ranks[0].last_line)


#: A SIGKILL as the process's exit (-9), or as a shell's or bubblewrap's (128 + 9).
_SIGKILLED = (-9, 137)


def _not_its_own(rank: RankStatus) -> bool:
    """A failed rank whose end was not its code's doing: lost, never started, or SIGKILLed by
    someone other than the launcher (which names its reason: ``exceeded memory_gb=N``)."""
    lost = rank.state is RankState.LOST or rank.exit_code is None
    return lost or (rank.exit_code in _SIGKILLED and not rank.reason)
