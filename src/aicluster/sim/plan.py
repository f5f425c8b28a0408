"""The capacity planner: the smallest cluster, grown from a template, whose replay of a trace
meets every SLO (``aicluster plan``, docs/simulator.md).

Each SLO is assumed monotone in the cluster's size (waits, JCT and slowdown fall as nodes are
added; energy rises), so the sizes are searched, not swept: each round replays up to ``width``
sizes at once, evenly spread over the interval still open, and keeps the sub-interval between
the largest size that missed and the smallest that met. With ``width`` 1 that is a binary
search. The size just below the answer on the grid is always among those replayed, so the
answer comes with its check (it met; one step smaller missed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

from aicluster.core import Cluster, Tenant
from aicluster.scheduler import SchedulerConfig
from aicluster.sim.config import SimConfig
from aicluster.sim.engine import Simulator
from aicluster.sim.metrics import SimResult, percentile, summarize
from aicluster.sim.plan_spec import Grid, Slo
from aicluster.sim.predict import PredictionOptions
from aicluster.sim.traces import TraceJob

__all__ = [
    "Plan",
    "PlanSetup",
    "Trial",
    "VariantPlan",
    "meets",
    "replay",
    "run_plan",
    "scale_cluster",
    "search",
]

Variant = tuple[str | None, int | None]  # (gpu type, racks); None: the template's


def scale_cluster(
    template: Cluster, nodes: int, gpu_type: str | None = None, racks: int | None = None
) -> Cluster:
    """``nodes`` nodes like the template's (its nodes repeated in order), filled rack by rack,
    pod by pod: as many nodes a rack as the template's largest rack (or ``racks`` racks),
    as many racks a pod as its largest pod. Power budgets of racks that remain are kept."""
    if nodes < 1:
        raise ValueError("a cluster needs at least one node")
    per_rack = math.ceil(nodes / racks) if racks else max(map(len, template.racks().values()))
    racks_per_pod = max(len({node.rack for node in pod}) for pod in template.pods().values())
    width = len(str(nodes - 1))
    made = []
    for index in range(nodes):
        like = template.nodes[index % len(template.nodes)]
        rack = index // per_rack
        made.append(
            replace(
                like,
                name=f"node-{index:0{width}d}",
                rack=f"rack-{rack}",
                pod=f"pod-{rack // racks_per_pod}",
                gpu_type=gpu_type or like.gpu_type,
            )
        )
    names = {node.rack for node in made}
    budgets = tuple(b for b in template.budgets if b.racks is None or b.racks <= names)
    return Cluster(
        _label(template.name, nodes, gpu_type, racks),
        tuple(made),
        template.power,
        template.bandwidth,
        budgets,
    )


def _label(name: str, nodes: int, gpu_type: str | None, racks: int | None) -> str:
    return (
        f"{name}-{nodes}n" + (f"-{gpu_type}" if gpu_type else "") + (f"-{racks}r" if racks else "")
    )


@dataclass(frozen=True)
class PlanSetup:
    """Everything a replay needs besides the size (sent to each worker process once)."""

    template: Cluster
    jobs: Sequence[TraceJob]
    scheduler: SchedulerConfig
    config: SimConfig
    slos: Sequence[Slo]
    tenants: dict[str, Tenant] = field(default_factory=dict)
    prediction: PredictionOptions | None = None  # a fresh predictor per replay where on


def replay(setup: PlanSetup, nodes: int, variant: Variant = (None, None)) -> dict[str, float]:
    """Replay the trace on the template grown to ``nodes``: the summary's numeric figures and
    the SLOs' percentiles it lacks."""
    cluster = scale_cluster(setup.template, nodes, *variant)
    simulator = Simulator(
        cluster,
        setup.jobs,
        tenants=setup.tenants,
        scheduler=setup.scheduler,
        config=setup.config,
        predictor=setup.prediction.predictor() if setup.prediction is not None else None,
    )
    result = simulator.run()
    summary = summarize(result)
    figures = {k: float(v) for k, v in summary.items() if isinstance(v, int | float)}
    for slo in setup.slos:
        if slo.key not in figures:
            figures[slo.key] = _percentile(result, slo.key)
    return figures


def _percentile(result: SimResult, key: str) -> float:
    statistic, _, q = key.rpartition("_p")
    return percentile(result, statistic, float(q))


@dataclass(frozen=True)
class Trial:
    """One replay: the size, its GPUs, its figures and whether every SLO was met."""

    nodes: int
    gpus: int
    figures: dict[str, float]
    met: tuple[bool, ...]

    @property
    def all_met(self) -> bool:
        return all(self.met)


@dataclass(frozen=True)
class VariantPlan:
    """The search of one variant: what it tried (by size) and its answer (None: no size on the
    grid meets every SLO); ``note`` says why not, or what the check found."""

    gpu_type: str | None
    racks: int | None
    trials: dict[int, Trial]
    answer: int | None
    below: int | None  # the grid's size below the answer, replayed as the check (None: none)
    note: str = ""


@dataclass(frozen=True)
class Plan:
    """A plan's whole answer: the SLOs, the grid and each variant's search."""

    slos: Sequence[Slo]
    grid: Grid
    variants: list[VariantPlan]


def meets(slo: Slo, figures: dict[str, float]) -> bool:
    """Whether a replay meets ``slo``; one that left jobs unfinished (a job larger than the
    cluster never runs) meets none, since its statistics count completed jobs only."""
    return not figures.get("unfinished", 0) and slo.met(figures.get(slo.key, math.nan))


Evaluate = Callable[[list[int]], dict[int, dict[str, float]]]


def _probes(low: int, high: int, width: int, top_known: bool, last: int) -> list[int]:
    """Up to ``width`` indexes strictly between ``low`` and ``high``, evenly spread; while the
    top is unknown (``high`` past the grid), the grid's last size is one of them."""
    if not top_known:
        rest = _probes(low, last, width - 1, True, last) if width > 1 else []
        return sorted({*rest, last})
    gap = high - low - 1
    count = min(width, gap)
    return sorted(
        {low + max(1, round(k * (high - low) / (count + 1))) for k in range(1, count + 1)}
    )


def search(
    sizes: Sequence[int], slos: Sequence[Slo], evaluate: Evaluate, width: int
) -> tuple[dict[int, dict[str, float]], int | None, int | None]:
    """The smallest size meeting every SLO that size helps (assumed monotone), the size below
    it on the grid (replayed), and every size's figures. ``evaluate`` replays a batch."""
    growing = [slo for slo in slos if slo.helped_by_size]
    tried: dict[int, dict[str, float]] = {}

    def met(index: int) -> bool:
        figures = tried[sizes[index]]
        return all(meets(slo, figures) for slo in growing)

    low, high, top_known = -1, len(sizes), False
    while high - low > 1:
        batch = _probes(low, high, max(width, 1), top_known, len(sizes) - 1)
        tried.update(evaluate([sizes[i] for i in batch if sizes[i] not in tried]))
        top_known = True
        passing = [i for i in batch if met(i)]
        if not passing and high == len(sizes):
            return tried, None, None  # the largest size misses: no answer on the grid
        high = min([high, *passing])
        low = max([low, *(i for i in batch if i < high and not met(i))])
    return tried, sizes[high], sizes[low] if low >= 0 else None


_SETUP: PlanSetup | None = None


def _start_worker(setup: PlanSetup) -> None:
    global _SETUP  # each worker process's copy, sent once rather than with every task
    _SETUP = setup


def _replay_in_worker(nodes: int, variant: Variant) -> dict[str, float]:
    assert _SETUP is not None
    return replay(_SETUP, nodes, variant)


def run_plan(
    setup: PlanSetup, grid: Grid, workers: int = 1, ray_address: str | None = None
) -> Plan:
    """Search each variant of the grid, replaying up to ``workers`` sizes at once: in
    processes here, or, with ``ray_address``, as tasks on that Ray cluster; one worker and no
    Ray: in this process."""
    replays = _replays(setup, workers, ray_address)
    try:
        plans = []
        for variant in grid.variants():

            def evaluate(
                batch: list[int], variant: Variant = variant
            ) -> dict[int, dict[str, float]]:
                return replays.run(batch, variant)

            plans.append(_search_variant(setup, grid.nodes, variant, evaluate, workers))
        return Plan(setup.slos, grid, plans)
    finally:
        replays.shutdown()


class _Replays:
    """Replays in this process, one after the other."""

    def __init__(self, setup: PlanSetup) -> None:
        self.setup = setup

    def run(self, batch: list[int], variant: Variant) -> dict[int, dict[str, float]]:
        return {n: replay(self.setup, n, variant) for n in batch}

    def shutdown(self) -> None:
        return None


class _ProcessReplays(_Replays):
    """Replays at once in ``workers`` processes of this machine, each given the setup once."""

    def __init__(self, setup: PlanSetup, workers: int) -> None:
        super().__init__(setup)
        self.pool = ProcessPoolExecutor(workers, initializer=_start_worker, initargs=(setup,))

    def run(self, batch: list[int], variant: Variant) -> dict[int, dict[str, float]]:
        futures = {n: self.pool.submit(_replay_in_worker, n, variant) for n in batch}
        return {n: future.result() for n, future in futures.items()}

    def shutdown(self) -> None:
        self.pool.shutdown(cancel_futures=True)


class _RayReplays(_Replays):
    """Replays as tasks on a Ray cluster: Ray's ``multiprocessing.Pool`` (one actor per worker,
    wherever the cluster has a CPU free, each given the setup once)."""

    def __init__(self, setup: PlanSetup, workers: int, address: str) -> None:
        from ray.util.multiprocessing import Pool

        super().__init__(setup)
        self.pool = Pool(workers, _start_worker, (setup,), ray_address=address)

    def run(self, batch: list[int], variant: Variant) -> dict[int, dict[str, float]]:
        results = {n: self.pool.apply_async(_replay_in_worker, (n, variant)) for n in batch}
        return {n: result.get() for n, result in results.items()}

    def shutdown(self) -> None:
        self.pool.terminate()  # type: ignore[no-untyped-call]


def _replays(setup: PlanSetup, workers: int, ray_address: str | None) -> _Replays:
    if ray_address is not None:
        return _RayReplays(setup, workers, ray_address)
    if workers > 1:
        return _ProcessReplays(setup, workers)
    return _Replays(setup)


def _search_variant(
    setup: PlanSetup, sizes: Sequence[int], variant: Variant, evaluate: Evaluate, width: int
) -> VariantPlan:
    tried, answer, below = search(sizes, setup.slos, evaluate, width)
    trials = {
        n: Trial(
            n,
            scale_cluster(setup.template, n, *variant).total_gpus,
            figures,
            tuple(meets(slo, figures) for slo in setup.slos),
        )
        for n, figures in sorted(tried.items())
    }
    note = ""
    if answer is None:
        note = f"no size up to {sizes[-1]} nodes meets every SLO"
    elif not trials[answer].all_met:  # an SLO that a bigger cluster only misses more
        missed = [s.text for s, ok in zip(setup.slos, trials[answer].met, strict=True) if not ok]
        note = (
            f"{answer} nodes meet the rest but miss {', '.join(missed)}; bigger sizes miss it more"
        )
        answer = None
    return VariantPlan(*variant, trials, answer, below, note)


def plan_rows(plan: Plan) -> Iterable[tuple[VariantPlan, Trial]]:
    for variant in plan.variants:
        for trial in variant.trials.values():
            yield variant, trial
