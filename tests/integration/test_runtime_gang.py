"""Gangs on a real 4-node Ray cluster: pinning, logs, telemetry, failure, stop, reconcile."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from aicluster.core import DomainLevel, Placement, Slot
from aicluster.runtime import (
    GangError,
    GangPhase,
    GangSpec,
    GangStartTimeout,
    PlacementError,
    RankState,
    Runtime,
    discover,
)
from aicluster.runtime.gang.launch import named_placement_group

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DDP_MLP = str(REPO / "examples" / "jobs" / "ddp_mlp.py")
STUBBORN = str(Path(__file__).parent / "jobs" / "stubborn.py")


def placement(*nodes: str, gpus: int = 1) -> Placement:
    return Placement(tuple(Slot(node, gpus) for node in nodes), DomainLevel.POD, "pod-0")


def spec(
    job_id: str, *nodes: str, entrypoint: str = DDP_MLP, args: tuple[str, ...] = ()
) -> GangSpec:
    """A gang of 1-GPU workers (a rank each) running ``entrypoint`` from a fresh copy of the
    folder that holds it."""
    folder = Path(entrypoint).parent if Path(entrypoint).is_absolute() else Path(DDP_MLP).parent
    return GangSpec(
        job_id=job_id,
        entrypoint=Path(entrypoint).name if Path(entrypoint).is_absolute() else entrypoint,
        args=args,
        placement=placement(*nodes),
        workers=len(nodes),
        gpus_per_worker=1,
        working_dir=str(folder),
    )


def free_gpus(node: str) -> float:
    return discover().nodes[node].available.get("aicluster/gpu", 0.0)


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_ddp_gang_runs_pinned_to_its_nodes_and_reports(runtime: Runtime) -> None:
    nodes = ("node-1", "node-1", "node-2", "node-2")
    handle = runtime.launch(spec("mlp", *nodes, args=("--steps", "40")))
    assert free_gpus("node-1") == 6.0  # two ranks hold a GPU each there
    status = handle.wait(timeout_s=240)
    assert status.phase is GangPhase.SUCCEEDED, status.message
    assert status.exit_codes == {0: 0, 1: 0, 2: 0, 3: 0}

    telemetry = runtime.telemetry("mlp")
    for rank, records in telemetry.items():
        # the node each rank *actually* ran on (read by its actor from Ray) is the one asked for
        assert {r.node for r in records} == {nodes[rank]}
        steps = [r for r in records if r.kind == "step"]
        assert [r.step for r in steps] == list(range(1, 41))
        assert all(r.step_time and r.throughput for r in steps)
    mean = [sum(telemetry[r][i + 1].loss or 0 for r in range(4)) / 4 for i in range(40)]
    assert sum(mean[-5:]) < 0.5 * sum(mean[:5]), mean

    log = runtime.logs("mlp", 0).text
    assert "".join(handle.follow(0)) == log  # the gang has ended: follow drains and returns
    assert "rank 0/4 local 0 on node node-1" in log and "done" in log
    assert "rank 3/4 local 1 on node node-2" in runtime.logs("mlp", 3).text

    assert any(g.job_id == "mlp" for g in runtime.live_gangs())  # done, but not yet released
    final = handle.stop()
    assert final.phase is GangPhase.SUCCEEDED
    assert not any(g.job_id == "mlp" for g in runtime.live_gangs())
    wait_for(lambda: free_gpus("node-1") == 8.0)


def test_failing_rank_fails_the_gang_with_its_exit_code_and_stderr(runtime: Runtime) -> None:
    args = ("--steps", "200", "--fail-rank", "2", "--fail-step", "3", "--step-sleep", "0.05")
    handle = runtime.launch(spec("broken", "node-0", "node-0", "node-3", "node-3", args=args))
    status = handle.wait(timeout_s=180)
    assert status.phase is GangPhase.FAILED
    first = status.failed_ranks[0]
    assert (first.rank, first.exit_code, first.node) == (2, 3, "node-3")
    assert "failing on purpose" in first.stderr_tail
    assert "rank 2 on node-3 exited with code 3" in status.message
    assert "failing on purpose" in runtime.logs("broken", 2, stream="stderr").text
    final = handle.stop(grace_s=2)
    assert final.phase is GangPhase.FAILED  # a stop after a failure keeps the failure
    assert not any(g.job_id == "broken" for g in runtime.live_gangs())


def test_stop_ends_a_running_gang_within_its_grace_and_frees_it(runtime: Runtime) -> None:
    args = ("--steps", "100000", "--step-sleep", "0.2")
    gang = spec("long", "node-2", "node-3", args=args)
    handle = runtime.launch(gang)
    cursor = handle.telemetry_cursor()
    seen: list[int] = []
    wait_for(lambda: seen.extend(r.rank for r in cursor.poll()) or len(seen) > 8, timeout_s=120)
    assert set(seen) == {0, 1}
    assert len(cursor.poll()) < len(seen)  # each poll brings only what is new

    # A control plane restarting finds the gang and launching it again changes nothing.
    restarted = Runtime(runtime.state_dir)
    assert [g.job_id for g in restarted.live_gangs()] == ["long"]
    again = restarted.launch(gang)
    assert again.status().phase is GangPhase.RUNNING
    starts = [r for rs in handle.telemetry().values() for r in rs if r.kind == "start"]
    assert len(starts) == 2

    began = time.monotonic()
    # A grace a loaded machine keeps: a rank's checkpoint and exit took over 5 s at a load of 20.
    final = again.stop(grace_s=15)
    assert time.monotonic() - began < 15 + 10
    assert final.phase is GangPhase.STOPPED
    # ddp_mlp honours SIGTERM (train.should_stop): every rank checkpoints and exits 0.
    assert {r.exit_code for r in final.ranks} == {0}
    assert all(r.stopped for r in final.ranks)
    assert all(r.stopped for r in final.ranks)
    assert restarted.live_gangs() == []
    wait_for(lambda: free_gpus("node-2") == 8.0 and free_gpus("node-3") == 8.0)
    with pytest.raises(Exception, match="stopped"):
        restarted.launch(gang)  # a stopped attempt is not relaunched: use a new attempt


def test_the_loser_of_a_race_to_create_a_placement_group_takes_the_winners(
    runtime: Runtime,
) -> None:
    """Both launchers found no group by the name; the other one created it first."""
    name = "race-pg"
    made: list[PlacementGroup] = []

    def create() -> PlacementGroup:
        made.append(placement_group([{"CPU": 0.01}], name=name, lifetime="detached"))  # winner
        return placement_group([{"CPU": 0.01}], name=name, lifetime="detached")  # this one

    try:
        group = named_placement_group(name, create)
        assert group.id == made[0].id
    finally:
        remove_placement_group(made[0])


def test_two_launches_of_one_attempt_at_once_start_it_once(runtime: Runtime) -> None:
    """A deposed control plane's launch resuming while its successor launches the job it
    adopted: both return the running gang, and each rank started once."""
    gang = spec("twice", "node-1", "node-2", args=("--steps", "100000", "--step-sleep", "0.2"))
    launchers = [runtime, Runtime(runtime.state_dir)]
    with ThreadPoolExecutor(2) as pool:
        handles = list(pool.map(lambda launcher: launcher.launch(gang), launchers))
    try:
        wait_for(lambda: handles[0].status().phase is GangPhase.RUNNING, timeout_s=120)
        assert handles[1].status().phase is GangPhase.RUNNING
        cursor, stepped = handles[0].telemetry_cursor(), set[int]()
        wait_for(lambda: stepped.update(r.rank for r in cursor.poll()) or len(stepped) == 2)
        starts = [r.rank for rs in handles[0].telemetry().values() for r in rs if r.kind == "start"]
        assert sorted(starts) == [0, 1]
    finally:
        handles[0].stop(grace_s=0)
    wait_for(lambda: free_gpus("node-1") == 8.0 and free_gpus("node-2") == 8.0)


def test_stop_kills_a_rank_that_ignores_sigterm_after_the_grace(runtime: Runtime) -> None:
    handle = runtime.launch(spec("stubborn", "node-1", entrypoint=STUBBORN))
    wait_for(lambda: "started" in handle.logs(0).text)
    began = time.monotonic()
    final = handle.stop(grace_s=2)
    took = time.monotonic() - began
    assert 2 <= took < 12, took
    assert final.ranks[0].exit_code == -9 and final.phase is GangPhase.STOPPED
    assert "ignoring SIGTERM" in handle.logs(0).text


def test_bad_placements_are_refused_before_touching_ray(runtime: Runtime) -> None:
    with pytest.raises(PlacementError, match="node-9"):
        runtime.launch(spec("nowhere", "node-9"))
    with pytest.raises(PlacementError, match="placement holds"):
        runtime.launch(
            GangSpec("short", DDP_MLP, placement("node-1", gpus=2), workers=2, gpus_per_worker=2)
        )
    assert runtime.gang("nowhere") is None


def test_a_missing_entrypoint_fails_with_pythons_error(runtime: Runtime) -> None:
    handle = runtime.launch(spec("missing", "node-0", entrypoint="no/such/script.py"))
    status = handle.wait(timeout_s=60)
    assert status.phase is GangPhase.FAILED
    assert status.ranks[0].state is RankState.EXITED and status.ranks[0].exit_code == 2
    assert "No such file" in status.ranks[0].stderr_tail
    handle.stop()


def test_a_placement_ray_cannot_reserve_times_out_and_leaves_nothing(runtime: Runtime) -> None:
    impatient = Runtime(runtime.state_dir, start_timeout_s=3)
    too_big = GangSpec(  # 3 workers x 4 GPUs on one 8-GPU node
        "too-big",
        DDP_MLP,
        placement("node-0", "node-0", "node-0", gpus=4),
        workers=3,
        gpus_per_worker=4,
        cpus_per_worker=0,
    )
    with pytest.raises(GangStartTimeout, match="could not reserve"):
        impatient.launch(too_big)
    assert not any(g.job_id == "too-big" for g in runtime.live_gangs())
    assert free_gpus("node-0") == 8.0


def test_a_launch_that_fails_half_way_leaves_nothing(runtime: Runtime) -> None:
    """The placement group and actors exist when a rank cannot start (its code tree is not in
    the code store): the launch removes them before it raises."""
    no_code = dataclasses.replace(spec("no-code", "node-2", "node-3"), code="f" * 64)
    with pytest.raises(GangError, match="no-code attempt 0"):
        runtime.launch(no_code)
    assert not any(g.job_id == "no-code" for g in runtime.live_gangs())
    wait_for(lambda: free_gpus("node-2") == 8.0 and free_gpus("node-3") == 8.0)
