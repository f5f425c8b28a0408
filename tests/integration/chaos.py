"""A chaos run: one 4-worker DDP job under the control loop on the embedded cluster, with a
random worker process SIGKILLed every ``every`` steps and, once, a whole Ray node killed.

Used by ``tests/integration/test_chaos.py`` (checks) and ``bench/recovery.py`` (figures).
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shipping import EXAMPLES, ship

from aicluster.control.loop.health import HealthConfig
from aicluster.control.loop.loop import ControlLoop
from aicluster.control.settings import LoopSettings
from aicluster.control.views.goodput import job_goodput
from aicluster.core import DomainLevel, JobState, Placement, Slot, Tenant, jobspec_from_mapping
from aicluster.runtime import EmbeddedCluster, GangError, GangSpec, Runtime, discover
from aicluster.scheduler import SchedulerConfig
from aicluster.store import Store
from aicluster.store.base import WallClock

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Failure:
    kind: str  # "process" or "node"
    at: float
    attempt: int
    last_step: int
    resumed_step: int | None = None
    first_step_at: float | None = None
    resumed_attempt: int | None = None
    phases: dict[str, float] = field(default_factory=dict)  # see PHASES
    warm_ranks: int = 0  # ranks of the resumed attempt forked from a warm process

    @property
    def recovery_s(self) -> float | None:
        return None if self.first_step_at is None else self.first_step_at - self.at

    @property
    def lost_steps(self) -> int | None:
        return None if self.resumed_step is None else self.last_step - (self.resumed_step - 1)


@dataclass
class ChaosResult:
    state: str
    failures: list[Failure]
    final_loss: float | None
    reference_losses: list[float] = field(default_factory=list)
    goodput: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def median_recovery_s(self) -> float | None:
        times = [f.recovery_s for f in self.failures if f.recovery_s is not None]
        return statistics.median(times) if times else None


def _args(steps: int, step_sleep: float, checkpoint_every: int, seed: int) -> list[str]:
    return [
        "--steps",
        str(steps),
        "--step-sleep",
        str(step_sleep),
        "--seed",
        str(seed),
        "--checkpoint-every",
        str(checkpoint_every),
        "--deterministic",
    ]


def _rank_records(runtime: Runtime, job_id: str, attempt: int) -> dict[int, list[Any]]:
    try:
        return runtime.telemetry(job_id, attempt)
    except GangError:  # an attempt not launched yet has no telemetry
        return {}


def _progress(runtime: Runtime, job_id: str, attempt: int) -> tuple[int, float | None]:
    steps = [r for r in _rank_records(runtime, job_id, attempt).get(0, []) if r.kind == "step"]
    if not steps:
        return 0, None
    return steps[-1].step or 0, steps[0].time


def _first_step(runtime: Runtime, job_id: str, attempt: int) -> tuple[int, float] | None:
    steps = [r for r in _rank_records(runtime, job_id, attempt).get(0, []) if r.kind == "step"]
    return (steps[0].step or 0, steps[0].time) if steps else None


def run_chaos(
    cluster: EmbeddedCluster,
    runtime: Runtime,
    state_dir: Path,
    *,
    steps: int = 320,
    step_sleep: float = 0.25,
    checkpoint_every: int = 10,
    every: int = 50,
    process_kills: int = 5,
    seed: int = 1,
    timeout_s: float = 1200,
) -> ChaosResult:
    """Run the job under chaos; returns what happened (the caller asserts or prints)."""
    store = Store.open(state_dir)
    store.create_tenant(Tenant("chaos"), "test")
    loop = ControlLoop(
        store,
        runtime,
        discover,
        WallClock(),
        LoopSettings(
            SchedulerConfig(queue="fifo"),
            interval_s=0.5,
            stop_grace_s=5,
            health=HealthConfig(hang_floor_s=30),
            backoff_s=(1.0, 30.0),
        ),
    )
    spec = jobspec_from_mapping(
        {
            "name": "chaos-mlp",
            "entrypoint": "ddp_mlp.py",
            "code": ship(runtime.state_dir, "chaos", EXAMPLES),
            "workers": 4,
            "max_restarts": 10,
            "args": _args(steps, step_sleep, checkpoint_every, seed),
            # Half a node's 8 CPUs each (a GPU, one rank): two workers a node, on two nodes.
            "resources": {"gpus": 1, "cpus": 4, "memory_gb": 1},
            "checkpoint_interval": checkpoint_every * step_sleep,
        }
    )
    job, _ = store.submit_job("chaos", spec, "chaos")
    rng = random.Random(seed)
    plan = sorted(rng.sample(range(process_kills + 1), 1))  # which failure kills a node
    failures: list[Failure] = []
    removed: Any = None
    missed: dict[int, str] = {}  # attempts struck at a rank whose process had already ended
    started = time.monotonic()
    loop.start()
    try:
        while True:
            record = store.get_job(None, job.id)
            if record.state.terminal:
                break
            assert time.monotonic() - started < timeout_s, "the chaos run did not finish"
            attempt = record.attempt
            step, _ = _progress(runtime, job.id, attempt)
            for failure in failures:
                if failure.resumed_step is None and attempt > failure.attempt:
                    first = _first_step(runtime, job.id, attempt)
                    if first is not None:
                        failure.resumed_step, failure.first_step_at = first
                        failure.resumed_attempt = attempt
            if (
                removed is not None
                and record.state is JobState.RUNNING
                and attempt > failures[-1].attempt
            ):
                cluster.add_node(removed)  # the failed node is repaired
                removed = None
            due = len(failures) < process_kills + 1 and step >= every * (len(failures) + 1)
            if due and record.state is JobState.RUNNING and attempt not in missed:
                kind = "node" if len(failures) in plan else "process"
                failure = Failure(kind, time.time(), attempt, step)
                try:
                    removed = _strike(kind, cluster, runtime, job.id, attempt, rng) or removed
                except RankGone as gone:  # it ended on its own: this attempt fails over anyway
                    missed[attempt] = str(gone)  # the next strike waits for the next attempt
                    assert len(missed) <= 3, missed
                else:
                    failures.append(failure)
            time.sleep(0.2)
    finally:
        loop.stop()
    if removed is not None:
        cluster.add_node(removed)
    final = store.get_job(None, job.id)
    records = _rank_records(runtime, job.id, final.attempt).get(0, [])
    losses = [r.loss for r in records if r.kind == "step" and r.loss is not None]
    events = store.events(job.id)
    for failure in failures:
        failure.phases = recovery_phases(runtime, events, job.id, failure)
    result = ChaosResult(
        state=final.state.value,
        failures=failures,
        final_loss=losses[-1] if losses else None,
        goodput=job_goodput(runtime, job.id, final.attempt).to_dict(),
        wall_s=time.monotonic() - started,
    )
    store.close()
    return result


#: The milestones of a recovery, in order; a phase is named by the milestone that ends it.
PHASES = (
    ("exited", "the killed rank's exit is recorded (its actor's wait, or the stop of a lost one)"),
    ("detected", "the control loop sees the failed gang: RESTARTING"),
    ("requeued", "backoff over: PENDING"),
    ("admitted", "a scheduling cycle places it: STARTING"),
    ("launch", "the launcher's call begins (gang.json of the new attempt)"),
    ("first_spawn", "placement group and actors up: the first rank process starts"),
    ("last_spawn", "the last rank process starts"),
    ("imported", "interpreter, torch and the script's imports: every rank calls train.init"),
    ("rendezvous", "init_process_group done on every rank (start records)"),
    ("loaded", "checkpoint loaded (rank 0's resume record)"),
    ("first_step", "the first step completes (rank 0)"),
)


def recovery_phases(
    runtime: Runtime, events: list[Any], job_id: str, failure: Failure
) -> dict[str, float]:
    """Seconds spent in each phase (see :data:`PHASES`) from the failure to the next step,
    read from the store's events and the attempts' run directories."""
    after = failure.resumed_attempt
    if after is None or failure.first_step_at is None:
        return {}
    stamps: dict[str, float | None] = {}
    old = runtime.gang(job_id, failure.attempt)
    if old is not None:
        exits = [old.run.exit_record(rank) for rank in range(old.workers)]
        ended = [e["finished_at"] for e in exits if e and not e.get("stopped")]
        stamps["exited"] = min(ended) if ended else None

    def first_event(state: str, since: float) -> float | None:
        return next((e.at for e in events if e.to_state == state and e.at >= since), None)

    stamps["detected"] = first_event("RESTARTING", failure.at)
    stamps["requeued"] = first_event("PENDING", stamps["detected"] or failure.at)
    starting = [e.at for e in events if e.to_state == "STARTING" and e.at >= failure.at]
    new = runtime.gang(job_id, after)
    records = runtime.telemetry(job_id, after) if new is not None else {}
    starts = [r for rs in records.values() for r in rs if r.kind == "start"]
    spawned = [r.metrics["spawned_at"] for r in starts if "spawned_at" in r.metrics]
    failure.warm_ranks = sum(1 for r in starts if r.metrics.get("warm"))
    launch = new.run.spec_file.stat().st_mtime if new is not None else None
    stamps["admitted"] = max((t for t in starting if launch is None or t <= launch), default=None)
    stamps["launch"] = launch
    stamps["first_spawn"] = min(spawned, default=None)
    stamps["last_spawn"] = max(spawned, default=None)
    stamps["imported"] = max((r.metrics.get("init_at", 0.0) for r in starts), default=None)
    stamps["rendezvous"] = max((r.time for r in starts), default=None)
    resumes = [r.time for r in records.get(0, []) if r.kind == "resume"]
    stamps["loaded"] = min(resumes, default=None)
    stamps["first_step"] = failure.first_step_at
    phases, previous = {}, failure.at
    for name, _ in PHASES:
        stamp = stamps.get(name)
        if stamp is None:
            continue
        phases[name] = stamp - previous
        previous = stamp
    return phases


def _strike(
    kind: str,
    cluster: EmbeddedCluster,
    runtime: Runtime,
    job_id: str,
    attempt: int,
    rng: random.Random,
) -> Any:
    """Kill a random rank's process, or the node of a random rank (not the head node)."""
    records = _rank_records(runtime, job_id, attempt)
    ranks = sorted(records)
    if kind == "process":
        rank = rng.choice(ranks)
        start = next(r for r in records[rank] if r.kind == "start")
        log = runtime.gang(job_id, attempt).run.log_file(rank)  # type: ignore[union-attr]
        os.kill(host_pid(int(start.metrics["pid"]), log), signal.SIGKILL)
        return None
    nodes = sorted({r.node for rs in records.values() for r in rs if r.node} - {"node-0"})
    name = rng.choice(nodes)
    node = next(n for n in cluster.topology.nodes if n.name == name)
    cluster.remove_node(name, graceful=False)
    return node


class RankGone(AssertionError):
    """No process of the rank is left to kill: it ended (its gang failed on its own, say a
    collective timed out on a loaded machine) between its attempt's start and the strike."""


def host_pid(reported: int, log: Path) -> int:
    """The host pid of the rank process that reports pid ``reported`` (its own view: one of its
    sandbox's PID namespace, where ranks are sandboxed) and writes its stdout to ``log``."""
    writers = []  # (host pid, its pids in each namespace, argv[0]): for the error
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or os.readlink(entry / "fd" / "1") != str(log):
                continue
            status = (entry / "status").read_text()
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid"))
        if nspid[-1] == str(reported) and not argv0.endswith(b"bwrap"):
            return int(entry.name)
        writers.append((entry.name, nspid, argv0))
    raise RankGone(f"no process of pid {reported} writes {log}; its writers: {writers}")


def reference_losses(
    runtime: Runtime, steps: int, seeds: list[int], state_dir: Path
) -> list[float]:
    """Final losses of failure-free runs (no sleeping: the loss path does not depend on it).
    The runs are independent gangs (2 GPUs of node-2 and 2 of node-3 each): all launched at
    once, so that their start-ups overlap, then each awaited."""
    handles = []
    for seed in seeds:
        job_id = f"reference-{seed}-{int(time.time())}"
        slots = tuple(Slot(n, 1) for n in ("node-2", "node-2", "node-3", "node-3"))
        spec = GangSpec(
            job_id=job_id,
            entrypoint="ddp_mlp.py",
            working_dir=str(EXAMPLES),
            workers=4,
            gpus_per_worker=1,
            cpus_per_worker=0.1,
            placement=Placement(slots, DomainLevel.RACK, "rack-1"),
            args=(*_args(steps, 0.0, 0, seed), "--checkpoint-dir", str(state_dir / job_id)),
        )
        handles.append(runtime.launch(spec))
    losses = []
    for handle in handles:
        status = handle.wait(timeout_s=600)
        handle.stop(0)
        assert status.phase.value == "SUCCEEDED", status.message
        steps_done = [r for r in handle.telemetry()[0] if r.kind == "step" and r.loss is not None]
        losses.append(float(steps_done[-1].loss))
    return losses
