"""A node's job networks: make one per job namespace, fill its peers, delete it, sweep leftovers.

The order keeps every kernel object findable: the registry entry is written first (under the
registry's lock, which also picks the address), then the namespace, veth pair and firewall are
made; deletion removes the kernel objects first and the entry last. A launcher that crashed
anywhere in between leaves an entry whose owner is dead, and :meth:`NodeNetwork.sweep` (run at
start-up by :meth:`NodeNetwork.prepare`) removes what it names. Namespaces and host links named
by this node's prefix but by no entry (a registry lost with its directory) go too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from aicluster.runtime.jobnet import kernel
from aicluster.runtime.jobnet.addressing import JobAddresses, NodeSubnet, free_index
from aicluster.runtime.jobnet.firewall import (
    TABLE,
    Address,
    FirewallPolicy,
    Network,
    peer_elements,
    ruleset,
)
from aicluster.runtime.jobnet.naming import JobNetKey, JobNetNames, names_for, valid_prefix
from aicluster.runtime.jobnet.nft import NftError, nft
from aicluster.runtime.jobnet.nsthread import netns_path
from aicluster.runtime.jobnet.registry import Entry, Owner, Registry

__all__ = ["DEFAULT_REGISTRY", "JobNet", "NodeNetConfig", "NodeNetwork", "SweepReport"]

DEFAULT_REGISTRY = Path("/run/aicluster/jobnet")  # /run: gone at reboot, like the namespaces
_MAX_SALT = 16


@dataclass(frozen=True)
class NodeNetConfig:
    """One node's job networks: its ``subnet``, what jobs may reach beyond their ranks
    (``gateway_ports`` on the bridge's addresses, ``egress`` CIDRs), the ``prefix`` of every
    name it makes, where its registry lives, and the MTU (None: the uplink's)."""

    subnet: NodeSubnet
    gateway_ports: tuple[int, ...] = ()
    egress: tuple[Network, ...] = ()
    prefix: str = "aicj"
    registry_dir: Path = DEFAULT_REGISTRY
    mtu: int | None = None

    def __post_init__(self) -> None:
        if not valid_prefix(self.prefix):
            raise ValueError(f"prefix {self.prefix!r}: a lower-case letter, then up to 4 more")
        if self.mtu is not None and not 1280 <= self.mtu <= 65535:
            raise ValueError(f"MTU {self.mtu}: IPv6 needs at least 1280")

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def policy(self) -> FirewallPolicy:
        return FirewallPolicy(
            self.subnet.gateway4, self.subnet.gateway6, self.gateway_ports, self.egress
        )


@dataclass(frozen=True)
class JobNet:
    """One job namespace made: ``netns_path`` is what a launcher enters (setns, nsenter)."""

    key: JobNetKey
    names: JobNetNames
    addresses: JobAddresses

    @property
    def netns_path(self) -> str:
        return netns_path(self.names.netns)

    @property
    def ips(self) -> tuple[Address, Address]:
        return self.addresses.ipv4.ip, self.addresses.ipv6.ip


@dataclass
class SweepReport:
    """What a sweep removed (names)."""

    entries: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)


class NodeNetwork:
    """The job networks of this node, made and removed by this (root) process."""

    def __init__(self, config: NodeNetConfig) -> None:
        if os.geteuid() != 0:
            raise PermissionError("job networks need root (CAP_NET_ADMIN, mounts under /run)")
        self.config = config
        self.registry = Registry(config.registry_dir)
        self.mtu = config.mtu or kernel.uplink_mtu()

    def prepare(self) -> SweepReport:
        """Start-up: remove what a dead launcher left, then make sure the bridge is there."""
        report = self.sweep()
        kernel.ensure_bridge(self.config.bridge, self.config.subnet, self.mtu)
        return report

    def create(self, key: JobNetKey, peers: Iterable[Address] = ()) -> JobNet:
        """``key``'s namespace with its address, routes and firewall (``peers`` already in its
        peer sets). An error if ``key`` has one already."""
        with self.registry.locked():
            entries = self.registry.entries()
            if any(e.key == key for e in entries):
                raise FileExistsError(f"job network {key.label()} exists")
            taken = {e.names.netns for e in entries}
            names = next(
                (
                    n
                    for n in (names_for(key, self.config.prefix, s) for s in range(_MAX_SALT))
                    if n.netns not in taken and not os.path.exists(netns_path(n.netns))
                ),
                None,
            )
            if names is None:
                raise RuntimeError(f"no free name for {key.label()}")
            used = {e.index for e in entries}
            index = free_index(used, self.config.subnet.capacity)
            entry = Entry(key, names, index, Owner.me())
            self.registry.write(entry)
        net = JobNet(key, names, self.config.subnet.job(index))
        try:
            rules = ruleset(self.config.policy, list(peers))
            kernel.make_job_net(
                names, self.config.bridge, self.config.subnet, net.addresses, self.mtu, rules
            )
        except BaseException:
            self._remove(entry)
            raise
        return net

    def add_peers(self, net: JobNet, peers: Iterable[Address]) -> None:
        """Let ``net`` and ``peers`` (the same job's ranks) reach each other, from its side."""
        text = peer_elements(peers)
        if text:
            nft(net.names.netns, text=text)

    def remove_peers(self, net: JobNet, peers: Iterable[Address]) -> None:
        text = peer_elements(peers, add=False)
        if text:
            nft(net.names.netns, text=text)

    def delete(self, net: JobNet) -> None:
        """``net``'s veth pair and namespace (with its rules), then its registry entry."""
        kernel.delete_job_net(net.names)
        entry = self.registry.find(net.key)
        if entry is not None:
            self.registry.remove(entry)

    def _remove(self, entry: Entry) -> None:
        kernel.delete_job_net(entry.names)
        self.registry.remove(entry)

    def sweep(self, *, everything: bool = False) -> SweepReport:
        """Remove the networks of entries whose owner is dead (every entry: ``everything``),
        then namespaces and host links of this prefix that no live entry names."""
        report = SweepReport()
        with self.registry.locked():
            live: set[str] = set()
            for entry in self.registry.entries():
                if not everything and entry.owner.alive():
                    live |= {entry.names.netns, entry.names.host_link}
                    continue
                if os.path.exists(netns_path(entry.names.netns)):
                    # A process the crashed launcher started may still hold the namespace
                    # (it outlives its name): it keeps no rule either.
                    with contextlib.suppress(NftError):
                        nft(entry.names.netns, "delete", "table", *TABLE.split())
                    report.namespaces.append(entry.names.netns)
                self._remove(entry)
                report.entries.append(entry.key.label())
            for name in kernel.netns_names(self.config.prefix):
                if name not in live:
                    kernel.delete_netns(name)
                    report.namespaces.append(name)
            for link in kernel.host_links(self.config.prefix):
                if link not in live:
                    kernel.delete_link(link)
                    report.links.append(link)
        return report

    def teardown(self) -> SweepReport:
        """Every job network of this registry and the bridge (a node leaving; the tests)."""
        report = self.sweep(everything=True)
        kernel.remove_bridge(self.config.bridge)
        return report
