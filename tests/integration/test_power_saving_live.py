"""Power saving on the live cluster (control/loop/power.py), on the session's embedded Ray cluster
(node-0..node-3, 8 simulated GPUs each; node-0 is Ray's head, which the embedded provider never
powers down).

With ``suspend_after`` of 2 s the idle nodes are powered down: their raylets exit and Ray reports
them dead, yet the nodes stay healthy in the store (powered down is not failed). A job of two
8-GPU workers then needs a second node: the scheduler resumes one, and the job says so while it
waits. The operator's power-on for node-1 fails (a real script exiting 1, through the script
provider), so node-1 is marked failed-to-resume and node-2 is resumed instead; the job runs on
node-0 and node-2 and SUCCEEDS. Each transition is a ``node.power`` event.
"""

from __future__ import annotations

import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from looprun import live_loop, run_until, state_of
from shipping import JOBS, ship

from aicluster.control.loop.loop import ControlLoop
from aicluster.control.settings import LoopSettings
from aicluster.core import JobState, ManualClock, Node, Tenant, jobspec_from_mapping
from aicluster.core.power import PowerPolicy
from aicluster.runtime import EmbeddedCluster, Runtime, discover
from aicluster.runtime.cluster.powermeter import power_report_path, read_power_report
from aicluster.runtime.cluster.providers import (
    POWER_SOCKET,
    DetachedEmbeddedProvider,
    EmbeddedProvider,
    ProviderError,
    ScriptProvider,
    serve_power_requests,
)
from aicluster.scheduler import SchedulerConfig
from aicluster.store import NodeHealth, Store, placement_from_json

pytestmark = pytest.mark.integration

POLICY = PowerPolicy(suspend_after=2.0, suspend_time=1.0, resume_time=5.0, resume_timeout=60.0)


class OneNodesBmcIsBroken(EmbeddedProvider):
    """The embedded cluster's provider, except that node ``broken``'s power-on is the operator's
    script, which fails (its BMC does not answer)."""

    def __init__(self, cluster: EmbeddedCluster, broken: str, script: Path) -> None:
        super().__init__(cluster)
        self.broken = broken
        self.script = ScriptProvider({"suspend": [str(script)], "resume": [str(script)]})

    def resume(self, node: str, timeout_s: float) -> None:
        if node == self.broken:
            self.script.resume(node, timeout_s)
        else:
            super().resume(node, timeout_s)


@pytest.fixture
def all_nodes_back(ray_cluster: EmbeddedCluster) -> Iterator[EmbeddedCluster]:
    """The session's cluster as it was, whatever the test powered down."""
    try:
        yield ray_cluster
    finally:
        for node in ray_cluster.topology.nodes:
            if node.name not in ray_cluster._nodes:
                ray_cluster.add_node(node)
        deadline = time.monotonic() + 60
        while not all(discover().health().values()):
            assert time.monotonic() < deadline, discover().health()
            time.sleep(0.5)


def _raylet(cluster: EmbeddedCluster, name: str) -> subprocess.Popen[bytes]:
    return cluster._nodes[name].all_processes["raylet"][0].process


def test_idle_nodes_power_down_and_a_job_resumes_them_around_a_failed_power_on(
    tmp_path: Path,
    runtime: Runtime,
    all_nodes_back: EmbeddedCluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = all_nodes_back
    script = tmp_path / "node-power"
    script.write_text('#!/bin/sh\necho "BMC of $1 does not answer" >&2\nexit 1\n')
    script.chmod(0o755)
    raylets = {name: _raylet(cluster, name) for name in ("node-1", "node-2", "node-3")}
    store = Store.open(f"sqlite:///{tmp_path / 'live.db'}")
    store.create_tenant(Tenant("a"), "test")
    config = SchedulerConfig(queue="fifo", backfill="none", power=POLICY)
    provider = OneNodesBmcIsBroken(cluster, "node-1", script)
    with live_loop(store, runtime, config, provider=provider, estimates=None) as loop:
        run_until(loop, lambda: _powers(store) == ["on", "off", "off", "off"], timeout_s=60)
        assert all(raylet.poll() is not None for raylet in raylets.values())
        assert discover().health() == {
            "node-0": True,
            "node-1": False,
            "node-2": False,
            "node-3": False,
        }
        assert all(r.health is NodeHealth.HEALTHY for r in store.list_nodes())

        spec = {
            "name": "two-nodes",
            "entrypoint": "sleeps.py",
            "code": ship(runtime.state_dir, "a", JOBS),
            "workers": 2,
            "args": ["1"],
            "resources": {"gpus": 8, "cpus": 1, "memory_gb": 0.1},
        }
        job = store.submit_job("a", jobspec_from_mapping(spec), "u")[0].id
        loop.tick()
        loop.tick()
        waiting = store.get_job(None, job).pending_reason or ""
        assert "node(s) resuming from power saving" in waiting, waiting
        run_until(loop, lambda: state_of(loop, job).terminal, timeout_s=120)
        assert state_of(loop, job) is JobState.SUCCEEDED
        placed = placement_from_json(store.get_job(None, job).placement)
        assert sorted(slot.node for slot in placed.slots) == ["node-0", "node-2"]
        logged = store.events_of_kind(["node.power"])
        powers = {record.node.name: record.power for record in store.list_nodes()}
    assert powers["node-1"] == "failed-to-resume" and powers["node-2"] == "on"
    events = [(e.details["node"], e.to_state) for e in logged]
    assert ("node-1", "failed-to-resume") in events
    for node in ("node-1", "node-2", "node-3"):
        assert events.index((node, "suspending")) < events.index((node, "off"))
    assert events.index(("node-2", "resuming")) < events.index(("node-2", "on"))
    assert events.index(("node-1", "failed-to-resume")) < events.index(("node-2", "resuming"))
    failed = next(e for e in logged if e.to_state == "failed-to-resume")
    assert failed.from_state == "resuming"
    assert "BMC of node-1 does not answer" in failed.details["reason"]  # the script's words
    assert "does not answer" in caplog.text  # and in the loop's log
    assert not any(node == "node-0" for node, _ in events)  # Ray's head stays on
    # Every node's warm starter reports its measured power (nothing measurable on this machine)
    report = read_power_report(power_report_path(runtime.state_dir, "node-0"))
    assert report is not None and report.sources == () and time.time() - report.at < 60


def _powers(store: Store) -> list[str]:
    return [record.power for record in store.list_nodes()]


def test_the_script_provider_runs_the_operators_command_with_the_node_bounded_in_time(
    tmp_path: Path,
) -> None:
    said = tmp_path / "said"
    script = tmp_path / "power"
    script.write_text(
        f'#!/bin/sh\necho "$AICLUSTER_POWER_OPERATION $* $AICLUSTER_RAY_START" >> {said}\n'
        '[ "$2" = slow ] && sleep 5\nexit 0\n'
    )
    script.chmod(0o755)
    provider = ScriptProvider(
        {"suspend": [str(script), "off"], "resume": [str(script), "on"], "create": [str(script)]},
        head_address="10.0.0.1:6379",
    )
    provider.suspend("node-7", 10)
    provider.resume("node-7", 10)
    provider.create(Node("node-8", 8, "H100", "rack-0", "pod-0"), 10)
    lines = said.read_text().splitlines()
    assert lines[0] == "suspend off node-7 "
    assert lines[1] == "resume on node-7 "
    assert lines[2].startswith("create node-8 ray start --address=10.0.0.1:6379")
    assert "aicluster.io/node=node-8" in lines[2]
    started = time.monotonic()
    with pytest.raises(ProviderError, match="no answer in 1 s"):
        ScriptProvider({"suspend": [str(script), "x"], "resume": [str(script)]}).suspend("slow", 1)
    assert time.monotonic() - started < 4
    with pytest.raises(ProviderError, match="has no delete command"):
        provider.delete("node-7", 10)


def test_aicluster_ups_supervisor_stops_and_starts_a_node_on_request(
    tmp_path: Path, all_nodes_back: EmbeddedCluster
) -> None:
    """``aicluster up``'s provider (DetachedEmbeddedProvider) asks the supervisor over the state
    directory's socket, mode 0600; the supervisor stops and starts the node's Ray processes."""
    server = serve_power_requests(all_nodes_back, tmp_path)
    try:
        socket_file = tmp_path / POWER_SOCKET
        assert stat.S_IMODE(socket_file.stat().st_mode) == 0o600
        provider = DetachedEmbeddedProvider(tmp_path)
        provider.suspend("node-3", 60)
        _wait_alive("node-3", False)
        with pytest.raises(ProviderError, match="no running node 'node-3'"):
            provider.suspend("node-3", 60)
        provider.resume("node-3", 60)
        _wait_alive("node-3", True)
        with pytest.raises(ProviderError, match="not a node of the embedded cluster"):
            provider.resume("node-9", 60)
        with socket.socket(socket.AF_UNIX) as conn:  # a malformed request gets an answer
            conn.connect(str(socket_file))
            conn.sendall(b"{not json\n")
            assert b'"ok": false' in conn.makefile("rb").readline()
        assert provider.never_suspend == frozenset()  # no ray.json: nothing known
        (tmp_path / "ray.json").write_text('{"nodes": ["node-0", "node-1"]}')
        assert provider.never_suspend == frozenset({"node-0"})
    finally:
        server.shutdown()


def _wait_alive(node: str, alive: bool) -> None:
    deadline = time.monotonic() + 60
    while discover().health().get(node, False) is not alive:
        assert time.monotonic() < deadline, (node, alive)
        time.sleep(0.5)


def test_nodes_left_off_when_power_saving_is_turned_off_come_back_for_the_queue(
    tmp_path: Path,
) -> None:
    """A configuration without ``power:`` over a store that says node-1 is off (power saving was
    on before): node-1 takes no work until it is back, the queue's demand resumes it through the
    provider (a real script), and nothing is powered down. A real store and loop, without Ray:
    the provider's answer is enough."""
    said = tmp_path / "said"
    script = tmp_path / "node-power"
    script.write_text(f'#!/bin/sh\necho "$AICLUSTER_POWER_OPERATION $1" >> {said}\n')
    script.chmod(0o755)
    clock = ManualClock(1_700_000_000.0)
    store = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}", clock=clock)
    store.create_tenant(Tenant("a"), "test")
    store.upsert_nodes([Node(f"node-{i}", 8, "H100", "rack-0", "pod-0") for i in range(2)])
    store.set_node_power("node-1", "off", "control", reason="powered down")
    provider = ScriptProvider({"suspend": [str(script)], "resume": [str(script)]})
    settings = LoopSettings(SchedulerConfig(queue="fifo"), estimates=None)
    loop = ControlLoop(store, None, None, clock, settings, provider=provider)
    spec = {"name": "both", "entrypoint": "t.py", "workers": 2, "resources": {"gpus": 8}}
    job = store.submit_job("a", jobspec_from_mapping(spec), "u")[0].id
    try:
        loop.tick()
        assert store.get_job(None, job).state is JobState.PENDING  # node-1 is not back yet
        deadline = time.monotonic() + 30
        while store.get_job(None, job).state is JobState.PENDING:
            assert time.monotonic() < deadline, store.get_job(None, job).pending_reason
            clock.advance(1.0)
            loop.tick()
            time.sleep(0.05)
        assert said.read_text() == "resume node-1\n"
        assert [r.power for r in store.list_nodes()] == ["on", "on"]
        clock.advance(3600.0)
        loop.tick()
        assert said.read_text() == "resume node-1\n"  # nothing powered down
    finally:
        loop.stop()
        store.close()
