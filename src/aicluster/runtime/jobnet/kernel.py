"""The kernel objects of job networks, through netlink (pyroute2): the node's bridge, a job's
namespace and veth pair, addresses, routes, MTU.

Every call here needs CAP_NET_ADMIN in the host's namespace (root, the launcher). IPv6 addresses
are added without duplicate address detection (``IFA_F_NODAD``): the node's registry already
makes them unique on the bridge, and detection would hold each new address for a second or more
before anything could use it.
"""

from __future__ import annotations

import contextlib
import os
import re

from pyroute2 import IPRoute, NetlinkError
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_NODAD

from aicluster.runtime.jobnet.addressing import JobAddresses, NodeSubnet
from aicluster.runtime.jobnet.naming import JOB_IFNAME, TOKEN_PATTERN, JobNetNames
from aicluster.runtime.jobnet.nft import nft_here
from aicluster.runtime.jobnet.nsthread import NETNS_DIR, in_new_netns, remove_netns

__all__ = [
    "DEFAULT_MTU",
    "delete_job_net",
    "delete_link",
    "delete_netns",
    "ensure_bridge",
    "host_links",
    "make_job_net",
    "netns_names",
    "remove_bridge",
    "uplink_mtu",
]

DEFAULT_MTU = 1500
_AF_INET6 = 10


def uplink_mtu() -> int:
    """The MTU of the interface of this host's default IPv4 route (1500 without one): what a
    job's packets cross on their way off the node."""
    with IPRoute() as ipr:
        for route in ipr.get_default_routes(family=2):
            index = route.get_attr("RTA_OIF")
            if index is not None:
                return int(ipr.link("get", index=index)[0].get_attr("IFLA_MTU"))
    return DEFAULT_MTU


def _index(ipr: IPRoute, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return int(found[0]) if found else None


def ensure_bridge(name: str, subnet: NodeSubnet, mtu: int) -> None:
    """The node's bridge with the gateway addresses, up (made if missing; kept if there)."""
    with IPRoute() as ipr:
        index = _index(ipr, name)
        if index is None:
            ipr.link("add", ifname=name, kind="bridge")
            index = _index(ipr, name)
        have = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=index)}
        if str(subnet.gateway4) not in have:
            ipr.addr(
                "add", index=index, address=str(subnet.gateway4), prefixlen=subnet.ipv4.prefixlen
            )
        if str(subnet.gateway6) not in have:
            ipr.addr(
                "add",
                index=index,
                address=str(subnet.gateway6),
                prefixlen=subnet.ipv6.prefixlen,
                flags=IFA_F_NODAD,
            )
        ipr.link("set", index=index, state="up", mtu=mtu)


def remove_bridge(name: str) -> None:
    with IPRoute() as ipr, contextlib.suppress(NetlinkError):
        ipr.link("del", ifname=name)


def make_job_net(
    names: JobNetNames,
    bridge: str,
    subnet: NodeSubnet,
    addresses: JobAddresses,
    mtu: int,
    rules: str,
) -> None:
    """A namespace with loopback up, ``JOB_IFNAME`` holding ``addresses``, a default route to
    the gateway per family and the firewall ``rules`` (``nft -f`` text, loaded first); its veth
    peer on the host is a port of ``bridge``, up last. All inside work runs in one thread in the
    new namespace."""
    with IPRoute() as ipr:
        bridge_index = _index(ipr, bridge)
    if bridge_index is None:
        raise RuntimeError(f"no bridge {bridge}: ensure_bridge first")
    host_ns = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)  # the process's: the host's

    def inside() -> None:
        nft_here(rules)  # before any interface: no moment without the firewall
        with IPRoute() as ipr:
            ipr.link("set", ifname="lo", state="up")
            ipr.link(
                "add",
                ifname=JOB_IFNAME,
                kind="veth",
                peer={"ifname": names.host_link, "net_ns_fd": host_ns},
            )
            index = _index(ipr, JOB_IFNAME)
            ipr.addr(
                "add", index=index, address=str(addresses.ipv4.ip), prefixlen=subnet.ipv4.prefixlen
            )
            ipr.addr(
                "add",
                index=index,
                address=str(addresses.ipv6.ip),
                prefixlen=subnet.ipv6.prefixlen,
                flags=IFA_F_NODAD,
            )
            ipr.link("set", index=index, mtu=mtu, state="up")
            ipr.route("add", dst="default", gateway=str(subnet.gateway4))
            ipr.route("add", dst="default", gateway=str(subnet.gateway6), family=_AF_INET6)

    try:
        in_new_netns(names.netns, inside)
    finally:
        os.close(host_ns)
    with IPRoute() as ipr:
        ipr.link("set", ifname=names.host_link, master=bridge_index, mtu=mtu, state="up")


def delete_job_net(names: JobNetNames) -> None:
    """The veth pair, then the namespace; either may be gone already. The host end goes first:
    the kernel frees a namespace later, and its veth would outlive the name for a while."""
    delete_link(names.host_link)
    delete_netns(names.netns)


def delete_link(name: str) -> None:
    """A host interface (a veth's end: deleting it deletes its peer), if there."""
    if not name:
        raise ValueError("no interface name")
    with IPRoute() as ipr, contextlib.suppress(NetlinkError):
        ipr.link("del", ifname=name)


def delete_netns(name: str) -> None:
    """A named namespace (its mount under /run/netns), if there."""
    remove_netns(name)


def netns_names(prefix: str) -> list[str]:
    """The namespaces under /run/netns named as :func:`.naming.names_for` names them."""
    pattern = re.compile(rf"^{re.escape(prefix)}-{TOKEN_PATTERN}$")
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if pattern.match(n))
    except FileNotFoundError:
        return []


def host_links(prefix: str) -> list[str]:
    """The host's interfaces named as :func:`.naming.names_for` names a veth's host end."""
    pattern = re.compile(rf"^{re.escape(prefix)}{TOKEN_PATTERN}$")
    with IPRoute() as ipr:
        names = [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()]
    return sorted(n for n in names if pattern.match(n))
