"""The embedded default: a multi-node Ray cluster on this machine, one raylet per aicluster node.

Each node of a topology (a :class:`~aicluster.core.Cluster`) becomes a Ray node bound to
127.0.0.1, labelled with its place in the topology and declaring its GPUs (simulated ones on a
machine without GPUs). Two ways to run it:

* in-process (:class:`EmbeddedCluster`), for tests and scripts: lives as long as its process;
* detached (:func:`start_detached` / :func:`stop_detached`), for ``aicluster up``: a supervisor
  process holds the cluster, writes its address to ``<state_dir>/ray.json`` and shuts it down on
  SIGTERM. Stopping it touches only its own Ray processes (never ``ray stop``, which would end
  every Ray cluster on the machine).

On several machines, run ``ray start`` with the same labels and resources instead
(:func:`ray_start_command`, ``docs/deploy.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aicluster.artifacts.private import open_private, private_dir, write_private
from aicluster.core import Cluster, Node, NodeShape, make_cluster, parse_cluster
from aicluster.runtime.labels import (
    GPU_RESOURCE,
    NO_METRICS_EXPORT,
    SIM_GPU_RESOURCE,
    node_labels,
    node_resources,
    ray_start_command,
)

__all__ = [
    "DetachedCluster",
    "EmbeddedCluster",
    "embedded_topology",
    "main",
    "ray_start_command",
    "read_detached",
    "start_detached",
    "stop_detached",
]

_OBJECT_STORE_BYTES = 100 * 1024 * 1024  # per node; Ray's minimum is 75 MiB
_LOCALHOST = "127.0.0.1"


def embedded_topology(
    nodes: int = 4,
    gpus_per_node: int = 8,
    *,
    gpu_type: str = "sim-gpu",
    nodes_per_rack: int = 2,
    cpus: float | None = None,
    memory_gb: float | None = None,
    nvlink_domain_size: int = 0,
) -> Cluster:
    """The default embedded topology (as ``examples/clusters/embedded-4.yaml``): 2 nodes a rack.

    ``cpus`` and ``memory_gb`` are what each node declares to Ray: logical amounts (the nodes
    share this machine's cores), by default one CPU and 2 GB per GPU so that wherever the
    scheduler (which counts GPUs only) fits a job's GPUs, Ray also fits its CPUs and memory.
    """
    return make_cluster(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        nodes_per_rack=nodes_per_rack,
        shape=NodeShape(
            gpu_type=gpu_type,
            nvlink_domain_size=nvlink_domain_size,
            cpus=float(gpus_per_node or 1) if cpus is None else cpus,
            memory_gb=float(2 * (gpus_per_node or 1)) if memory_gb is None else memory_gb,
        ),
        name=f"embedded-{nodes}",
    )


def _node_args(node: Node, gpu_resource: str) -> dict[str, Any]:
    return {
        "node_ip_address": _LOCALHOST,
        "num_cpus": int(node.cpus),
        "num_gpus": node.gpus if gpu_resource == GPU_RESOURCE else 0,
        "resources": node_resources(node, gpu_resource),
        "labels": node_labels(node),
        "memory": int(node.memory_gb * (1 << 30)) or None,
        "object_store_memory": _OBJECT_STORE_BYTES,
        # Ray's log monitor tails every worker's log for the drivers (about 3% of a core per
        # cluster here); aicluster's drivers connect with log_to_driver=False.
        "include_log_monitor": False,
    }


class EmbeddedCluster:
    """Ray nodes for ``topology`` on 127.0.0.1 (``ray.cluster_utils.Cluster``; the first node is
    the head). ``gpu_resource`` is ``aicluster/gpu`` (simulated) or ``GPU`` on a GPU machine.

    Use as a context manager, or call :meth:`start` and :meth:`shutdown` (both idempotent).
    """

    def __init__(self, topology: Cluster, *, gpu_resource: str = SIM_GPU_RESOURCE) -> None:
        if not topology.nodes:
            raise ValueError("an embedded cluster needs at least one node")
        self.topology = topology
        self.gpu_resource = gpu_resource
        self._ray: Any = None
        self._nodes: dict[str, Any] = {}

    @property
    def address(self) -> str:
        if self._ray is None:
            raise RuntimeError("the embedded cluster is not started")
        return str(self._ray.address)

    def start(self, timeout_s: float = 120.0) -> EmbeddedCluster:
        """Start a raylet per node (the head first) and wait until all are registered."""
        if self._ray is not None:
            return self
        from ray.cluster_utils import Cluster as RayCluster

        head, *others = self.topology.nodes
        self._ray = RayCluster(
            initialize_head=True,
            head_node_args={
                **_node_args(head, self.gpu_resource),
                "include_dashboard": False,
                # No autoscaler (the nodes are the topology's): its metrics port answers
                # without a token (docs/runtime.md).
                "no_monitor": True,
                # Nodes on one machine answer at once: declare a silent one dead after ~3 s
                # instead of Ray's default ~15 s, so a lost node's gang is re-placed sooner.
                "_system_config": {
                    "health_check_period_ms": 1000,
                    "health_check_failure_threshold": 3,
                    **NO_METRICS_EXPORT,
                },
            },
        )
        self._nodes[head.name] = self._ray.head_node
        for node in others:
            self.add_node(node, wait=False)
        self._ray.wait_for_nodes(timeout=timeout_s)
        return self

    def add_node(self, node: Node, *, wait: bool = True) -> None:
        """Start one more Ray node for ``node`` (also to bring a removed one back)."""
        if self._ray is None:
            raise RuntimeError("the embedded cluster is not started")
        if node.name in self._nodes:
            raise ValueError(f"node {node.name!r} is already running")
        hooks = self._ray._shutdown_at_exit
        if threading.current_thread() is not threading.main_thread():
            # Ray gives each node it starts exit hooks, a SIGTERM handler among them, which
            # only the main thread may install. A node started from another thread (power
            # saving's resume: control/loop/power.py) goes without: shutdown() stops it like the
            # others, and a raylet whose head is gone exits by itself.
            self._ray._shutdown_at_exit = False
        try:
            self._nodes[node.name] = self._ray.add_node(
                wait=wait, **_node_args(node, self.gpu_resource)
            )
        finally:
            self._ray._shutdown_at_exit = hooks

    def remove_node(self, name: str, *, graceful: bool = True) -> None:
        """Kill node ``name``'s raylet and its workers (a node failure). Not the head."""
        raylet = self._nodes.get(name)
        if raylet is None:
            raise KeyError(f"no running node {name!r}")
        if raylet is self._ray.head_node:
            raise ValueError("the head node cannot be removed")
        self._ray.remove_node(raylet, allow_graceful=graceful)
        del self._nodes[name]

    def connect(self) -> None:
        """Connect this process to the cluster as a driver (aicluster's namespace)."""
        from aicluster.runtime.cluster.discovery import connect

        connect(self.address)

    def shutdown(self) -> None:
        """Disconnect this process (if connected to it) and stop every node of the cluster."""
        if self._ray is None:
            return
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self._ray.shutdown()
        self._ray = None
        self._nodes.clear()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


@dataclass(frozen=True, slots=True)
class DetachedCluster:
    """A running detached embedded cluster: its Ray address and its supervisor's pid."""

    address: str
    pid: int
    state_dir: Path


def _info_file(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / "ray.json"


def read_detached(state_dir: str | os.PathLike[str]) -> DetachedCluster | None:
    """The detached cluster recorded in ``state_dir`` if its supervisor still runs, else None."""
    try:
        data = json.loads(_info_file(state_dir).read_text())
        if not _running(int(data["pid"])):
            return None
    except (FileNotFoundError, ValueError, KeyError):
        return None
    return DetachedCluster(str(data["address"]), int(data["pid"]), Path(state_dir))


def start_detached(
    state_dir: str | os.PathLike[str],
    topology: Cluster | None = None,
    *,
    cluster_file: str | os.PathLike[str] | None = None,
    gpu_resource: str = SIM_GPU_RESOURCE,
    timeout_s: float = 180.0,
) -> DetachedCluster:
    """Start the embedded cluster in a supervisor process that outlives this one.

    Idempotent: returns the running one if ``state_dir`` already has one. The topology is
    ``cluster_file`` (a cluster YAML), else ``topology``, else :func:`embedded_topology`. Raises
    ``RuntimeError`` (with the end of the supervisor's log) if it does not come up in time.
    """
    running = read_detached(state_dir)
    if running is not None:
        return running
    state = Path(state_dir)
    private_dir(state / "logs")
    topology_file = state / "embedded-topology.yaml"
    if cluster_file is not None:
        write_private(topology_file, Path(cluster_file).read_text())
    else:
        write_private(topology_file, _topology_yaml(topology or embedded_topology()))
    process, log_path = _spawn_supervisor(state, topology_file, gpu_resource)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = read_detached(state)
        if running is not None and running.pid == process.pid:
            return running
        if process.poll() is not None:
            break
        time.sleep(0.5)
    if process.poll() is None:
        process.terminate()
    tail = log_path.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"the embedded Ray cluster did not start; its log ends:\n{tail}")


def _spawn_supervisor(
    state: Path, topology_file: Path, gpu_resource: str
) -> tuple[subprocess.Popen[bytes], Path]:
    command = [sys.executable, "-m", "aicluster.runtime", "--state-dir", str(state)]
    command += ["--cluster-file", str(topology_file), "--gpu-resource", gpu_resource]
    log_path = state / "logs" / "embedded-ray.log"
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    with open_private(log_path) as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # outlives the caller's terminal and signals
        )
    return process, log_path


def stop_detached(state_dir: str | os.PathLike[str], timeout_s: float = 60.0) -> bool:
    """Stop the detached cluster of ``state_dir``; False if none was running. Idempotent."""
    running = read_detached(state_dir)
    if running is None:
        return False
    os.kill(running.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _running(running.pid):
            return True
        time.sleep(0.2)
    os.kill(running.pid, signal.SIGKILL)  # its Ray processes go with it (Ray's reaper)
    return True


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: reaped here when it is our own child)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child: its parent (or init) reaps it
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        stat = ""  # no /proc: fall back to a signal probe
    if stat and stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _topology_yaml(topology: Cluster) -> str:
    import yaml

    nodes = [
        {
            "name": n.name,
            "rack": n.rack,
            "pod": n.pod,
            "gpus": n.gpus,
            "gpu_type": n.gpu_type,
            "cpus": n.cpus,
            "memory_gb": n.memory_gb,
            "nvlink_domain_size": n.nvlink_domain_size,
            "labels": dict(n.labels),
        }
        for n in topology.nodes
    ]
    return yaml.safe_dump({"name": topology.name, "nodes": nodes}, sort_keys=False)


def main(argv: list[str] | None = None) -> None:
    """Supervisor of a detached embedded cluster (run by :func:`start_detached`)."""
    parser = argparse.ArgumentParser(prog="python -m aicluster.runtime")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--cluster-file", required=True)
    parser.add_argument("--gpu-resource", default=SIM_GPU_RESOURCE)
    options = parser.parse_args(argv)
    path = Path(options.cluster_file)
    topology = parse_cluster(path.read_text(), str(path))
    cluster = EmbeddedCluster(topology, gpu_resource=options.gpu_resource).start()
    stopping = threading.Event()
    # Installed after the start: Ray's own SIGTERM handler (a drain of the head node, then exit)
    # would otherwise leave the other nodes for Ray's atexit hooks to stop one by one.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    info = _info_file(options.state_dir)
    from aicluster.runtime.rundir import write_json_atomic

    write_json_atomic(
        info,
        {
            "address": cluster.address,
            "pid": os.getpid(),
            "nodes": [node.name for node in topology.nodes],
        },
    )
    print(f"embedded Ray cluster {topology.name} at {cluster.address}", flush=True)
    from aicluster.runtime.cluster.providers import serve_power_requests

    power = serve_power_requests(cluster, options.state_dir)  # power saving's suspends, resumes
    try:
        stopping.wait()
    finally:
        power.shutdown()
        info.unlink(missing_ok=True)
        cluster.shutdown()
        print("embedded Ray cluster stopped", flush=True)
