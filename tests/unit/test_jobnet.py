"""The pure parts of job networks: names, addresses, the firewall's text, the registry's files.
(The kernel side: tests/integration/test_jobnet.py.)"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aicluster.runtime.jobnet.addressing import NodeSubnet, carve, free_index
from aicluster.runtime.jobnet.firewall import FirewallPolicy, peer_elements, ruleset
from aicluster.runtime.jobnet.naming import JobNetKey, names_for, valid_prefix
from aicluster.runtime.jobnet.registry import Entry, Owner, Registry


def test_names_are_deterministic_short_and_distinct() -> None:
    key = JobNetKey("a-job-id-far-longer-than-any-interface-name", 7)
    assert names_for(key, "aicj") == names_for(key, "aicj")
    names = names_for(key, "aicj")
    assert len(names.host_link) <= 15 and names.netns.startswith("aicj-")
    keys = [JobNetKey(f"job-{i}", a, m) for i in range(300) for a in range(3) for m in range(2)]
    assert len({names_for(k, "aicj").host_link for k in keys}) == len(keys)
    # Attempt and member change the names; a salt (after a collision) does too.
    assert names_for(JobNetKey("j", 0), "aicj") != names_for(JobNetKey("j", 1), "aicj")
    assert names_for(JobNetKey("j", 0), "aicj") != names_for(JobNetKey("j", 0, 1), "aicj")
    assert names_for(key, "aicj", 1) != names


@pytest.mark.parametrize("prefix", ["", "Aic", "aicjob", "a-b", "1ab", "a/b"])
def test_a_prefix_that_could_overflow_or_escape_a_name_is_refused(prefix: str) -> None:
    assert not valid_prefix(prefix)
    with pytest.raises(ValueError):
        names_for(JobNetKey("j", 0), prefix)


def test_a_key_needs_a_job_and_non_negative_counts() -> None:
    with pytest.raises(ValueError):
        JobNetKey("", 0)
    with pytest.raises(ValueError):
        JobNetKey("j", -1)


def test_addresses_follow_the_gateway_one_per_index_in_both_families() -> None:
    subnet = NodeSubnet.parse("10.213.4.0/24", "fdac:213:4::/64")
    assert str(subnet.gateway4) == "10.213.4.1" and str(subnet.gateway6) == "fdac:213:4::1"
    assert str(subnet.job(0).ipv4) == "10.213.4.2/24"
    assert str(subnet.job(0).ipv6) == "fdac:213:4::2/64"
    assert str(subnet.job(252).ipv4) == "10.213.4.254/24"  # .255 is the broadcast address
    assert subnet.capacity == 253
    with pytest.raises(ValueError):
        subnet.job(253)
    assert free_index({0, 1, 3}, 5) == 2
    with pytest.raises(RuntimeError, match="full"):
        free_index({0, 1}, 2)


@pytest.mark.parametrize(
    ("ipv4", "ipv6"),
    [
        ("8.8.8.0/24", "fdac::/64"),  # public IPv4
        ("127.0.0.0/24", "fdac::/64"),  # loopback
        ("169.254.0.0/24", "fdac::/64"),  # link-local
        ("10.0.0.0/24", "2001:db8::/64"),  # not a unique-local prefix
        ("10.0.0.0/24", "fe80::/64"),
        ("10.0.0.0/31", "fdac::/64"),  # no room for a gateway and a job
    ],
)
def test_only_private_ranges_are_accepted(ipv4: str, ipv6: str) -> None:
    with pytest.raises(ValueError):
        NodeSubnet.parse(ipv4, ipv6)


def test_carve_gives_each_node_its_own_subnets() -> None:
    subnets = [carve("10.213.0.0/16", "fdac:213::/48", i) for i in range(256)]
    assert str(subnets[0].ipv4) == "10.213.0.0/24" and str(subnets[5].ipv6) == "fdac:213:0:5::/64"
    assert len({s.ipv4 for s in subnets}) == 256 and len({s.ipv6 for s in subnets}) == 256
    with pytest.raises(ValueError):
        carve("10.213.0.0/16", "fdac:213::/48", 256)


def _policy() -> FirewallPolicy:
    return FirewallPolicy(
        ipaddress.IPv4Address("10.213.4.1"),
        ipaddress.IPv6Address("fdac:213:4::1"),
        gateway_ports=(8443, 9000),
        egress=(ipaddress.ip_network("10.99.0.0/16"), ipaddress.ip_network("fd12::/64")),
    )


def test_the_ruleset_drops_by_default_and_allows_only_what_the_policy_names() -> None:
    peers = [ipaddress.ip_address("10.213.4.3"), ipaddress.ip_address("fdac:213:4::3")]
    text = ruleset(_policy(), peers)
    lines = [line.strip() for line in text.splitlines()]
    # Replaced in one transaction: the table is declared, deleted and made anew.
    assert lines[:3] == [
        "table inet aicluster {}",
        "delete table inet aicluster",
        "table inet aicluster {",
    ]
    assert "type filter hook input priority filter; policy drop;" in lines
    assert "type filter hook output priority filter; policy drop;" in lines
    assert "type filter hook forward priority filter; policy drop;" in lines
    assert "elements = { 10.213.4.3 };" in lines and "elements = { fdac:213:4::3 };" in lines
    assert "elements = { 8443, 9000 };" in lines
    assert "elements = { 10.99.0.0/16 };" in lines and "elements = { fd12::/64 };" in lines
    assert "ip daddr 10.213.4.1 tcp dport @gateway_ports accept" in lines
    assert "ip6 daddr fdac:213:4::1 tcp dport @gateway_ports accept" in lines
    accepts = [line for line in lines if line.endswith("accept")]
    # Every accept names a set, the gateway, loopback, replies or neighbour discovery.
    for line in accepts:
        assert any(
            part in line
            for part in ("@", "10.213.4.1", "fdac:213:4::1", '"lo"', "ct state", "nd-neighbor")
        ), line


def test_an_empty_policy_still_makes_every_set() -> None:
    text = ruleset(
        FirewallPolicy(ipaddress.IPv4Address("10.0.0.1"), ipaddress.IPv6Address("fd00::1"))
    )
    for name in ("peers4", "peers6", "egress4", "egress6", "gateway_ports"):
        assert f"set {name} {{" in text
    assert "elements" not in text


def test_peer_elements_split_the_families() -> None:
    peers = [ipaddress.ip_address("10.0.0.3"), ipaddress.ip_address("fd00::3")]
    assert peer_elements(peers) == (
        "add element inet aicluster peers4 { 10.0.0.3 }\n"
        "add element inet aicluster peers6 { fd00::3 }\n"
    )
    assert peer_elements(peers[:1], add=False).startswith("delete element")
    assert peer_elements([]) == ""


def test_a_gateway_port_outside_the_range_is_refused() -> None:
    with pytest.raises(ValueError):
        FirewallPolicy(ipaddress.IPv4Address("10.0.0.1"), ipaddress.IPv6Address("fd00::1"), (0,))


def test_the_registry_is_private_and_round_trips_entries(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "reg")
    assert (tmp_path / "reg").stat().st_mode & 0o777 == 0o700
    key = JobNetKey("job-a", 2, 1)
    entry = Entry(key, names_for(key, "aicj"), 4, Owner.me())
    with registry.locked():
        registry.write(entry)
    assert registry.entries() == [entry] and registry.find(key) == entry
    assert (tmp_path / "reg" / f"{entry.names.netns}.json").stat().st_mode & 0o777 == 0o600
    registry.remove(entry)
    assert registry.entries() == []


def test_a_registry_others_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError):
        Registry(shared)


def test_a_dead_owner_is_told_from_a_live_one() -> None:
    assert Owner.me().alive()
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = Owner(done.pid, 0)
    done.wait()
    assert not dead.alive()
    assert not Owner(os.getpid(), Owner.me().start + 1).alive()  # a reused pid
