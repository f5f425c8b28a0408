"""Node providers: what powers an aicluster node down and up, or adds and removes one, for power
saving (the live loop's driver is :mod:`aicluster.control.loop.power`).

One small interface, :class:`NodeProvider`, as Slurm's ``SuspendProgram``/``ResumeProgram`` and
Ray's autoscaler node providers; each call is given a timeout and raises :class:`ProviderError`
when the work was not done. Whether a resumed node is really back is not the provider's word
alone: the loop waits for Ray to report it alive.

- :class:`EmbeddedProvider`: the in-process embedded cluster (tests, scripts): a suspend stops
  the node's raylet and its workers, a resume starts a new one with the same labels.
- :class:`DetachedEmbeddedProvider`: the same for ``aicluster up``'s detached embedded cluster,
  whose supervisor process holds the Ray nodes: asked over a Unix socket in the state
  directory (mode 0600; the sandbox never shows a job that directory).
- :class:`ScriptProvider`: the operator's commands, each run with the node's name as its last
  argument (IPMI, Redfish, a cloud's CLI: ``docs/deploy.md``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from aicluster.core import Node
from aicluster.runtime.labels import ray_start_command

if TYPE_CHECKING:
    from aicluster.runtime.cluster.embedded import EmbeddedCluster

__all__ = [
    "POWER_SOCKET",
    "DetachedEmbeddedProvider",
    "EmbeddedProvider",
    "NodeProvider",
    "ProviderError",
    "ScriptProvider",
    "load_provider",
    "serve_power_requests",
]

#: The detached supervisor's socket, in the state directory.
POWER_SOCKET = "embedded-power.sock"
_MAX_REQUEST = 64 * 1024


class ProviderError(RuntimeError):
    """A suspend, resume, create or delete that did not happen (the message says why)."""


class NodeProvider(Protocol):
    """Powers aicluster nodes down and up, adds and removes them; blocking, bounded by
    ``timeout_s`` (the loop calls it from a worker thread, never from its tick).
    ``never_suspend``: nodes it will not power down (as Slurm's ``SuspendExcNodes``)."""

    @property
    def never_suspend(self) -> frozenset[str]: ...

    def suspend(self, node: str, timeout_s: float) -> None: ...

    def resume(self, node: str, timeout_s: float) -> None: ...

    def create(self, node: Node, timeout_s: float) -> None: ...

    def delete(self, node: str, timeout_s: float) -> None: ...


class EmbeddedProvider:
    """The in-process embedded cluster's nodes: a suspended node's Ray processes are gone; a
    resumed one is a new raylet with the node's labels and resources. Calls are serialized
    (Ray's ``cluster_utils`` is not thread-safe)."""

    def __init__(self, cluster: EmbeddedCluster) -> None:
        self.cluster = cluster
        self.known: dict[str, Node] = {node.name: node for node in cluster.topology.nodes}
        self._lock = threading.Lock()

    @property
    def never_suspend(self) -> frozenset[str]:
        return frozenset({self.cluster.topology.nodes[0].name})  # the head holds Ray's GCS

    def suspend(self, node: str, timeout_s: float) -> None:
        with self._lock, _as_provider_error("suspend", node):
            self.cluster.remove_node(node, graceful=True)

    def resume(self, node: str, timeout_s: float) -> None:
        shape = self.known.get(node)
        if shape is None:
            raise ProviderError(f"resume {node}: not a node of the embedded cluster")
        with self._lock, _as_provider_error("resume", node):
            self.cluster.add_node(shape, wait=True)

    def create(self, node: Node, timeout_s: float) -> None:
        with self._lock, _as_provider_error("create", node.name):
            self.cluster.add_node(node, wait=True)
        self.known[node.name] = node

    def delete(self, node: str, timeout_s: float) -> None:
        with self._lock, _as_provider_error("delete", node):
            self.cluster.remove_node(node, graceful=True)
        self.known.pop(node, None)


@contextmanager
def _as_provider_error(operation: str, node: str) -> Iterator[None]:
    """Any error of the embedded cluster becomes a ProviderError naming the operation."""
    try:
        yield
    except ProviderError:
        raise
    except Exception as error:
        raise ProviderError(f"{operation} {node}: {error}") from error


# -- the detached embedded cluster --------------------------------------------------------------


class DetachedEmbeddedProvider:
    """Asks the supervisor of ``aicluster up``'s embedded cluster (``state_dir``) to stop or
    start a node's Ray processes: one JSON request a connection, one JSON answer."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / POWER_SOCKET
        self.info = Path(state_dir) / "ray.json"  # the supervisor's: its nodes, the head first

    @property
    def never_suspend(self) -> frozenset[str]:
        try:
            return frozenset(json.loads(self.info.read_text())["nodes"][:1])
        except (OSError, ValueError, KeyError, TypeError):
            return frozenset()

    def suspend(self, node: str, timeout_s: float) -> None:
        self._ask({"op": "suspend", "node": node}, timeout_s)

    def resume(self, node: str, timeout_s: float) -> None:
        self._ask({"op": "resume", "node": node}, timeout_s)

    def create(self, node: Node, timeout_s: float) -> None:
        raise ProviderError(f"create {node.name}: the embedded cluster's nodes are fixed")

    def delete(self, node: str, timeout_s: float) -> None:
        raise ProviderError(f"delete {node}: the embedded cluster's nodes are fixed")

    def _ask(self, request: Mapping[str, str], timeout_s: float) -> None:
        what = f"{request['op']} {request['node']}"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(timeout_s)
                conn.connect(str(self.path))
                conn.sendall(json.dumps(request).encode() + b"\n")
                answer = json.loads(conn.makefile("rb").readline(_MAX_REQUEST) or b"{}")
        except (OSError, ValueError) as error:
            raise ProviderError(f"{what}: the embedded cluster's supervisor: {error}") from error
        if not answer.get("ok"):
            raise ProviderError(f"{what}: {answer.get('error', 'no answer')}")


def serve_power_requests(cluster: EmbeddedCluster, state_dir: str | os.PathLike[str]) -> Any:
    """In the supervisor: answer :class:`DetachedEmbeddedProvider` on the state directory's
    socket (mode 0600) from a daemon thread; returns the server (``shutdown()`` stops it)."""
    provider = EmbeddedProvider(cluster)
    path = Path(state_dir) / POWER_SOCKET
    path.unlink(missing_ok=True)

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            self.wfile.write(
                json.dumps(_answer(provider, self.rfile.readline(_MAX_REQUEST))).encode()
            )

    server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
    # Connecting needs write permission on the socket: the control plane's user only. (Under
    # the usual umask 022 others could not write to it between bind and chmod either.)
    path.chmod(0o600)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="embedded-power", daemon=True).start()
    return server


def _answer(provider: EmbeddedProvider, line: bytes) -> dict[str, Any]:
    try:
        request = json.loads(line)
        operation, node = str(request["op"]), str(request["node"])
        if operation == "suspend":
            provider.suspend(node, 60.0)
        elif operation == "resume":
            provider.resume(node, 60.0)
        else:
            return {"ok": False, "error": f"unknown operation {operation!r}"}
    except ProviderError as error:
        return {"ok": False, "error": str(error)}
    except (ValueError, KeyError, TypeError) as error:
        return {"ok": False, "error": f"bad request: {error}"}
    return {"ok": True}


# -- the operator's commands --------------------------------------------------------------------


@dataclass(frozen=True)
class ScriptProvider:
    """Runs the operator's command for each operation with the node's name appended, as Slurm
    runs its ``SuspendProgram``; a create also gets the node's ``ray start`` command in
    ``AICLUSTER_RAY_START`` (to run on the new machine). A non-zero exit, or one past its
    timeout (the smaller of ``timeout_s`` and the loop's), is a :class:`ProviderError` with the
    end of the command's output. An operation without a command is refused."""

    commands: Mapping[str, Sequence[str]]
    timeout_s: float = 600.0
    head_address: str | None = None  # for create's ray start command
    environment: Mapping[str, str] = field(default_factory=dict)
    never_suspend: frozenset[str] = frozenset()

    def suspend(self, node: str, timeout_s: float) -> None:
        self._run("suspend", node, timeout_s)

    def resume(self, node: str, timeout_s: float) -> None:
        self._run("resume", node, timeout_s)

    def create(self, node: Node, timeout_s: float) -> None:
        start = ray_start_command(node, head_address=self.head_address or "HEAD:6379")
        self._run("create", node.name, timeout_s, {"AICLUSTER_RAY_START": " ".join(start)})

    def delete(self, node: str, timeout_s: float) -> None:
        self._run("delete", node, timeout_s)

    def _run(
        self, operation: str, node: str, timeout_s: float, extra: Mapping[str, str] | None = None
    ) -> None:
        command = self.commands.get(operation)
        if not command:
            raise ProviderError(f"{operation} {node}: the provider has no {operation} command")
        env = {**os.environ, **self.environment, **(extra or {})}
        env |= {"AICLUSTER_POWER_OPERATION": operation, "AICLUSTER_NODE": node}
        limit = min(timeout_s, self.timeout_s)
        try:
            returncode, said = _run_bounded([*command, node], env, limit)
        except subprocess.TimeoutExpired as error:
            raise ProviderError(f"{operation} {node}: no answer in {limit:.0f} s") from error
        except OSError as error:
            raise ProviderError(f"{operation} {node}: cannot run {command[0]}: {error}") from error
        if returncode != 0:
            raise ProviderError(f"{operation} {node}: exit {returncode}: {said}")


def _run_bounded(command: list[str], env: Mapping[str, str], limit: float) -> tuple[int, str]:
    """Run ``command``; past ``limit`` seconds kill it with everything it started (its own
    session: a script's ``ipmitool`` too) and raise ``TimeoutExpired``. Returns the exit code
    and the end of its output."""
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    ) as process:
        try:
            output, _ = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    return process.returncode, output.decode(errors="replace").strip()[-500:]


_OPERATIONS = ("suspend", "resume", "create", "delete")


def load_provider(path: str | os.PathLike[str]) -> ScriptProvider:
    """A script provider from the operator's YAML file (``docs/deploy.md``, "Power saving")::

        kind: script
        suspend: [/usr/local/sbin/node-power, "off"]
        resume: [/usr/local/sbin/node-power, "on"]
        timeout_s: 300
        never_suspend: [head-0]

    Raises ``ValueError`` naming what is wrong."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or data.get("kind") != "script":
        raise ValueError(f"{path}: a power provider file starts with 'kind: script'")
    keys = {"kind", "timeout_s", "head_address", "environment", "never_suspend", *_OPERATIONS}
    unknown = set(data) - keys
    if unknown:
        raise ValueError(f"{path}: unknown keys {', '.join(sorted(unknown))}")
    commands: dict[str, list[str]] = {}
    for operation in _OPERATIONS:
        command = data.get(operation)
        if command is None:
            continue
        if isinstance(command, str):
            command = [command]
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(part, str) for part in command)
        ):
            raise ValueError(f"{path}: {operation} is a command: a list of strings")
        commands[operation] = command
    if "suspend" not in commands or "resume" not in commands:
        raise ValueError(f"{path}: a power provider needs a suspend and a resume command")
    timeout = data.get("timeout_s", 600.0)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"{path}: timeout_s is a positive number of seconds")
    environment = data.get("environment") or {}
    if not isinstance(environment, dict):
        raise ValueError(f"{path}: environment maps names to values")
    kept_on = data.get("never_suspend") or []
    if not isinstance(kept_on, list) or not all(isinstance(name, str) for name in kept_on):
        raise ValueError(f"{path}: never_suspend is a list of node names")
    return ScriptProvider(
        commands,
        float(timeout),
        data.get("head_address"),
        {str(k): str(v) for k, v in environment.items()},
        frozenset(kept_on),
    )
