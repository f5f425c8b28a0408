"""Job networks for real (``aicluster.runtime.jobnet``): namespaces, a bridge, nftables.

Three job namespaces on one bridge: job A's two ranks (two namespaces, as two nodes would give)
and job B's one, plus a "store" namespace the node's egress policy allows. Only private
addresses, only inside namespaces this test makes and on its bridge; every connection attempt is
bounded (``_TIMEOUT_S``) and everything is removed in the fixture's ``finally``. Needs root and
``nft``: skipped without them, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

_TOOLS = ("nft", "nsenter", "setpriv", "unshare", "/usr/bin/python3")
_MISSING = [t for t in _TOOLS if shutil.which(t) is None]
try:
    import pyroute2  # noqa: F401
except ImportError:
    _MISSING.append("pyroute2 (make venv)")
if os.geteuid() != 0 or _MISSING:
    _WHY = "needs root" if os.geteuid() != 0 else f"needs {', '.join(_MISSING)}"
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"test_jobnet {_WHY}: CI must run it")
    pytest.skip(_WHY, allow_module_level=True)

from aicluster.runtime.jobnet import JobNetKey, NodeSubnet, names_for  # noqa: E402
from aicluster.runtime.jobnet.nft import nft  # noqa: E402
from aicluster.runtime.jobnet.node import JobNet, NodeNetConfig, NodeNetwork  # noqa: E402
from aicluster.runtime.jobnet.registry import Entry, Owner  # noqa: E402

PROBE = str(Path(__file__).with_name("netprobe.py"))
_TIMEOUT_S = 0.5  # a dropped SYN: what "unreachable" costs each probe (they run at once)
_NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"


def _host_routes() -> str:
    done = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, timeout=10)
    return done.stdout


def _test_subnet() -> NodeSubnet:
    """A /24 of 10.213.0.0/16 no route of this host touches, and a ULA /64 of its own."""
    routes = _host_routes()
    for offset in range(250):
        third = (os.getpid() + offset) % 250 + 1
        candidate = ipaddress.IPv4Network(f"10.213.{third}.0/24")
        if str(candidate) not in routes and f"10.213.{third}." not in routes:
            return NodeSubnet(candidate, ipaddress.IPv6Network(f"fdac:213:{third:x}::/64"))
    raise RuntimeError("no free 10.213.x.0/24 here")


def _prefix() -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    pid, out = os.getpid(), ""
    for _ in range(4):
        pid, rest = divmod(pid, 36)
        out += digits[rest]
    return "t" + out


@dataclass
class World:
    node: NodeNetwork
    a0: JobNet
    a1: JobNet
    b0: JobNet
    store: JobNet
    gateway_port: int  # a host server at the bridge's addresses, allowed by the policy
    other_port: int  # a host server there too, not allowed
    servers: dict[str, int]  # job namespace name -> its server's port


def _spawn(prefix: Sequence[str], *args: str) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-I", PROBE, "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"probe server did not start: {proc.communicate(timeout=5)[1]}")
    return proc, json.loads(line)


def _enter(net: JobNet) -> list[str]:
    return [_NSENTER, f"--net={net.netns_path}"]


def _connect(net: JobNet, *targets: tuple[object, int]) -> dict[tuple[str, int], str]:
    """Each target's outcome, tried from inside ``net`` at once."""
    argv = [f"{host},{port}" for host, port in targets]
    done = subprocess.run(
        [*_enter(net), sys.executable, "-I", PROBE, "connect", str(_TIMEOUT_S), *argv],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    raw = json.loads(done.stdout)
    return {(str(h), p): raw[f"{h},{p}"] for h, p in targets}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    registry = tmp_path_factory.mktemp("jobnet") / "registry"
    registry.mkdir(mode=0o700)
    subnet = _test_subnet()
    store = subnet.job(0)  # the first namespace made takes index 0
    procs: list[subprocess.Popen[str]] = []
    node: NodeNetwork | None = None
    try:
        # The host's servers listen on every address, the bridge's among them.
        host, (gateway_port, other_port) = _spawn([], "0", "0")
        procs.append(host)
        config = NodeNetConfig(
            subnet,
            gateway_ports=(gateway_port,),
            egress=(
                ipaddress.ip_network(f"{store.ipv4.ip}/32"),
                ipaddress.ip_network(f"{store.ipv6.ip}/128"),
            ),
            prefix=_prefix(),
            registry_dir=registry,
        )
        node = NodeNetwork(config)
        node.prepare()
        store_net = node.create(JobNetKey("store", 0))
        a0 = node.create(JobNetKey("job-a", 0, 0))
        a1 = node.create(JobNetKey("job-a", 0, 1), peers=a0.ips)
        node.add_peers(a0, a1.ips)
        b0 = node.create(JobNetKey("job-b", 0))
        assert store_net.addresses == store
        node.add_peers(store_net, [*a0.ips, *b0.ips])  # the store lets both jobs in
        servers = {}
        for net in (a1, b0, store_net):
            proc, (port,) = _spawn(_enter(net), "0")
            procs.append(proc)
            servers[net.names.netns] = port
        yield World(node, a0, a1, b0, store_net, gateway_port, other_port, servers)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
        if node is not None:
            report = node.teardown()
            assert not node.registry.entries(), report


def test_a_job_reaches_its_own_ranks_and_no_other_job(world: World) -> None:
    a1_port = world.servers[world.a1.names.netns]
    b0_port = world.servers[world.b0.names.netns]
    a1_targets = [(ip, a1_port) for ip in world.a1.ips]
    b0_targets = [(ip, b0_port) for ip in world.b0.ips]
    from_a0 = _connect(world.a0, *a1_targets, *b0_targets)
    assert [from_a0[(str(h), p)] for h, p in a1_targets] == ["open", "open"], from_a0
    # A's egress drops B's addresses, and B's ingress drops A: a dropped SYN, a timeout.
    assert [from_a0[(str(h), p)] for h, p in b0_targets] == ["timeout", "timeout"], from_a0
    from_b0 = _connect(world.b0, *a1_targets)
    assert set(from_b0.values()) == {"timeout"}, from_b0


def test_a_jobs_ingress_holds_even_where_the_others_egress_lets_it_out(world: World) -> None:
    """B's peer sets name A's rank (a launcher's mistake): A's own ingress still drops B."""
    a1_port = world.servers[world.a1.names.netns]
    world.node.add_peers(world.b0, world.a1.ips)
    try:
        outcome = _connect(world.b0, *[(ip, a1_port) for ip in world.a1.ips])
    finally:
        world.node.remove_peers(world.b0, world.a1.ips)
    assert set(outcome.values()) == {"timeout"}, outcome


def test_the_host_is_reachable_only_at_the_gateways_allowed_port(world: World) -> None:
    gw4, gw6 = world.node.config.subnet.gateway4, world.node.config.subnet.gateway6
    for net in (world.a0, world.b0):
        outcome = _connect(
            net,
            (gw4, world.gateway_port),
            (gw6, world.gateway_port),
            (gw4, world.other_port),
            (gw6, world.other_port),
            (gw4, 5432),
            (gw6, 5432),
            ("127.0.0.1", 5432),
            ("::1", 5432),
            ("127.0.0.1", world.gateway_port),
        )
        assert outcome[(str(gw4), world.gateway_port)] == "open", outcome
        assert outcome[(str(gw6), world.gateway_port)] == "open", outcome
        # Dropped by the job's egress rules: the host servers listen on every address.
        for host in (gw4, gw6):
            for port in (world.other_port, 5432):
                assert outcome[(str(host), port)] == "timeout", outcome
        # The namespace's loopback is its own: the host's PostgreSQL and servers are not on it.
        assert outcome[("127.0.0.1", 5432)] == "refused", outcome
        assert outcome[("::1", 5432)] == "refused", outcome
        assert outcome[("127.0.0.1", world.gateway_port)] == "refused", outcome


def test_egress_policy_reaches_a_configured_cidr(world: World) -> None:
    port = world.servers[world.store.names.netns]
    outcome = _connect(world.a0, *[(ip, port) for ip in world.store.ips])
    assert set(outcome.values()) == {"open"}, outcome


def _listening_ports(path: str, prefix: Sequence[str] = ()) -> set[int]:
    done = subprocess.run(
        [*prefix, "cat", f"{path}/tcp", f"{path}/tcp6"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    ports = set()
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_proc_net_shows_only_the_namespaces_own_sockets(world: World) -> None:
    host = _listening_ports("/proc/net")
    assert 5432 in host and world.gateway_port in host  # what there is to hide
    b0 = _listening_ports("/proc/net", _enter(world.b0))
    assert b0 == {world.servers[world.b0.names.netns]}, b0
    a0 = _listening_ports("/proc/net", _enter(world.a0))
    assert a0 == set(), a0  # A0 runs no server: not B's, not the host's, not A1's


# The attacker runs as nobody: an interpreter any uid may run (the venv's may lie under /root).
_SYSTEM_PYTHON = "/usr/bin/python3"
_RAW_SOCKET = "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)"
_USERNS = ["unshare", "--user", "--map-root-user"]


def test_an_unprivileged_process_in_the_namespace_cannot_change_the_rules(world: World) -> None:
    before = nft(world.b0.names.netns, "list", "table", "inet", "aicluster")
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
    refused = "Operation not permitted"
    for attack, why in (
        (["nft", "flush", "ruleset"], refused),
        (["nft", "delete", "table", "inet", "aicluster"], refused),
        # A user namespace of its own gives capabilities over namespaces it owns, not this one.
        ([*_USERNS, "nft", "flush", "ruleset"], refused),
        # Nor raw sockets here (CAP_NET_RAW): no frame with another job's source address.
        ([_SYSTEM_PYTHON, "-c", _RAW_SOCKET], "PermissionError"),
        ([*_USERNS, _SYSTEM_PYTHON, "-c", _RAW_SOCKET], "PermissionError"),
    ):
        done = subprocess.run(
            [*_enter(world.b0), *drop, *attack], capture_output=True, text=True, timeout=10
        )
        assert done.returncode != 0 and why in done.stderr, (attack, done.stderr)
    assert nft(world.b0.names.netns, "list", "table", "inet", "aicluster") == before


def test_sweep_removes_what_a_killed_launcher_left(world: World) -> None:
    """A launcher process makes a job network and is killed (SIGKILL) before deleting it."""
    pid = os.fork()
    if pid == 0:  # the launcher
        try:
            world.node.create(JobNetKey("job-crash", 3))
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    (entry,) = [e for e in world.node.registry.entries() if e.key.job_id == "job-crash"]
    netns = entry.names.netns
    assert Path(f"/run/netns/{netns}").exists()
    assert "aicluster" in nft(netns, "list", "tables")
    assert Path(f"/sys/class/net/{entry.names.host_link}").exists()

    report = world.node.sweep()  # what a launcher's start-up runs

    assert report.entries == ["job-crash/3/0"], report
    assert not Path(f"/run/netns/{netns}").exists()
    assert not Path(f"/sys/class/net/{entry.names.host_link}").exists()
    assert all(e.key.job_id != "job-crash" for e in world.node.registry.entries())
    # The live launcher's (this process's) networks are untouched.
    assert {e.key.job_id for e in world.node.registry.entries()} == {"store", "job-a", "job-b"}


def test_sweep_removes_namespaces_and_links_of_its_prefix_that_no_entry_names(
    world: World,
) -> None:
    """A registry lost with its directory: the kernel objects' names still give them away."""
    prefix = world.node.config.prefix
    orphan = names_for(JobNetKey("job-orphan", 0), prefix)
    subprocess.run(["ip", "netns", "add", orphan.netns], check=True, timeout=10)
    subprocess.run(
        ["ip", "link", "add", orphan.host_link, "type", "bridge"], check=True, timeout=10
    )
    report = world.node.sweep()
    assert report.namespaces == [orphan.netns] and report.links == [orphan.host_link], report
    assert not Path(f"/run/netns/{orphan.netns}").exists()
    assert not Path(f"/sys/class/net/{orphan.host_link}").exists()


def test_a_hash_collision_takes_the_next_salt(world: World) -> None:
    """Another key's entry already holds ``key``'s names: ``key`` gets salted, distinct names."""
    prefix = world.node.config.prefix
    key = JobNetKey("job-collide", 0)
    squatter = Entry(JobNetKey("job-other", 0), names_for(key, prefix), 200, Owner.me())
    world.node.registry.write(squatter)
    try:
        net = world.node.create(key)
        try:
            assert net.names == names_for(key, prefix, salt=1)
            assert Path(net.netns_path).exists()
        finally:
            world.node.delete(net)
    finally:
        world.node.registry.remove(squatter)
