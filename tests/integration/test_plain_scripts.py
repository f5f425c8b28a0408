"""A new user's first jobs on the live control loop and the real 4-node Ray cluster: scripts that
import nothing of aicluster nor of torch (``jobs/plain.py``). One that never steps outlives the
startup grace and SUCCEEDS; one that raises the same error twice ends FAILED with its traceback;
one whose node is killed under it runs again elsewhere.

The loop's rules behind these (hang detection, restart_on) run over the fake runtime in
``tests/unit/test_control_loop_rules.py``; ``jobs`` and ``why`` showing a failure at 80 columns,
``test_failure_api.py``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from looprun import one_backend, run_until, state_of, submit, two_tenant_loop

from aicluster.control.loop.health import HealthConfig
from aicluster.control.loop.loop import ControlLoop
from aicluster.core import JobState
from aicluster.runtime import EmbeddedCluster, Runtime
from aicluster.store import NodeHealth

pytestmark = pytest.mark.integration


@pytest.fixture
def loop(store_url: str, runtime: Runtime) -> Iterator[ControlLoop]:
    with two_tenant_loop(store_url, runtime) as control:
        yield control


@one_backend("sqlite")
def test_a_plain_script_outlives_the_startup_grace_and_the_same_error_twice_ends_a_job(
    loop: ControlLoop,
) -> None:
    """Scripts that import nothing of aicluster nor torch, as a new user's first jobs: one that
    never steps outlives the startup grace and SUCCEEDS, never called hung; one that raises the
    same error on both attempts ends FAILED after the second (restart_on's default) with its
    traceback's last line in its failure, although it had restarts left."""
    loop.settings = replace(loop.settings, health=HealthConfig(startup_grace_s=2, hang_floor_s=2))
    silent = submit(loop, "silent", workers=1, entrypoint="plain.py", extra=("--sleep", "8"))
    error = "bad batch at step 20"
    raises = submit(
        loop, "raises", workers=1, entrypoint="plain.py", extra=("--raise", error), max_restarts=3
    )
    ended = (JobState.SUCCEEDED, JobState.FAILED)
    run_until(loop, lambda: all(state_of(loop, j.id) in ended for j in (silent, raises)), 180)
    quiet = loop.store.get_job(None, silent.id)
    assert (quiet.state, quiet.attempt) == (JobState.SUCCEEDED, 1), quiet.exit_message
    assert "job.hung" not in [e.kind for e in loop.store.events(silent.id)]
    failed = loop.store.get_job(None, raises.id)
    assert (failed.state, failed.attempt, failed.exit_code) == (JobState.FAILED, 2, 1)
    assert "the same failure twice in a row" in (failed.exit_message or ""), failed.exit_message
    assert failed.failure is not None
    assert failed.failure["stderr_tail"][-1] == f"ValueError: {error}", failed.failure


@one_backend("sqlite")
def test_a_plain_script_whose_node_is_killed_runs_again_and_succeeds(
    loop: ControlLoop, ray_cluster: EmbeddedCluster
) -> None:
    """A lost node is the infrastructure's failure, not the job's: a script that imports nothing
    of aicluster, whose node's raylet is killed under it, runs again elsewhere and SUCCEEDS (the
    node comes back afterwards, as in test_chaos.py, for the tests after this one)."""
    loop.tick()  # the nodes, as Ray reports them, in the store
    # Never on the head node, which cannot be killed.
    loop.store.set_node_health("node-0", NodeHealth.CORDONED, "tester", "the head node")
    job = submit(
        loop, "orphaned", workers=1, entrypoint="plain.py", extra=("--sleep", "8"), max_restarts=1
    )
    run_until(loop, lambda: state_of(loop, job.id) is JobState.RUNNING)
    placement = loop.store.get_job(None, job.id).placement
    assert placement is not None
    (name,) = {slot[0] for slot in placement["slots"]}
    node = next(n for n in ray_cluster.topology.nodes if n.name == name)
    ray_cluster.remove_node(name, graceful=False)
    try:
        run_until(loop, lambda: state_of(loop, job.id) is JobState.SUCCEEDED, 180)
    finally:
        ray_cluster.add_node(node)
    done = loop.store.get_job(None, job.id)
    assert done.attempt == 2 and done.restarts == 1, done
    restarted = [e for e in loop.store.events(job.id) if e.to_state == "RESTARTING"]
    assert restarted and name in str(restarted[0].details.get("reason")), restarted
