"""A fake runtime for the control loop's logic tests: scripted gangs on the injected clock.

It stands at one boundary only, the runtime port (``aicluster.control.loop.ports``): the store, the
scheduler and the loop are the real ones. A gang follows its :class:`Script` as the clock moves:
it starts, steps at a rate (every rank reports each step), reports a checkpoint every K steps,
then exits with a code; or hangs at a step, or is lost with its node. A stop gives its ranks
SIGTERM: a gang that saves on SIGTERM reports a checkpoint at the step it reached, one that
ignores it is killed after the grace period. Nothing blocks and nothing runs in a thread, so a
test drives everything with ``clock.advance`` and ``loop.tick()`` (see :func:`fake_loop`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from aicluster.control.loop.loop import ControlLoop
from aicluster.control.settings import LoopSettings
from aicluster.core import JobState, ManualClock, Tenant, jobspec_from_mapping, make_cluster
from aicluster.runtime import (
    GangSpec,
    GangStatus,
    LogChunk,
    PlacementError,
    RankState,
    RankStatus,
    rank_layout,
)
from aicluster.runtime.gang.status import gang_message, gang_phase
from aicluster.runtime.joboutput import Rejects
from aicluster.runtime.sandbox.bwrap import SandboxConfig
from aicluster.scheduler import SchedulerConfig
from aicluster.store import JobRecord, Store
from aicluster.train.telemetry import StepRecord

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class Script:
    """What a gang does, in seconds of the injected clock from its launch."""

    steps: int | None = 10  # steps it runs, then exits with exit_code (None: never ends)
    step_s: float = 1.0
    start_s: float = 0.0  # from launch to the start of the first step
    checkpoint_every: int = 0  # a checkpoint every K steps (0: none)
    exit_code: int = 0
    hang_at: int | None = None  # makes no step after this one (its processes stay alive)
    saves_on_sigterm: bool = True  # reports a checkpoint when stopped (within its grace)
    ignores_sigterm: bool = False  # killed at the end of the grace period, saving nothing
    launch_error: str | None = None  # the launch raises PlacementError with this message
    #: Its ranks say at launch that they will step (train.init's ``start`` record); False: a
    #: plain script, which writes no telemetry but its steps (those the step-timing shim sees).
    declares: bool = True
    #: What a rank that exits non-zero wrote to stderr (its ``stderr_tail``; None: "exit N").
    stderr: str | None = None
    #: The ranks that exit with ``exit_code`` (None: all); the others exit 0 a second later.
    failing_ranks: frozenset[int] | None = None
    #: A rank's own compute time per step (``compute_time``; the others': step_s), a straggler.
    compute_s: Mapping[int, float] = field(default_factory=dict)

    @property
    def last_step(self) -> float:
        """The last step it will ever make (inf: none is last)."""
        ends = [s for s in (self.steps, self.hang_at) if s is not None]
        return min(ends) if ends else math.inf


class DeferredExecutor(Executor):
    """The launcher's pool for the logic tests: calls (Ray calls, for the fake) wait until
    :meth:`run_pending`, as calls that take a while do; with ``auto`` they run at once, in the
    caller's thread. :meth:`crash` models a leader that died with calls in flight: those, and
    every later one, never complete."""

    def __init__(self, auto: bool = False) -> None:
        self.auto, self.dead = auto, False
        self.pending: list[tuple[Future[Any], Callable[[], Any]]] = []

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        if self.dead:
            return future
        call = functools.partial(fn, *args, **kwargs)
        if self.auto:
            _complete(future, call)
        else:
            self.pending.append((future, call))
        return future

    def run_pending(self) -> None:
        """Run the calls waiting, and those they queue meanwhile, in order."""
        while self.pending and not self.dead:
            future, call = self.pending.pop(0)
            _complete(future, call)

    def crash(self) -> None:
        self.dead, self.pending = True, []


class InlineExecutor(DeferredExecutor):
    """Runs each call at once, in the caller's thread (the launcher's pool, made synchronous)."""

    def __init__(self) -> None:
        super().__init__(auto=True)


def _complete(future: Future[Any], call: Callable[[], Any]) -> None:
    try:
        future.set_result(call())
    except BaseException as error:
        future.set_exception(error)


@dataclass
class FakeGang:
    spec: GangSpec
    script: Script
    clock: ManualClock
    launched_at: float
    nodes: tuple[str, ...]
    stopped_at: float | None = None
    stop_grace_s: float = 0.0
    lost: set[int] = field(default_factory=set)  # ranks whose node was lost
    lost_at: float | None = None

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def attempt(self) -> int:
        return self.spec.attempt

    # -- what the script makes of the clock ---------------------------------------------------

    def _step_at(self, step: int) -> float:
        return self.launched_at + self.script.start_s + step * self.script.step_s

    def _steps_by(self, when: float) -> int:
        """Steps completed by ``when`` (not past the last, the stop or the loss)."""
        until = min(t for t in (when, self.stopped_at, self.lost_at) if t is not None)
        done = math.floor((until - self.launched_at - self.script.start_s) / self.script.step_s)
        return int(max(0, min(done, self.script.last_step)))

    def _exits_at(self) -> float | None:
        """When its processes exit on their own (None: never, or not before they are stopped)."""
        steps = self.script.steps
        if steps is None or (self.script.hang_at is not None and self.script.hang_at < steps):
            return None
        return self._step_at(steps)

    def _records(self, now: float) -> list[StepRecord]:
        """Every telemetry record its ranks wrote by ``now``, in time order."""
        ranks = range(len(self.nodes)) if self.script.declares else range(0)
        records = [StepRecord("start", rank, self.launched_at) for rank in ranks]
        every = self.script.checkpoint_every
        took = self.script.step_s
        for step in range(1, self._steps_by(now) + 1):
            at = self._step_at(step)
            for rank, node in enumerate(self.nodes):
                compute = {"compute_time": self.script.compute_s.get(rank, took)}
                made = StepRecord("step", rank, at, step=step, step_time=took, node=node)
                records.append(replace(made, metrics=compute))
            if every and step % every == 0:
                records.append(StepRecord("checkpoint", 0, at, step=step))
        stopped = self.stopped_at
        if stopped is not None and stopped <= now and self._saves_when_stopped():
            records.append(StepRecord("checkpoint", 0, stopped, step=self._steps_by(stopped)))
        return records

    def _saves_when_stopped(self) -> bool:
        ended = self._exits_at()
        before_end = ended is None or self.stopped_at is None or self.stopped_at < ended
        script = self.script
        return before_end and script.saves_on_sigterm and not script.ignores_sigterm

    # -- the port -----------------------------------------------------------------------------

    def ended(self) -> bool:
        ends = self._exits_at()
        return self.stopped_at is not None or (ends is not None and ends <= self.clock.now())

    def status(self, timeout_s: float = 10.0) -> GangStatus:
        now = self.clock.now()
        ends, stopped = self._exits_at(), self.stopped_at
        ranks = []
        for rank, node in enumerate(self.nodes):
            if rank in self.lost:
                ranks.append(RankStatus(rank, node, RankState.LOST, finished_at=self.lost_at))
            elif ends is not None and ends <= now and (stopped is None or ends <= stopped):
                code, at = self.script.exit_code, ends
                failing = self.script.failing_ranks
                if failing is not None and rank not in failing:
                    code, at = 0, ends + 1.0
                tail = self.script.stderr if self.script.stderr is not None else f"exit {code}"
                tail = tail if code else ""
                ranks.append(RankStatus(rank, node, RankState.EXITED, code, False, at, tail))
            elif stopped is not None:
                code = -9 if self.script.ignores_sigterm else -15
                ranks.append(RankStatus(rank, node, RankState.EXITED, code, True, stopped))
            else:
                ranks.append(RankStatus(rank, node, RankState.RUNNING))
        phase = gang_phase(ranks, stopped is not None)
        return GangStatus(
            self.job_id, self.attempt, phase, tuple(ranks), gang_message(phase, ranks)
        )

    def stop(self, grace_s: float = 10.0) -> GangStatus:
        if self.stopped_at is None:
            self.stopped_at, self.stop_grace_s = self.clock.now(), grace_s
        return self.status()

    def telemetry_cursor(self) -> FakeTelemetry:
        return FakeTelemetry(self)


class FakeTelemetry:
    def __init__(self, gang: FakeGang) -> None:
        self.gang, self.rejects, self._seen = gang, Rejects(), 0

    def poll(self) -> list[StepRecord]:
        records = self.gang._records(self.gang.clock.now())
        new, self._seen = records[self._seen :], len(records)
        return new


class FakeRuntime:
    """Gangs that follow their :class:`Script` (``scripts``, by job id; else ``default``)."""

    def __init__(self, clock: ManualClock, state_dir: str | Path, default: Script = Script()):
        self.clock, self._state_dir, self.default = clock, str(state_dir), default
        self.scripts: dict[str, Script] = {}  # by job id
        self.gangs: dict[tuple[str, int], FakeGang] = {}
        self.launches: list[GangSpec] = []

    @property
    def state_dir(self) -> str:
        return self._state_dir

    @property
    def sandbox(self) -> SandboxConfig | None:
        return None

    def launch(self, spec: GangSpec) -> FakeGang:
        key = (spec.job_id, spec.attempt)
        if key in self.gangs:  # idempotent per (job, attempt)
            return self.gangs[key]
        script = self.scripts.get(spec.job_id, self.default)
        if script.launch_error is not None:
            raise PlacementError(script.launch_error)
        racks = None
        slots = rank_layout(spec.placement, spec.workers, spec.gpus_per_worker, racks)
        gang = FakeGang(spec, script, self.clock, self.clock.now(), tuple(s.node for s in slots))
        self.gangs[key] = gang
        self.launches.append(spec)
        return gang

    def gang(self, job_id: str, attempt: int | None = None) -> FakeGang | None:
        if attempt is None:
            attempts = [a for (j, a) in self.gangs if j == job_id]
            attempt = max(attempts) if attempts else None
        return self.gangs.get((job_id, attempt)) if attempt is not None else None

    def live_gangs(self) -> list[FakeGang]:
        return [gang for gang in self.gangs.values() if gang.stopped_at is None]

    def warm_up(self, view: Any) -> int:
        return 0

    def release_disks(self, active: Callable[[str], bool]) -> list[str]:
        return []  # no per-job disks here

    def logs(self, job_id: str, rank: int = 0, **_: Any) -> LogChunk:
        return LogChunk("", 0)

    def telemetry(self, job_id: str, attempt: int | None = None) -> dict[int, list[StepRecord]]:
        gang = self.gang(job_id, attempt)
        if gang is None:
            from aicluster.runtime import GangError

            raise GangError(f"no run of job {job_id!r} (attempt {attempt})")
        by_rank: dict[int, list[StepRecord]] = {}
        for record in gang._records(self.clock.now()):
            by_rank.setdefault(record.rank, []).append(record)
        return by_rank

    def lose_node(self, node: str) -> None:
        """The node dies: every live gang with a rank there loses that rank now."""
        for gang in self.live_gangs():
            ranks = {rank for rank, name in enumerate(gang.nodes) if name == node}
            if ranks and not gang.ended():
                gang.lost |= ranks
                gang.lost_at = self.clock.now()


@contextmanager
def two_tenant_store(path: Path, clock: ManualClock) -> Iterator[Store]:
    """A store of tenants ``a`` and ``b`` (no quotas) on two nodes of 8 GPUs, on ``clock``."""
    opened = Store.open(path, clock=clock)
    for name in ("a", "b"):
        opened.create_tenant(Tenant(name), "test")
    opened.upsert_nodes(make_cluster(nodes=2, gpus_per_node=8).nodes)
    try:
        yield opened
    finally:
        opened.close()


@contextmanager
def fake_loop(
    store: Store,
    clock: ManualClock,
    state_dir: Path,
    config: SchedulerConfig | None = None,
    default: Script = Script(),
    *,
    runtime: FakeRuntime | None = None,
    executor: Executor | None = None,
    **settings: Any,
) -> Iterator[tuple[ControlLoop, FakeRuntime]]:
    """A real control loop over ``store`` (opened with ``clock``) with a :class:`FakeRuntime`
    (``runtime``: an earlier loop's, for a successor) on the same clock; the launcher's calls
    run inline unless ``executor`` says otherwise. ``settings``: LoopSettings' fields."""
    runtime = runtime or FakeRuntime(clock, state_dir, default)
    loop_settings = LoopSettings(scheduler=config or SchedulerConfig(), **settings)
    executor = executor or InlineExecutor()
    loop = ControlLoop(store, runtime, None, clock, loop_settings, executor=executor)
    try:
        yield loop, runtime
    finally:
        loop.launcher.shutdown()


# -- driving a loop over it -------------------------------------------------------------------

#: Simulated seconds between two ticks of :func:`run_until`.
TICK_S = 0.5


def submit(
    store: Store,
    name: str,
    *,
    gpus: int = 8,
    workers: int = 1,
    priority: str = "normal",
    max_restarts: int = 0,
    tenant: str = "a",
    **fields: Any,
) -> JobRecord:
    """Submit a job of the spec's ``fields`` (``restart_on``, ``hang_check``, ...)."""
    spec = jobspec_from_mapping(
        {
            "name": name,
            "entrypoint": "train.py",
            "code": "0" * 64,
            "workers": workers,
            "resources": {"gpus": gpus},
            "priority": priority,
            "max_restarts": max_restarts,
            **fields,
        }
    )
    record, _ = store.submit_job(tenant, spec, "tester")
    return record


def run_until(
    loop: ControlLoop, clock: ManualClock, done: Callable[[], bool], limit_s: float = 600
) -> float:
    """Tick every TICK_S of simulated time until ``done``; returns the simulated seconds."""
    began = clock.now()
    loop.tick()
    while not done():
        assert clock.now() - began < limit_s, "not reached in the simulated time allowed"
        clock.advance(TICK_S)
        loop.tick()
    return clock.now() - began


def state(store: Store, job: JobRecord) -> JobState:
    return store.get_job(None, job.id).state


def transitions(store: Store, job: JobRecord) -> list[str]:
    return [e.to_state for e in store.events(job.id) if e.to_state]
