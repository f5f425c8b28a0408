"""The rollout controller: a state machine over the store's ``rollouts`` table.

::

    start ──► warming (canary at 0%: its replicas start) ──ready──► step 0 (w0%) ──healthy──►
      step 1 ... ──healthy at the last step (100%)──► promoted   (traffic {to: 100})
      any step ──unhealthy (serve.canary.judge)──► rolled_back   (traffic {from: 100})
      manual: promote ──► promoted;  abort ──► aborted (traffic {from: 100})

Decisions are written to the store first (compare-and-set on the step, with an event carrying the
figures), then the deployment's traffic is set to what the rollout wants. Every tick re-applies
that traffic where it differs, so a crash between the two writes, or a failed traffic write, is
repaired by the next tick of whichever server leads (the rollout's state and ``step_started_at``
live in the store, so a new leader resumes the step where it was).

The controller runs as a leader task (``Serving.leader_tasks``); :func:`start_rollout`,
:func:`promote` and :func:`abort` are what the API calls.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from aicluster.serve.canary import MIN_REQUESTS, Thresholds, WindowStats, judge
from aicluster.store import Store
from aicluster.store.errors import Conflict, NotFound, StaleState
from aicluster.store.rollouts import WARMING, RolloutRecord

__all__ = [
    "RolloutController",
    "abort",
    "check_plan",
    "install",
    "promote",
    "start_rollout",
]

log = logging.getLogger(__name__)
ACTOR = "rollout-controller"
#: A canary whose replicas are not serving after this long is rolled back.
WARMUP_TIMEOUT_S = 120.0
#: Seconds between checks that finished rollouts' traffic was written.
RECONCILE_S = 30.0
#: Seconds after a takeover during which an inherited step's canary is not judged.
TAKEOVER_GRACE_S = 5.0
#: Manual promote/abort race the controller's step; this many tries settle it.
_TRIES = 3


class StatsSource(Protocol):
    """``serve.stats.ServingStats``: a version's requests, errors and p99 over a time window."""

    def window(self, tenant: str, name: str, version: int, since: float, now: float) -> Any: ...


#: (tenant, name, version) -> whether that version's replicas are up and serving.
Readiness = Callable[[str, str, int], bool]


def check_plan(
    steps: Sequence[int], interval_s: float, max_error_rate: float, max_p99_ms: float
) -> list[str]:
    """What is wrong with a rollout's plan, as sentences (empty when it is valid)."""
    problems = []
    if not steps or any(not 0 < s <= 100 for s in steps):
        problems.append("steps must be percentages in (0, 100]")
    elif any(b <= a for a, b in itertools.pairwise(steps)):
        problems.append("steps must be strictly increasing")
    elif steps[-1] != 100:
        problems.append("the last step must be 100")
    if not interval_s >= 1:
        problems.append("the interval must be at least 1 s")
    if not 0 <= max_error_rate <= 1:
        problems.append("the maximum error rate must be in [0, 1] (0.01 is 1%)")
    if not max_p99_ms > 0:
        problems.append("the maximum p99 latency must be positive")
    return problems


def _traffic(raw: Mapping[Any, Any]) -> dict[int, float]:
    return {int(version): float(weight) for version, weight in raw.items()}


def start_rollout(
    store: Store,
    tenant: str,
    name: str,
    *,
    version: int,
    steps: Sequence[int],
    interval_s: float,
    max_error_rate: float,
    max_p99_ms: float,
    actor: str,
) -> RolloutRecord:
    """Start rolling ``version`` out over the deployment's current 100% version.

    Raises ``ValueError`` for a bad plan, :class:`NotFound` for an unknown deployment or model
    version, :class:`Conflict` when the deployment is split between versions, already runs
    ``version``, or has a rollout in progress.
    """
    problems = check_plan(steps, interval_s, max_error_rate, max_p99_ms)
    if problems:
        raise ValueError("; ".join(problems))
    deployment = store.get_deployment(tenant, name)
    store.get_model_version(tenant, name, version)  # registered, or NotFound
    traffic = {v: w for v, w in _traffic(deployment.traffic).items() if w > 0}
    if len(traffic) != 1 or next(iter(traffic.values())) != 100:
        raise Conflict(f"model {name!r} is split between versions {sorted(traffic)}")
    (current,) = traffic
    if current == version:
        raise Conflict(f"model {name!r} already serves version {version}")
    record = store.create_rollout(
        tenant,
        name,
        from_version=current,
        to_version=version,
        steps=list(steps),
        interval_s=interval_s,
        max_error_rate=max_error_rate,
        max_p99_ms=max_p99_ms,
        actor=actor,
    )
    _apply(store, record, actor, f"rollout {record.id}: start version {version} at 0%")
    return record


def promote(store: Store, tenant: str, name: str, actor: str) -> RolloutRecord:
    """Jump the running rollout to 100% of the new version. Raises :class:`NotFound`."""
    return _finish_manually(store, tenant, name, "promoted", actor)


def abort(store: Store, tenant: str, name: str, actor: str) -> RolloutRecord:
    """Send all traffic back to the old version. Raises :class:`NotFound`."""
    return _finish_manually(store, tenant, name, "aborted", actor)


def _finish_manually(store: Store, tenant: str, name: str, state: str, actor: str) -> RolloutRecord:
    verb = "promoted" if state == "promoted" else "aborted"
    for _ in range(_TRIES):
        current = store.current_rollout(tenant, name)
        if current is None:
            raise NotFound(f"model {name!r} has no rollout in progress")
        try:
            done = store.finish_rollout(
                current, state, actor=actor, reason=f"{verb} by {actor} at {current.weight}%"
            )
        except StaleState:  # the controller moved a step meanwhile: look again
            continue
        for _ in range(_TRIES):  # the deployment may change under us (the deployer, a drain)
            with contextlib.suppress(StaleState):
                _apply(store, done, actor, f"rollout {done.id}: {verb} by {actor}")
                break
        return done  # a traffic write that kept losing is repaired by the controller
    raise Conflict(f"the rollout of {name!r} kept moving; try again")


def _apply(store: Store, record: RolloutRecord, actor: str, reason: str) -> bool:
    """Set the deployment's traffic to what ``record`` wants, unless it already is.

    Raises :class:`StaleState` instead when the rollout has moved on since ``record`` was read,
    when a newer rollout of the deployment runs, or when the deployment changes between this
    read and the write (``expected_version``): whoever moved it routes it, so a controller
    holding an old step never undoes a manual promote that landed meanwhile.
    """
    wanted = record.traffic()
    deployment = store.get_deployment(record.tenant, record.name)
    if _traffic(deployment.traffic) == wanted:
        return False
    if store.get_rollout(None, record.id) != record:
        raise StaleState(f"rollout {record.id} moved on")
    if record.state != "running" and store.current_rollout(record.tenant, record.name):
        raise StaleState(f"a newer rollout of {record.name!r} runs")
    store.set_traffic(
        record.tenant, record.name, wanted, actor, reason, expected_version=deployment.version
    )
    return True


class RolloutController:
    """Moves every running rollout along; call it about every second on the leader.

    Idempotent per tick: a step is judged from the canary's live stats since the step began
    (``ServingStats.window``), advanced or ended by compare-and-set, and the traffic follows.
    """

    def __init__(
        self,
        store: Store,
        stats: StatsSource,
        *,
        ready: Readiness | None = None,
        min_requests: int = MIN_REQUESTS,
        warmup_timeout_s: float = WARMUP_TIMEOUT_S,
        takeover_grace_s: float = TAKEOVER_GRACE_S,
    ) -> None:
        self.store, self.stats = store, stats
        self.ready = ready or (lambda tenant, name, version: True)
        self.min_requests, self.warmup_timeout_s = min_requests, warmup_timeout_s
        self.takeover_grace_s = takeover_grace_s
        self._unapplied: dict[int, RolloutRecord] = {}
        self._reconciled_at: float | None = None
        self._first_tick_at: float | None = None
        #: Per inherited rollout: when this controller first saw its canary answer (the handles
        #: are warm from then on).
        self._warm_at: dict[int, float] = {}

    def __call__(self, now: float) -> None:
        self.tick(now)

    def tick(self, now: float) -> None:
        """One pass over the running rollouts (errors are logged per rollout, never raised)."""
        if self._first_tick_at is None:
            self._first_tick_at = now
        if self._reconciled_at is None or now - self._reconciled_at >= RECONCILE_S:
            self._reconcile_finished()
            self._reconciled_at = now
        for record in list(self._unapplied.values()):
            self._guard(record, lambda r: self._reapply(r))
        for record in self.store.running_rollouts():
            self._guard(record, lambda r: self._advance(r, now))

    def _guard(self, record: RolloutRecord, action: Callable[[RolloutRecord], None]) -> None:
        try:
            action(record)
        except StaleState:
            pass  # moved by a manual promote/abort or another leader: next tick sees it
        except Exception as error:  # one bad rollout must not stop the others
            log.warning("rollout %s of %s/%s: %s", record.id, record.tenant, record.name, error)

    def _reconcile_finished(self) -> None:
        """A finished rollout whose deployment is still split between its two versions (the
        server died between the decision and the traffic write, or the write kept losing) gets
        its traffic: at the first tick of a leader, then every ``RECONCILE_S``."""
        for record in self.store.latest_rollouts():
            if record.state == "running":
                continue
            deployment = self._deployment(record)
            if deployment is None:
                continue
            traffic = _traffic(deployment.traffic)
            pair = {record.from_version, record.to_version}
            if set(traffic) <= pair and traffic != record.traffic():
                self._unapplied[record.id] = record

    def _deployment(self, record: RolloutRecord) -> Any:
        try:
            return self.store.get_deployment(record.tenant, record.name)
        except NotFound:
            return None

    def _reapply(self, record: RolloutRecord) -> None:
        """Write a finished rollout's traffic; kept for the next tick if the deployment changed
        under the write, dropped once written or once a newer rollout owns the deployment."""
        try:
            _apply(self.store, record, ACTOR, f"rollout {record.id}: {record.state}")
        except NotFound:
            pass  # a deleted deployment has no traffic to route
        except StaleState:
            if self.store.current_rollout(record.tenant, record.name) is None:
                return
        self._unapplied.pop(record.id, None)

    def _advance(self, record: RolloutRecord, now: float) -> None:
        deployment = self._deployment(record)
        if deployment is None:
            self._end(record, "aborted", "the deployment was deleted", {}, route=False)
            return
        others = set(_traffic(deployment.traffic)) - {record.from_version, record.to_version}
        if others:  # e.g. `aicluster serve NAME:V3` meanwhile: the newer decision wins
            reason = f"the deployment now also serves version {min(others)}"
            split = {"traffic": {str(v): w for v, w in deployment.traffic.items()}}
            self._end(record, "aborted", reason, split, route=False)
            return
        _apply(self.store, record, ACTOR, f"rollout {record.id}: step {record.step_index}")
        elapsed = now - record.step_started_at
        if record.step_index == WARMING:
            self._warm(record, elapsed)
            return
        since = self._judged_since(record, now)
        if since is None:
            return  # an inherited step whose canary has not answered this controller yet
        window = self.stats.window(record.tenant, record.name, record.to_version, since, now)
        thresholds = Thresholds(record.max_error_rate, record.max_p99_ms, self.min_requests)
        stats = WindowStats(window.requests, window.errors, window.p99_ms)
        verdict = judge(thresholds, stats, elapsed, record.interval_s)
        figures = {**verdict.figures, "weight": record.weight}
        if verdict.action == "rollback":
            self._end(record, "rolled_back", verdict.reason, figures)
        elif verdict.action == "promote_step":
            if record.step_index + 1 >= len(record.steps):
                self._end(record, "promoted", verdict.reason, figures)
            else:
                self._step(record, record.step_index + 1, verdict.reason, figures)

    def _judged_since(self, record: RolloutRecord, now: float) -> float | None:
        """Where a step's evidence starts: its start. A server that just took over (or
        restarted) has cold handles whose first calls fail or time out, for longer on a loaded
        machine; those failures are the control plane's, not the canary's, and must not roll a
        healthy version back. So a step begun before this controller's first tick is judged
        from the later of that tick plus ``takeover_grace_s`` and the canary's first answer to
        this controller; None (not judged yet) until that answer. A canary that never answers
        is judged from the grace's end once ``warmup_timeout_s`` passed, and rolled back."""
        first = self._first_tick_at
        assert first is not None
        if record.step_started_at >= first:
            return record.step_started_at  # a step this controller began: all of it counts
        grace_end = max(record.step_started_at, first + self.takeover_grace_s)
        warm_at = self._warm_at.get(record.id)
        if warm_at is None:
            seen = self.stats.window(record.tenant, record.name, record.to_version, first, now)
            if seen.requests > seen.errors:
                warm_at = self._warm_at[record.id] = now
            elif now - first > self.warmup_timeout_s:
                return grace_end
            else:
                return None
        return max(grace_end, warm_at)

    def _warm(self, record: RolloutRecord, elapsed: float) -> None:
        if self.ready(record.tenant, record.name, record.to_version):
            figures = {"warmup_s": round(elapsed, 3)}
            self._step(record, 0, f"version {record.to_version} is serving", figures)
        elif elapsed > self.warmup_timeout_s:
            reason = f"version {record.to_version} was not serving after {elapsed:.0f} s"
            self._end(record, "rolled_back", reason, {"warmup_s": round(elapsed, 3)})

    def _step(
        self, record: RolloutRecord, index: int, reason: str, figures: Mapping[str, Any]
    ) -> None:
        moved = self.store.advance_rollout(
            record, index, actor=ACTOR, figures=figures, reason=reason
        )
        log.info(
            "rollout %s of %s: step %d (%d%%): %s",
            record.id,
            record.name,
            index,
            moved.weight,
            reason,
        )
        _apply(self.store, moved, ACTOR, f"rollout {moved.id}: step to {moved.weight}%")

    def _end(
        self,
        record: RolloutRecord,
        state: str,
        reason: str,
        figures: Mapping[str, Any],
        *,
        route: bool = True,
    ) -> None:
        """End the rollout; with ``route``, send the traffic where the outcome wants it."""
        done = self.store.finish_rollout(record, state, actor=ACTOR, reason=reason, figures=figures)
        self._warm_at.pop(record.id, None)
        log.info("rollout %s of %s: %s: %s", record.id, record.name, state, reason)
        if route:
            self._unapplied[done.id] = done  # dropped once its traffic is written
            self._reapply(done)


def install(serving: Any, store: Store) -> RolloutController:
    """Run a rollout controller among ``serving``'s leader tasks (``aicluster.serve.Serving``);
    a canary step starts once every replica the deployment asks for is running."""

    def ready(tenant: str, name: str, version: int) -> bool:
        return bool(serving.is_healthy(store.get_deployment(tenant, name), version))

    controller = RolloutController(store, serving.stats, ready=ready)
    serving.leader_tasks.append(controller)
    return controller
