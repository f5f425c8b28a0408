"""A network of its own for each job on a node: the building block of issue 32 item 2.

**Rank launches do not use it yet.** Ranks still share the host's network namespace
(``runtime/sandbox/bwrap.py`` has no ``--unshare-net``); wiring this into the launcher, routes
between nodes' job subnets, the control plane's gateway, and ``aicluster up``'s refusal where the
kernel cannot do it come later (``docs/runtime.md``, "Job networks").

For a job on a node, :class:`.node.NodeNetwork` makes a network namespace
(``/run/netns/<prefix>-<hash>``) with an address of its own from the node's private job subnet
(IPv4 in RFC 1918 space, IPv6 in fc00::/7, :mod:`.addressing`), joined by a veth pair to the
node's bridge, whose addresses are the gateway and the default route; loopback up; the uplink's
MTU. Inside it a firewall (nftables, table ``inet aicluster``, :mod:`.firewall`) lets the job
reach only its own ranks (peer sets the launcher fills as ranks come up), the gateway's allowed
ports and the configured CIDRs, and lets in only its ranks and the gateway. The job's processes
run as an unprivileged uid and never hold CAP_NET_ADMIN in that namespace (it belongs to the
host's user namespace), so they cannot change or remove the rules. Names are a hash of job id,
attempt and member (:mod:`.naming`); a root-only registry (:mod:`.registry`) records every
namespace before it is made, so :meth:`.node.NodeNetwork.sweep` finds and removes what a crashed
launcher left behind.

Needs root, pyroute2 (netlink) and libnftables (Debian's nftables, ``make sandbox``); no child
process: a thread enters the namespace (:mod:`.nsthread`). RDMA/InfiniBand traffic bypasses
namespaces: partition keys isolate it, not this. This package's top level holds the pure parts
(names, addresses, rules); :mod:`.node` (which imports pyroute2) the kernel's.
"""

from aicluster.runtime.jobnet.addressing import JobAddresses, NodeSubnet, carve
from aicluster.runtime.jobnet.firewall import FirewallPolicy
from aicluster.runtime.jobnet.naming import JOB_IFNAME, JobNetKey, JobNetNames, names_for

__all__ = [
    "JOB_IFNAME",
    "FirewallPolicy",
    "JobAddresses",
    "JobNetKey",
    "JobNetNames",
    "NodeSubnet",
    "carve",
    "names_for",
]
