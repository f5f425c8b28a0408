"""Random placement (``placement.strategy: random``): the topology-oblivious baseline keeps every
hard constraint, fits exactly where topology-aware placement does, and is a function of the
seed, the job and the free capacity."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from aicluster.configuration import parse_configuration, scheduler_config
from aicluster.core import Cluster, DomainLevel, Placement, Slot, make_cluster
from aicluster.scheduler import FreeIndex, SchedulerConfig, find_placement, make_state
from builders import Driver, admitted, make_job, small_cluster

ROOT = Path(__file__).resolve().parents[2]


def occupied(index: FreeIndex, draw: random.Random) -> None:
    """Take a random number of GPUs on each node (as running jobs would)."""
    for node in index.nodes:
        used = draw.randrange(node.gpus + 1)
        if used:
            index.allocate((Slot(node.name, used, -1),))


def test_it_fits_exactly_where_topology_aware_placement_fits_and_keeps_the_constraints() -> None:
    cluster = small_cluster(nodes=8, per_rack=2, nvlink_domain_size=4)
    draw = random.Random("random-placement")
    shapes = [
        make_job("one").gpus(1),
        make_job("pair").gpus(2),
        make_job("node").gpus(8),
        make_job("wide").gpus(16),
        make_job("tp").workers(3, 4).tensor(4),
        make_job("rack").workers(4, 2).within(DomainLevel.RACK),
        make_job("single").workers(2, 2).within(DomainLevel.NODE),
    ]
    for _ in range(60):
        topology, scattered = FreeIndex(cluster), FreeIndex(cluster, random_seed=7)
        state = draw.getstate()
        occupied(topology, draw)
        draw.setstate(state)
        occupied(scattered, draw)
        for builder in shapes:
            job = builder.build()
            packed, spread = find_placement(topology, job), find_placement(scattered, job)
            assert isinstance(packed, Placement) == isinstance(spread, Placement), job.id
            if isinstance(spread, Placement):
                assert sum(slot.gpus for slot in spread.slots) == job.total_gpus
                assert spread.level <= max(job.max_domain, DomainLevel.NODE)
                if job.needs_nvlink:  # each tensor-parallel group inside one NVLink domain
                    assert all(slot.nvlink_domain >= 0 for slot in spread.slots)
                assert find_placement(scattered, job) == spread  # a function of its inputs


def test_it_spreads_a_gang_that_topology_aware_placement_keeps_on_one_node() -> None:
    cluster = make_cluster(nodes=16, gpus_per_node=8, nodes_per_rack=4)
    job = make_job("pair").gpus(8, 2).build()  # four workers of 2 GPUs
    packed = find_placement(FreeIndex(cluster), job)
    assert isinstance(packed, Placement) and len(packed.nodes) == 1
    levels = set()
    for seed in range(20):
        index = FreeIndex(cluster, random_seed=seed)
        index.allocate(tuple(_half_of_every_node(cluster)))
        spread = find_placement(index, job)
        assert isinstance(spread, Placement)
        levels.add(spread.level)
    assert DomainLevel.NODE not in levels or len(levels) > 1  # seeds draw other domains
    assert levels & {DomainLevel.RACK, DomainLevel.POD, DomainLevel.CLUSTER}


def _half_of_every_node(cluster: Cluster) -> list[Slot]:
    return [Slot(node.name, 4, -1) for node in cluster.nodes]


@pytest.mark.parametrize("shortcuts", [True, False])
def test_the_scheduler_places_by_the_configured_strategy(shortcuts: bool) -> None:
    driver = Driver(
        small_cluster(nodes=8, per_rack=2),
        placement="random",
        placement_seed=3,
        shortcuts=shortcuts,
    )
    driver.submit(*(make_job(f"j{i}").gpus(6, 1) for i in range(8)))
    plan = driver.cycle()
    assert len(admitted(plan)) == 8
    spread = [len(driver.node_of(f"j{i}")) for i in range(8)]
    assert max(spread) > 1  # some 6-GPU gang was split over nodes that had room for it whole
    assert spread == _nodes_per_job_with_seed(3, shortcuts)


def _nodes_per_job_with_seed(seed: int, shortcuts: bool) -> list[int]:
    """The same run again: the same seed gives the same placements, shortcuts or not."""
    driver = Driver(
        small_cluster(nodes=8, per_rack=2),
        placement="random",
        placement_seed=seed,
        shortcuts=not shortcuts,
    )
    driver.submit(*(make_job(f"j{i}").gpus(6, 1) for i in range(8)))
    driver.cycle()
    return [len(driver.node_of(f"j{i}")) for i in range(8)]


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown placement 'spread'"):
        SchedulerConfig(placement="spread")


def test_the_configuration_file_chooses_the_strategy_live_and_in_the_simulator() -> None:
    path = ROOT / "examples/config/random-placement.yaml"
    configuration, _ = parse_configuration(path.read_text(), str(path))
    config = scheduler_config(configuration)
    assert (config.placement, config.placement_seed) == ("random", 1)
    assert make_state(small_cluster(), config=config).index.random_seed == 1
    assert make_state(small_cluster(), config=SchedulerConfig()).index.random_seed is None
