"""Machines made of Linux namespaces on this host, for tests of a cluster of several machines.

Each machine in a network namespace of its own has one address on a private subnet: a veth pair
joins it to a bridge in the host namespace, which holds the subnet's first address. Every
machine, the host's own too, runs in a PID namespace of its own (``unshare --pid``), as a real
machine's processes see only each other: Ray's driver looks for a local raylet among the
processes it can see, and would otherwise find the other machines' raylets. Killing a machine's
first process ends every process of its PID namespace; a namespaced machine's network namespace
is then deleted, as if the machine and its network card were gone.

Names carry this process's id (``ip`` limits interface names to 15 characters), so parallel test
sessions never meet; :meth:`Network.teardown` is idempotent and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aicluster.core import Node
from aicluster.runtime import ray_start_command
from aicluster.runtime.labels import SIM_GPU_RESOURCE

IP = shutil.which("ip") or "/usr/sbin/ip"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
RAY = str(Path(sys.executable).with_name("ray"))
_PREFIX = "aicm"  # every namespace and interface this module makes starts with it
_STEP_S = 0.2
#: A line this harness writes before each `ray start`, and what Ray says when a joining node
#: missed its 30 s to register.
_STARTING = "--- aicluster test: ray start ---"
_TIMED_OUT = "timed out during startup"


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (None: they can), in words."""
    for tool in (IP, UNSHARE, NSENTER):
        if not os.access(tool, os.X_OK):
            return f"{Path(tool).name} is not installed (iproute2, util-linux)"
    if os.geteuid() != 0:
        return "not root: network namespaces, bridges and veth pairs need CAP_NET_ADMIN"
    probe = f"{_PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    made = _run([UNSHARE, "--pid", "--fork", "--mount-proc", "true"], check=False)
    if made.returncode != 0:
        return f"`unshare --pid --mount-proc` failed: {made.stderr.strip()}"
    return None


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run([IP, *args], check=check)


@dataclass
class Machine:
    """One machine: an aicluster node (or none, for a Ray node without labels), its network
    namespace (None: the host's) and address, and its Ray node's process once started."""

    node: Node | None
    netns: str | None
    address: str
    work_dir: Path  # its log
    ray_dir: Path  # its Ray node's temporary folder: short (Ray's sockets' paths are limited)
    link: str | None = None  # the host's end of its veth pair
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.node.name if self.node is not None else f"host-{self.address}"

    @property
    def log(self) -> Path:
        return self.work_dir / f"{self.name}.log"

    def ray_start(
        self,
        head_address: str | None,
        env: Mapping[str, str],
        *,
        system_config: str | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        """Start this machine's Ray node as ``docs/deploy.md`` says (``ray_start_command``:
        labels and simulated GPUs), bound to its own address, in its own PID namespace; returns
        once Ray says it started."""
        if self.node is None:  # a Ray node and nothing else: no aicluster label, no GPU
            command = ["ray", "start", f"--address={head_address}", "--num-cpus=0"]
        else:
            command = ray_start_command(
                self.node, head_address=head_address, gpu_resource=SIM_GPU_RESOURCE
            )
        command[0] = RAY
        command += [
            f"--node-ip-address={self.address}",
            f"--temp-dir={self.ray_dir}",  # the machines share /tmp
            f"--object-store-memory={100 * 1024 * 1024}",
            "--disable-usage-stats",
            # Any free port: the host's machine shares its loopback, where the agent listens
            # too, with any other Ray cluster here (the test session's embedded one: 52365).
            "--dashboard-agent-listen-port=0",
            "--block",  # the first process of the machine's PID namespace: its end ends all
        ]
        if head_address is None:
            command += ["--include-dashboard=false"]
            command += [f"--system-config={system_config}"] if system_config else []
        wrapper = [UNSHARE, "--pid", "--fork", "--mount-proc", "--kill-child"]
        if self.netns is not None:
            wrapper = [IP, "netns", "exec", self.netns, *wrapper]
        deadline = time.monotonic() + timeout_s
        self._spawn([*wrapper, *command], env)
        while "Ray runtime started" not in (said := self.log.read_text(errors="replace")):
            assert self.process is not None
            ended = self.process.poll() is not None
            # `ray start` gives a joining node 30 s to register with the head, hard-coded
            # (ray/_private/node.py); beside the rest of the suite on 2 cores the host's node
            # took longer twice. This test's bound is ``timeout_s``: start it again within it.
            if ended and _TIMED_OUT in said.rsplit(_STARTING, 1)[-1]:
                ended = False
                self._spawn([*wrapper, *command], env)
            if ended or time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: Ray did not start{self.context()}")
            time.sleep(_STEP_S)

    def _spawn(self, argv: list[str], env: Mapping[str, str]) -> None:
        with open(self.log, "ab") as log:
            log.write(f"{_STARTING}\n".encode())
            self.process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                start_new_session=True,
            )

    def init_pid(self) -> int:
        """The host pid of the first process of this machine's PID namespace."""
        assert self.process is not None, f"{self.name} is not started"
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if entry.name.isdigit() and _parent(entry) == self.process.pid:
                    return int(entry.name)
        raise AssertionError(f"{self.name}: no process of its PID namespace{self.context()}")

    def enter(self, cwd: Path) -> list[str]:
        """The command prefix that runs a program on this machine (its PID, mount and network
        namespaces), in ``cwd``."""
        return [NSENTER, f"--target={self.init_pid()}", "--pid", "--mount", "--net", f"--wd={cwd}"]

    def context(self) -> str:
        try:
            tail = self.log.read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            tail = "(no log)"
        return f"\n--- machine {self.name} ({self.address}), end of {self.log}:\n{tail}"


def _parent(proc: Path) -> int:
    return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])


class Network:
    """A bridge in the host namespace and a machine in a network namespace behind it for each
    of ``nodes``, plus the host itself as a machine (:attr:`host`, at the bridge's address)."""

    def __init__(self, work_dir: Path, nodes: Sequence[Node]) -> None:
        self.work_dir = work_dir
        self.tag = f"{_PREFIX}{os.getpid()}"
        self.bridge = f"{self.tag}-b"
        self.subnet = _free_subnet()
        self.ray_dir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self.host = Machine(None, None, f"{self.subnet}.1", work_dir, self.ray_dir / "0")
        self.machines = [
            Machine(
                node,
                f"{self.tag}-m{i}",
                f"{self.subnet}.{i + 1}",
                work_dir,
                self.ray_dir / str(i),
                f"{self.tag}-v{i}",
            )
            for i, node in enumerate(nodes, start=1)
        ]
        self._made: list[tuple[str, ...]] = []  # what teardown deletes, newest first

    def make(self) -> Network:
        """The bridge, each machine's namespace, veth pair and address, loopback up."""
        _remove_orphans()
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.insert(0, ("link", "del", self.bridge))
        _ip("addr", "add", f"{self.host.address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for machine in self.machines:
            assert machine.netns is not None and machine.link is not None
            _ip("netns", "add", machine.netns)
            self._made.insert(0, ("netns", "del", machine.netns))
            _ip("-n", machine.netns, "link", "set", "lo", "up")
            pair = f"link add {machine.link} type veth peer name eth0 netns {machine.netns}"
            _ip(*pair.split())
            # Deleting a namespace need not delete the pair (gVisor keeps the host's end).
            self._made.insert(0, ("link", "del", machine.link))
            _ip("link", "set", machine.link, "master", self.bridge, "up")
            _ip("-n", machine.netns, "addr", "add", f"{machine.address}/24", "dev", "eth0")
            _ip("-n", machine.netns, "link", "set", "eth0", "up")
        return self

    def machine(self, name: str) -> Machine:
        return next(m for m in self.machines if m.name == name)

    def tear_down(self, machine: Machine, timeout_s: float = 30.0) -> None:
        """Kill every process of ``machine``, unplug it from the bridge and delete its network
        namespace (idempotent)."""
        _end(machine, timeout_s)
        if machine.netns is not None and machine.netns in _netns_names():
            deadline = time.monotonic() + timeout_s
            while _netns_pids(machine.netns):
                for pid in _netns_pids(machine.netns):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                assert time.monotonic() < deadline, f"processes outlived {machine.netns}"
                time.sleep(_STEP_S)
            if machine.link is not None:
                _ip("link", "del", machine.link, check=False)
            _ip("netns", "del", machine.netns)
        if machine.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                machine.process.wait(timeout=timeout_s)

    def teardown(self) -> None:
        """Every machine's processes, then namespaces and the bridge. Idempotent; carries on
        past errors and raises the first at the end."""
        errors: list[BaseException] = []
        for machine in [*self.machines, self.host]:
            try:
                self.tear_down(machine)
            except Exception as error:  # the rest must still go
                errors.append(error)
        for made in self._made:
            done = _ip(*made, check=False)
            gone = "No such" in done.stderr or "Cannot find" in done.stderr
            if done.returncode != 0 and not gone:
                errors.append(RuntimeError(f"ip {' '.join(made)}: {done.stderr.strip()}"))
        self._made.clear()
        shutil.rmtree(self.ray_dir, ignore_errors=True)
        if errors:
            raise errors[0]

    def context(self) -> str:
        return "".join(m.context() for m in [self.host, *self.machines] if m.process is not None)


def _end(machine: Machine, timeout_s: float) -> None:
    """SIGKILL the machine's first process and its session: its PID namespace ends with it."""
    process = machine.process
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout_s)


def _netns_names() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}


def _netns_pids(netns: str) -> list[int]:
    done = _ip("netns", "pids", netns, check=False)
    return [int(pid) for pid in done.stdout.split()]


def _free_subnet() -> str:
    """A /24 of 10.231.0.0/16 that no interface here uses, chosen by this process's id."""
    used = _ip("-4", "-o", "addr", "show").stdout
    for offset in range(250):
        subnet = f"10.231.{(os.getpid() + offset) % 250 + 2}"
        if f" {subnet}." not in used:
            return subnet
    raise RuntimeError("no free /24 in 10.231.0.0/16")


def _remove_orphans() -> None:
    """Namespaces and bridges a killed test session of this module left (its pid is gone)."""
    names = [*_netns_names(), *_ip("-o", "link", "show").stdout.split()]
    for name in {n.split("@")[0].rstrip(":") for n in names if n.startswith(_PREFIX)}:
        pid = name[len(_PREFIX) :].split("-")[0]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        for orphan in _netns_pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)
        _ip("netns", "del", name, check=False)
        _ip("link", "del", name, check=False)
