"""Time to make and delete one job's network on this node (``aicluster.runtime.jobnet``).

Each round makes a job namespace (registry entry, namespace, veth pair into the bridge,
addresses, routes, the nftables table), adds one peer pair to its sets (what a launcher does as
a job's other rank comes up) and deletes it again. Also the same with ``--jobs`` namespaces
alive beside it (a busy node), and what one nftables command in a namespace costs. Prints
figures, no assertions; needs root, pyroute2 and libnftables.
``python bench/jobnet_setup.py [--rounds 30] [--jobs 20]``. Target: under 0.3 s per job and node.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from aicluster.runtime.jobnet import JobNetKey, NodeSubnet
from aicluster.runtime.jobnet.nft import nft
from aicluster.runtime.jobnet.node import JobNet, NodeNetConfig, NodeNetwork


def _free_subnet() -> NodeSubnet:
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    third = next(n for n in range(251, 0, -1) if f"10.213.{n}." not in routes)
    return NodeSubnet(
        ipaddress.IPv4Network(f"10.213.{third}.0/24"),
        ipaddress.IPv6Network(f"fdac:213:b{third:02x}::/64"),
    )


def _figures(name: str, seconds: list[float]) -> None:
    ms = sorted(s * 1000 for s in seconds)
    p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
    print(
        f"  {name:<28} median {statistics.median(ms):6.1f} ms   p90 {p90:6.1f} ms   "
        f"max {ms[-1]:6.1f} ms   (n={len(ms)})"
    )


def _timed(action: Callable[[], object]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def _rounds(node: NodeNetwork, rounds: int, peer: JobNet) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"create": [], "add peers": [], "delete": [], "total": []}
    for i in range(rounds):
        t0 = time.perf_counter()
        net = node.create(JobNetKey("bench-job", i))
        t1 = time.perf_counter()
        node.add_peers(net, peer.ips)
        t2 = time.perf_counter()
        node.delete(net)
        t3 = time.perf_counter()
        for name, value in (("create", t1 - t0), ("add peers", t2 - t1), ("delete", t3 - t2)):
            times[name].append(value)
        times["total"].append(t3 - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=20, help="namespaces alive beside it")
    options = parser.parse_args()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as scratch:
        registry = Path(scratch) / "registry"
        registry.mkdir(mode=0o700)
        config = NodeNetConfig(
            _free_subnet(), gateway_ports=(8443,), prefix="bnch", registry_dir=registry
        )
        node = NodeNetwork(config)
        try:
            prepare = _timed(node.prepare)
            print(
                f"node: bridge {config.bridge}, {config.subnet.ipv4} {config.subnet.ipv6}, "
                f"MTU {node.mtu}; prepare (sweep, bridge) {prepare * 1000:.1f} ms"
            )
            peer = node.create(JobNetKey("bench-peer", 0))
            nft_run = [_timed(lambda: nft(peer.names.netns, "list", "tables")) for _ in range(20)]
            print("one nftables command in a namespace (a thread enters it, libnftables):")
            _figures("nft list tables", nft_run)
            for label, extra in (("an idle node", 0), (f"{options.jobs} jobs alive", options.jobs)):
                for j in range(extra):
                    node.create(JobNetKey(f"bench-busy-{j}", 0))
                print(f"one job network, {label}:")
                for name, values in _rounds(node, options.rounds, peer).items():
                    _figures(name, values)
            teardown = _timed(node.teardown)
            print(f"teardown of {options.jobs + 1} namespaces and the bridge: {teardown:.2f} s")
        finally:
            node.teardown()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
