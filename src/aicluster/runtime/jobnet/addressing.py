"""A node's job subnet: private IPv4 and a unique-local IPv6 prefix on the node's bridge.

The bridge holds each subnet's first address: the gateway, where the control plane's gateway
listens and the jobs' default route points. Job namespaces take the following addresses, one of
each family per namespace at the same offset (``index``), so a job's IPv4 and IPv6 addresses
name each other. Only private ranges are accepted (RFC 1918 for IPv4, fc00::/7 for IPv6): a job
network never takes an address that could be someone else's on the internet.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from dataclasses import dataclass
from ipaddress import (
    IPv4Address,
    IPv4Interface,
    IPv4Network,
    IPv6Address,
    IPv6Interface,
    IPv6Network,
)

__all__ = ["JobAddresses", "NodeSubnet", "carve", "free_index"]

_PRIVATE4 = tuple(
    ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)
_ULA = ipaddress.IPv6Network("fc00::/7")
_FIRST_JOB = 2  # 0: the network, 1: the gateway (the bridge)


@dataclass(frozen=True)
class JobAddresses:
    """A job namespace's addresses, with their prefix lengths (the node's subnet)."""

    ipv4: IPv4Interface
    ipv6: IPv6Interface


@dataclass(frozen=True)
class NodeSubnet:
    """The job subnets of one node: ``ipv4`` (RFC 1918, at most /30) and ``ipv6`` (fc00::/7)."""

    ipv4: IPv4Network
    ipv6: IPv6Network

    def __post_init__(self) -> None:
        if not any(self.ipv4.subnet_of(p) for p in _PRIVATE4):
            raise ValueError(
                f"{self.ipv4} is not a private IPv4 range (10/8, 172.16/12, 192.168/16)"
            )
        if not self.ipv6.subnet_of(_ULA):
            raise ValueError(f"{self.ipv6} is not a unique-local IPv6 prefix (fc00::/7)")
        if self.ipv4.prefixlen > 30 or self.ipv6.prefixlen > 126:
            raise ValueError(f"{self.ipv4}, {self.ipv6}: too small for a gateway and one job")

    @classmethod
    def parse(cls, ipv4: str, ipv6: str) -> NodeSubnet:
        return cls(ipaddress.IPv4Network(ipv4), ipaddress.IPv6Network(ipv6))

    @property
    def gateway4(self) -> IPv4Address:
        return self.ipv4[1]

    @property
    def gateway6(self) -> IPv6Address:
        return self.ipv6[1]

    @property
    def capacity(self) -> int:
        """How many job namespaces the node's subnets hold (the smaller family bounds it)."""
        usable4 = self.ipv4.num_addresses - _FIRST_JOB - 1  # less the broadcast address
        usable6 = self.ipv6.num_addresses - _FIRST_JOB
        return min(usable4, usable6)

    def job(self, index: int) -> JobAddresses:
        """The addresses of the namespace at ``index`` (0 ≤ index < :attr:`capacity`)."""
        if not 0 <= index < self.capacity:
            raise ValueError(f"index {index} outside 0..{self.capacity - 1}")
        return JobAddresses(
            IPv4Interface((self.ipv4[_FIRST_JOB + index], self.ipv4.prefixlen)),
            IPv6Interface((self.ipv6[_FIRST_JOB + index], self.ipv6.prefixlen)),
        )


def free_index(used: Collection[int], capacity: int) -> int:
    """The lowest index not in ``used``; an error once the node's subnet is full."""
    for index in range(capacity):
        if index not in used:
            return index
    raise RuntimeError(f"the node's job subnet is full ({capacity} namespaces)")


def carve(
    base4: str, base6: str, node_index: int, prefix4: int = 24, prefix6: int = 64
) -> NodeSubnet:
    """Node ``node_index``'s subnets out of cluster-wide ranges: its ``prefix4`` of ``base4``
    and its ``prefix6`` of ``base6`` (distinct per node, so routes between nodes can name them)."""
    net4 = ipaddress.IPv4Network(base4)
    net6 = ipaddress.IPv6Network(base6)
    count = min(2 ** (prefix4 - net4.prefixlen), 2 ** (prefix6 - net6.prefixlen))
    if not 0 <= node_index < count:
        raise ValueError(f"node index {node_index} outside 0..{count - 1} for {base4}, {base6}")
    sub4 = IPv4Network((int(net4.network_address) + node_index * 2 ** (32 - prefix4), prefix4))
    sub6 = IPv6Network((int(net6.network_address) + node_index * 2 ** (128 - prefix6), prefix6))
    return NodeSubnet(sub4, sub6)
