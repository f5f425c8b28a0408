"""The Ray actor behind one rank: starts the rank's process on its node and reports its exit.

One actor per rank, placed in the rank's placement-group bundle. It runs the entrypoint as a
process of its own (not in the actor): real exit codes and signals, and its stdout/stderr go
straight to files that outlive the actor. The process is forked from the node's warm process
(torch imported already, :mod:`aicluster.runtime.warm.starter`) when there is one, else a fresh
interpreter. A thread waits for the child and
writes its exit record to the run directory, so the exit is known even after the actor is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import ray

from aicluster.runtime.alarms import raise_alarm
from aicluster.runtime.cluster.powermeter import power_report_path
from aicluster.runtime.environment import job_environment
from aicluster.runtime.gang.command import RankCommand, signal_code, visible_gpus
from aicluster.runtime.gang.datacache import CORRUPT_DATA, CorruptData, prepare_inputs
from aicluster.runtime.gang.netif import GLOO_SOCKET_IFNAME, interface_of
from aicluster.runtime.labels import LABEL_NODE
from aicluster.runtime.rundir import RunDir, write_json_atomic
from aicluster.runtime.sandbox import jobdisk
from aicluster.runtime.sandbox.bwrap import SandboxSpec, gpu_device_nodes
from aicluster.runtime.sandbox.cgroups import (
    Limits,
    RankCgroup,
    rank_cgroup_name,
    worker_cgroup_name,
)
from aicluster.runtime.sandbox.secretbox import SecretBox
from aicluster.runtime.warm.launchchannel import WrongPeer
from aicluster.runtime.warm.starter import (
    WarmChild,
    channel_of,
    ensure_warm_starter,
    spawn_warm,
    tenant_warm_sandbox,
    warm_compatible,
)
from aicluster.runtime.workdir import CodeSource, prepare_workdir, tree_bytes
from aicluster.train import data as train_data
from aicluster.train import env as train_env

__all__ = ["RankWorker"]

#: Seconds between two checks of a sandboxed job's disk use (by its rank 0).
DISK_CHECK_S = 3.0


class RankWorker:
    """Actor class (wrapped with ``ray.remote`` by the gang launcher). All methods idempotent."""

    def __init__(self, state_dir: str, job_id: str, attempt: int, rank: int) -> None:
        self.run = RunDir(state_dir, job_id, attempt)
        self.rank = rank
        self._pid: int | None = None
        self.warm = False  # whether the process was forked from the node's warm process
        self._spawned = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._spawn_error: str | None = None
        self._stopped = False
        self._port: int | None = None
        self._cgroup: RankCgroup | None = None
        self._warm_child: WarmChild | None = None
        self._sandboxed = False
        self._worker_memory_gb = 0.0  # its worker's memory_gb, which the worker's ranks share
        self._worker = (0, 1)  # the index of the rank's worker, and the job's workers
        self._node = ""
        self._reason: str | None = None
        self._started_at: float | None = None  # when its process started (usage: run time)
        self._disk_full: Callable[[], bool] | None = None  # the job's own file system is full
        self._disk_cap_gb = 0.0

    def where(self) -> dict[str, str]:
        """The node this actor actually runs on: IP, Ray node id and aicluster node label."""
        context = ray.get_runtime_context()
        return {
            "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "node_id": context.get_node_id(),
            "node": str(context.get_node_labels().get(LABEL_NODE, "")),
        }

    def rendezvous_port(self) -> int:
        """A free TCP port on this node for torch's store (rank 0 only); the same on every call.

        The port is free when chosen and bound by rank 0's process a moment later; that small
        window is the same one ``torchrun --master-port 0`` accepts.
        """
        if self._port is None:
            with socket.socket() as sock:
                sock.bind(("", 0))
                self._port = int(sock.getsockname()[1])
        return self._port

    def start(self, launch: dict[str, Any]) -> int:
        """Start the rank's process once (later calls return the same pid; -1 after stop).

        ``launch`` (from :meth:`aicluster.runtime.gang.launch.Runtime.launch`): ``entrypoint`` or
        ``module``, ``args``, ``env`` (the rank's variables), ``secrets`` (the job's, sealed:
        opened here with the state directory's key, see :mod:`..sandbox.secretbox`), ``code``
        (``tenant``, ``sha256``, ``folder``: see :class:`CodeSource`) and ``user``
        (``[uid, gid]`` of the tenant's sandbox, or None to run unsandboxed). Forked from the
        node's warm process when there is one (torch already imported, see
        :mod:`aicluster.runtime.warm.starter`), else a fresh interpreter."""
        if self._stopped:
            return -1
        if self._thread is None and self.run.stop_requested():
            # A stopped attempt never starts again: e.g. a launch by a deposed control plane
            # that resumes after the new leader ended (and released) this attempt.
            self._stopped = True
            return -1
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, args=(launch, self.where()), name="rank-process", daemon=True
            )
            self._thread.start()
            self._spawned.wait()
        if self._spawn_error is not None:
            raise RuntimeError(self._spawn_error)
        return self._pid if self._pid is not None else 0  # 0: failed before its process

    def _run(self, launch: dict[str, Any], where: dict[str, str]) -> None:
        # The child is spawned from this thread, which lives exactly as long as the child:
        # PR_SET_PDEATHSIG fires when the spawning *thread* ends. A warm child is killed by the
        # warm process when this thread's connection closes instead.
        try:
            command = self._prepare(launch, where)
        except CorruptData as error:  # the rank fails, for good (no restart mends the store)
            self._reason = f"{CORRUPT_DATA}: {error}"
            self._write_exit(1)
            self._spawned.set()
            return
        except Exception as error:
            self._spawn_error = f"cannot start rank {self.rank}: {error}"
            self._write_exit(None)
            self._spawned.set()
            return
        self._sandboxed = command.sandbox is not None
        self._watch_disk(launch)
        warm = self._try_warm(command, where["node_id"], launch.get("code") or {})
        if warm is not None:
            self._pid, self.warm, self._warm_child = warm.pid, True, warm
            self._started_at = time.time()
            self._spawned.set()
            self._write_exit(warm.wait())
            return
        out = open(command.stdout, "ab")  # noqa: SIM115
        err = open(command.stderr, "ab")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                command.cold_argv(),
                cwd=command.workdir,
                env=command.env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._pid, self._started_at = proc.pid, time.time()
        except OSError as error:
            self._spawn_error = f"cannot start rank {self.rank}: {error}"
            self._write_exit(None)
            return
        finally:
            out.close()
            err.close()
            self._spawned.set()
        code = proc.wait()
        self._write_exit(signal_code(code) if command.sandbox is not None else code)

    def _watch_disk(self, launch: dict[str, Any]) -> None:
        """The job's disk cap. Where its data directory is a mount of its own
        (:mod:`..sandbox.jobdisk`) the kernel holds it, and a rank that exits with that file system
        full says so. Else rank 0 of a sandboxed job ends the rank (so the job) once the directory
        holds more than the cap; the check runs every few seconds while the rank runs."""
        limits = launch.get("limits") or {}
        cap_gb = limits.get("disk_gb")
        if not self._sandboxed or not cap_gb:
            return
        data_dir = os.path.realpath(self.run.data_link)
        if limits.get("disk_limit") == jobdisk.LOOP and os.path.ismount(data_dir):
            self._disk_full = lambda: jobdisk.is_full(data_dir)
            self._disk_cap_gb = float(cap_gb)
            return
        if self.rank != 0:
            return

        def watch() -> None:
            while not self._done.wait(DISK_CHECK_S):
                if tree_bytes(data_dir) > float(cap_gb) * (1 << 30):
                    self._reason = f"exceeded disk_gb={float(cap_gb):g}"
                    self._signal(signal.SIGKILL)
                    return

        threading.Thread(target=watch, name="disk-watch", daemon=True).start()

    def _limit(self, launch: dict[str, Any], command: RankCommand, node: str) -> None:
        """Hard limits for a sandboxed rank: its cgroup in its worker's (the worker's memory_gb
        shared by its ranks), else an rlimit of its share of that memory (see .cgroups)."""
        limits = launch.get("limits") or {}
        share_gb = float(limits.get("memory_gb") or 0.0)
        self._worker_memory_gb = float(limits.get("worker_memory_gb") or share_gb)
        self._worker = (int(limits.get("worker") or 0), int(limits.get("workers") or 1))
        self._node = node
        cpus = float(limits.get("cpus") or 0.0)
        worker = worker_cgroup_name(self.run.job_id, self.run.attempt, self._worker[0])
        try:
            self._cgroup = RankCgroup.make(
                worker, rank_cgroup_name(self.rank), Limits.for_worker(self._worker_memory_gb, cpus)
            )
        except (OSError, ValueError):
            command.rlimit_data = Limits.for_worker(share_gb, cpus).memory_bytes
            return
        command.cgroup_procs = self._cgroup.procs_files

    def _prepare(self, launch: dict[str, Any], where: dict[str, str]) -> RankCommand:
        """The rank's working directory, environment and command line."""
        self.run.path.mkdir(parents=True, exist_ok=True)
        user = launch.get("user")
        owner = (int(user[0]), int(user[1])) if user else None
        code = launch.get("code") or {}
        source = CodeSource(code.get("tenant", ""), code.get("sha256"), code.get("folder"))
        workdir = str(prepare_workdir(self.run, where["node"], source, owner))
        # The job's secrets, opened only now and kept in memory; the variables the runtime sets
        # (launch["env"]) win over a secret of the same name (docs/runtime.md).
        sealed = launch.get("secrets") or {}
        secrets = SecretBox(self.run.state_dir).open_all(source.tenant, sealed) if sealed else {}
        inputs = launch["env"].get(train_data.INPUTS)
        datasets = prepare_inputs(self.run, self.rank, where["node"], source.tenant, inputs)
        rank_vars = {**secrets, **launch["env"], train_env.NODE: where["node"]}
        interface = interface_of(where["ip"])
        if interface is not None:  # gloo listens where the other machines reach (.netif)
            rank_vars.setdefault(GLOO_SOCKET_IFNAME, interface)
        rank_vars.pop(train_data.INPUTS, None)
        rank_vars[train_data.DATASETS] = json.dumps(datasets)
        env = job_environment(rank_vars, workdir)
        sandbox = None
        if owner is not None:
            data_dir = os.path.realpath(self.run.data_link)
            sandbox = SandboxSpec(
                uid=owner[0],
                gid=owner[1],
                workdir=workdir,
                writable=(data_dir,),
                hidden=(str(self.run.state_dir),),
                devices=gpu_device_nodes(visible_gpus(env)),
                exposed=tuple(datasets.values()),  # read-only, assembled by the node's cache
            )
        command = RankCommand(
            entrypoint=launch.get("entrypoint"),
            module=launch.get("module"),
            args=[str(arg) for arg in launch.get("args", [])],
            env=env,
            workdir=workdir,
            stdout=self.run.log_file(self.rank, "stdout"),
            stderr=self.run.log_file(self.rank, "stderr"),
            sandbox=sandbox,
            secret_names=frozenset(secrets),
        )
        if sandbox is not None:
            self._limit(launch, command, where["node"])
        return command

    def _try_warm(
        self, command: RankCommand, node_id: str, code: dict[str, Any]
    ) -> WarmChild | None:
        """The rank's process forked from the node's warm process (the tenant's, when
        sandboxed), or None to start it cold. A rank given GPU device nodes starts cold: a
        tenant's warm process is made before it knows which GPUs its ranks get."""
        sandbox = command.sandbox
        if command.entrypoint is None or (sandbox and (sandbox.devices or sandbox.exposed)):
            return None  # the tenant's warm process has neither these devices nor datasets
        script = os.path.join(command.workdir, command.entrypoint)
        if not (command.entrypoint.endswith(".py") and os.path.isfile(script)):
            return None  # a missing one fails cold, with Python's error
        if not warm_compatible(command.env):
            return None
        tenant = str(code.get("tenant") or "") if command.sandbox else None
        argv = [command.entrypoint, *command.args]
        # The secrets go to the forked child alone (a memfd the warm process never reads).
        public = {k: v for k, v in command.env.items() if k not in command.secret_names}
        private = {k: v for k, v in command.env.items() if k in command.secret_names}
        # The listener must run as the rank's own user: the tenant's, or this launcher's.
        peer = (sandbox.uid, sandbox.gid) if sandbox else (os.getuid(), os.getgid())
        channel = channel_of(node_id, self.run.state_dir, tenant)
        try:
            warm = spawn_warm(
                channel,
                peer,
                argv,
                public,
                command.workdir,
                command.stdout,
                command.stderr,
                cgroup_procs=command.cgroup_procs,
                rlimit_data=command.rlimit_data,
                private_env=private,
            )
        except WrongPeer as wrong:  # nothing was sent; the rank starts cold
            details = {"job_id": self.run.job_id, "rank": self.rank, "peer_uid": wrong.found.uid}
            details |= {"peer_pid": wrong.found.pid, "expected_uid": peer[0]}
            raise_alarm(self.run.state_dir, "launch_channel.wrong_peer", tenant, node_id, details)
            return None
        if warm is None:  # none on this node yet (or not ready): start one for the next gang
            with contextlib.suppress(Exception):
                sandbox = self._warm_sandbox(command, tenant)
                report = None if tenant else self._power_report()
                ensure_warm_starter(node_id, self.run.state_dir, tenant, sandbox, report)
        return warm

    def _power_report(self) -> str | None:
        """Where the node's own warm starter reports the node's power, as the runtime's warm-up
        asks it to (:meth:`Runtime.warm_up`): whichever of the two makes the starter first."""
        node = self.where()["node"]
        return str(power_report_path(self.run.state_dir, node)) if node else None

    def _warm_sandbox(self, command: RankCommand, tenant: str | None) -> SandboxSpec | None:
        """The sandbox of the tenant's warm process on this node (see tenant_warm_sandbox)."""
        if command.sandbox is None or not tenant:
            return None
        user = (command.sandbox.uid, command.sandbox.gid)
        return tenant_warm_sandbox(self.run.state_dir, tenant, user)

    def _write_exit(self, code: int | None) -> None:
        if code and self._reason is None and self._disk_full is not None:
            with contextlib.suppress(OSError):
                if self._disk_full():  # ENOSPC from the job's own file system, most likely
                    self._reason = f"exceeded disk_gb={self._disk_cap_gb:g}"
        if self._cgroup is not None:
            if code is not None and code != 0 and self._cgroup.oom_killed():
                peak = self._cgroup.worker_peak_bytes()
                self._reason = _memory_reason(
                    self._worker_memory_gb, *self._worker, self._node, peak
                )
            self._cgroup.remove()
        record: dict[str, Any] = {
            "rank": self.rank,
            "exit_code": code if code is not None else 127,
            "stopped": self._stopped,
            "started_at": self._started_at,
            "finished_at": time.time(),
            "pid": self._pid,
            "warm": self.warm,
        }
        if self._reason is not None:
            record["reason"] = self._reason
        write_json_atomic(self.run.exit_file(self.rank), record)
        self._done.set()

    def poll(self) -> dict[str, Any]:
        """``{"state": "pending"|"running"|"exited", "exit_code", "stopped", "pid"}``."""
        if self._pid is None and self._spawn_error is None and not self._done.is_set():
            return {"state": "pending", "exit_code": None, "stopped": self._stopped, "pid": None}
        if not self._done.is_set() and self._pid is not None:
            return {"state": "running", "exit_code": None, "stopped": False, "pid": self._pid}
        record = self.run.exit_record(self.rank) or {}
        return {"state": "exited", **record}

    def terminate(self, grace_s: float) -> dict[str, Any]:
        """SIGTERM the rank's process group, SIGKILL it after ``grace_s``; then :meth:`poll`."""
        self._stopped = True
        pid = self._pid
        if pid is not None and not self._done.is_set():
            self._signal(signal.SIGTERM)
            if not self._done.wait(grace_s):
                self._signal(signal.SIGKILL)
                self._done.wait(10.0)
        if pid is not None:
            self._signal(signal.SIGKILL)  # leftovers of the group (data loaders, ...)
        return self.poll()

    def _signal(self, number: signal.Signals) -> None:
        """Signal the rank's process group. A warm child's pid may be one of its sandbox's PID
        namespace: its warm process signals it. A sandboxed warm child's leftovers, once it has
        exited, die with its cgroup (see :meth:`_write_exit`)."""
        if self._warm_child is not None and (self._sandboxed or not self._done.is_set()):
            self._warm_child.signal(number)
        elif self._pid is not None:
            _signal_group(self._pid, number)


def _memory_reason(limit_gb: float, worker: int, workers: int, node: str, peak: int | None) -> str:
    """``exceeded memory_gb=4 (worker 1 of 2 on node-0: peak 4.0 GB)``: the limit the worker's
    ranks share, which worker (numbered from 0, as ranks are), and the most its ranks held at
    once (``peak`` bytes, where the kernel tracks it)."""
    where = f"worker {worker} of {workers} on {node or 'its node'}"
    if peak is not None:
        peak_gb = peak / (1 << 30)
        where += f": peak {peak_gb:.1f} GB" if peak_gb >= 1 else f": peak {peak_gb:.2f} GB"
    return f"exceeded memory_gb={limit_gb:g} ({where})"


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
