"""Each node's and rack's power as the control plane shows it (control/views/powerview.py): the
power model's figure, labelled modelled, until a node's meters report
(runtime/cluster/powermeter.py, written here with the reporter's own writer); then the measured
figure, labelled measured, until the report is stale. Through ``GET /metrics`` and the dashboard's
cluster map, on a real server over a live control loop."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from apiserver import RunningServer, serve
from liveplane import leading, open_live_plane, racks, users, wait_for
from prometheus_client.parser import text_string_to_metric_families

from aicluster.core import Tenant
from aicluster.runtime.cluster.powermeter import Reading, power_report_path, write_power_report
from aicluster.store import Role

pytestmark = pytest.mark.integration

IDLE_NODE_W = 8 * 60.0  # the default power model: 8 idle GPUs of 60 W, no base draw


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    state = tmp_path_factory.mktemp("state")
    plane = open_live_plane(state, [Tenant("a")], racks(1, 2, 2))  # 2 racks of 2 nodes
    tokens = users(plane.store, {"alice": ("a", Role.VIEWER)})
    with leading(plane), serve(plane) as url:
        wait_for(lambda: plane.node_power(), "the loop's first tick")
        yield RunningServer(url, plane, tokens)
    plane.store.close()


def _power(server: RunningServer) -> dict[tuple[str, ...], float]:
    with server.client("admin") as admin:
        text = admin.get("/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name in ("aicluster_node_power_watts", "aicluster_rack_power_watts"):
            for sample in family.samples:
                key = (family.name, *sample.labels.values())
                found[key] = sample.value
    return found


def test_modelled_until_measured_and_modelled_again_once_stale(server: RunningServer) -> None:
    node, rack = "node-0-0-0", "rack-0-0"
    power = _power(server)
    assert power[("aicluster_node_power_watts", node, rack, "modelled")] == IDLE_NODE_W
    assert power[("aicluster_rack_power_watts", rack, "modelled")] == 2 * IDLE_NODE_W

    report = power_report_path(server.plane.settings.state_dir, node)
    write_power_report(report, Reading(812.5, ("nvml", "rapl"), time.time()))
    power = _power(server)
    assert power[("aicluster_node_power_watts", node, rack, "measured")] == 812.5
    assert ("aicluster_node_power_watts", node, rack, "modelled") not in power
    assert power[("aicluster_rack_power_watts", rack, "partial")] == 812.5 + IDLE_NODE_W
    with server.client("alice") as alice:
        cluster = alice.get("/v1/ui/cluster-map").json()
    shown = {n["name"]: n for p in cluster["pods"] for r in p["racks"] for n in r["nodes"]}
    assert (shown[node]["watts"], shown[node]["watts_source"]) == (812.5, "measured")
    assert (shown["node-0-0-1"]["watts"], shown["node-0-0-1"]["watts_source"]) == (
        IDLE_NODE_W,
        "modelled",
    )
    first = cluster["pods"][0]["racks"][0]
    assert (first["watts"], first["watts_source"]) == (812.5 + IDLE_NODE_W, "partial")

    write_power_report(report, Reading(812.5, ("nvml",), time.time() - 600))  # reporter stopped
    assert _power(server)[("aicluster_node_power_watts", node, rack, "modelled")] == IDLE_NODE_W
