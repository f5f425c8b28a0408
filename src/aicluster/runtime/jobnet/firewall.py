"""The firewall inside a job's namespace, as ``nft -f`` text: table ``inet aicluster``.

One table for IPv4 and IPv6 alike (the ``inet`` family). Both hooks drop by default:

- egress (``output``): to the same job's ranks (sets ``peers4``/``peers6``, filled by the
  launcher as ranks come up), to the gateway on its allowed TCP ports (``gateway_ports``), and to
  the configured CIDRs (``egress4``/``egress6``: an object store, a package mirror);
- ingress (``input``): from the same job's ranks and from the gateway (which may open
  connections into a job, a notebook's for one);
- replies of allowed connections, the namespace's own loopback, and IPv6 neighbour discovery
  (without it no IPv6 address on the link resolves); nothing is forwarded.

The host's loopback is not reachable from a job namespace at all: the namespace has a loopback
of its own. The rules are the kernel's, in a namespace the job's processes hold no
CAP_NET_ADMIN in (they run as an unprivileged uid; a user namespace of their own gives them
capabilities over namespaces it owns, not this one), so they can neither read nor change them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

__all__ = ["TABLE", "FirewallPolicy", "peer_elements", "ruleset"]

TABLE = "inet aicluster"
Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network
_ND_TYPES = "{ nd-neighbor-solicit, nd-neighbor-advert }"


@dataclass(frozen=True)
class FirewallPolicy:
    """What a job namespace may reach beyond its ranks: the gateway's ``gateway_ports`` (TCP)
    and ``egress`` CIDRs."""

    gateway4: IPv4Address
    gateway6: IPv6Address
    gateway_ports: tuple[int, ...] = ()
    egress: tuple[Network, ...] = field(default=())

    def __post_init__(self) -> None:
        for port in self.gateway_ports:
            if not 0 < port < 65536:
                raise ValueError(f"gateway port {port} outside 1..65535")


def _elements(items: Iterable[object]) -> str:
    return ", ".join(str(item) for item in items)


def _set(name: str, kind: str, items: Sequence[object], *, interval: bool = False) -> list[str]:
    lines = [f"  set {name} {{", f"    type {kind};"]
    if interval:
        lines.append("    flags interval;")
    if items:
        lines.append(f"    elements = {{ {_elements(items)} }};")
    return [*lines, "  }"]


def ruleset(policy: FirewallPolicy, peers: Sequence[Address] = ()) -> str:
    """The table, replacing any earlier one in one transaction (``nft -f`` applies a file
    atomically: no moment without rules)."""
    egress4 = [n for n in policy.egress if isinstance(n, IPv4Network)]
    egress6 = [n for n in policy.egress if isinstance(n, IPv6Network)]
    gw4, gw6 = policy.gateway4, policy.gateway6
    lines = [
        f"table {TABLE} {{}}",  # so that the delete below never fails on a fresh namespace
        f"delete table {TABLE}",
        f"table {TABLE} {{",
        *_set("peers4", "ipv4_addr", [p for p in peers if isinstance(p, IPv4Address)]),
        *_set("peers6", "ipv6_addr", [p for p in peers if isinstance(p, IPv6Address)]),
        *_set("egress4", "ipv4_addr", egress4, interval=True),
        *_set("egress6", "ipv6_addr", egress6, interval=True),
        *_set("gateway_ports", "inet_service", list(policy.gateway_ports)),
        "  chain input {",
        "    type filter hook input priority filter; policy drop;",
        '    iif "lo" accept',
        "    ct state invalid drop",
        "    ct state established,related accept",
        f"    icmpv6 type {_ND_TYPES} accept",
        f"    ip saddr {gw4} accept",
        f"    ip6 saddr {gw6} accept",
        "    ip saddr @peers4 accept",
        "    ip6 saddr @peers6 accept",
        "  }",
        "  chain output {",
        "    type filter hook output priority filter; policy drop;",
        '    oif "lo" accept',
        "    ct state invalid drop",
        "    ct state established,related accept",
        f"    icmpv6 type {_ND_TYPES} accept",
        "    ip daddr @peers4 accept",
        "    ip6 daddr @peers6 accept",
        f"    ip daddr {gw4} tcp dport @gateway_ports accept",
        f"    ip6 daddr {gw6} tcp dport @gateway_ports accept",
        "    ip daddr @egress4 accept",
        "    ip6 daddr @egress6 accept",
        "  }",
        "  chain forward {",
        "    type filter hook forward priority filter; policy drop;",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def peer_elements(peers: Iterable[Address], *, add: bool = True) -> str:
    """``nft -f`` text adding (or deleting) ranks' addresses to the peer sets."""
    verb = "add" if add else "delete"
    peers = list(peers)
    lines = []
    for name, kind in (("peers4", IPv4Address), ("peers6", IPv6Address)):
        chosen = [p for p in peers if isinstance(p, kind)]
        if chosen:
            lines.append(f"{verb} element {TABLE} {name} {{ {_elements(chosen)} }}")
    return "\n".join(lines) + ("\n" if lines else "")
