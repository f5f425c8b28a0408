"""The tenant sandbox: what a rank process (or a tenant's warm process) sees, and as whom it runs.

A rank runs under bubblewrap (``bwrap``), started by the trusted launcher (the rank's Ray actor,
root on the node, as slurmd is), as the tenant's own unprivileged uid and gid::

    _child.py (root: joins the rank's cgroups, ignores SIGTERM)
      -> bwrap (root: makes the namespaces and mounts)
        -> _sandbox_entry.py (drops to the tenant's uid/gid, no new privileges, SIGTERM default)
          -> python -u ENTRYPOINT ARGS   (or the tenant's warm process)

bwrap runs as root rather than as the tenant (through a user namespace) because the sources of
its mounts, the job's directories under the state directory, lie behind directories only root may
enter. The process inside sees: read-only system and Python directories (``/usr``, ``/etc``, the
interpreter's prefixes, its site-packages and aicluster's own package, never the launcher's
working directory nor another directory of its import path, minus anything under the state
directory: :func:`readonly_paths`), a private ``/tmp`` and ``/dev/shm`` of a fixed size, a new
``/proc`` of its own PID namespace, a minimal ``/dev`` plus the device nodes of the GPUs it was
given, and read-write only the directories named in :attr:`SandboxSpec.writable` (the job's
data directory: run, checkpoints, export and working directory). The state directory (database,
admin token, other tenants) and Ray's session directory (under ``/tmp``) are not there. The
system calls a job never needs are refused by a seccomp filter (:mod:`.seccomp`).

bwrap ignores SIGTERM here (the disposition is inherited from ``_child.py``): a SIGTERM to the
rank's process group must reach the job, which may checkpoint, not kill bwrap (whose death kills
the job at once). ``_sandbox_entry.py`` restores the default before it execs the job.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aicluster.runtime.sandbox.seccomp import filter_program

__all__ = [
    "BWRAP",
    "CHILD_SHIM",
    "SHM_BYTES",
    "TMP_BYTES",
    "SandboxConfig",
    "SandboxSpec",
    "SandboxUnavailable",
    "bwrap_argv",
    "gpu_device_nodes",
    "probe",
    "readonly_paths",
]

BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
#: The script every sandboxed or cold process starts under (cgroups, limits, signals): _child.py.
CHILD_SHIM = str(Path(__file__).with_name("_child.py"))
#: A sandbox's private ``/tmp`` and ``/dev/shm`` (PyTorch's DataLoader workers pass batches
#: through ``/dev/shm``; Docker's 64 MiB default is a known trap for them).
TMP_BYTES = 8 << 30
SHM_BYTES = 8 << 30
_ENTRY = str(Path(__file__).with_name("_sandbox_entry.py"))
# Merged-/usr systems make these symlinks into /usr; others have real directories.
_SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/opt/conda")
# What every sandbox has a private one of: never shown from the host.
_PRIVATE = ("/tmp", "/proc", "/sys", "/dev")
_NVIDIA_SHARED = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)


@dataclass(frozen=True)
class SandboxConfig:
    """Where tenants' uids come from: each tenant gets one of ``uid_first..uid_last`` on first
    use, kept in the store (so the same on every node); its gid is the same number. The range
    must hold no uid of a real account of the nodes. ``job_disk_gb`` caps each job's data
    directory (None: a quarter of the state disk's free space); ``disk_limit`` says how: "loop"
    (a size-capped file system of the job's own, :mod:`.jobdisk`) or "poll" (its rank 0 checks
    its size). Over it the job fails, "exceeded disk_gb=N"."""

    uid_first: int = 300_000
    uid_last: int = 399_999
    #: Disk a job's data directory may hold (checkpoints, export, run and working directories).
    job_disk_gb: float | None = None
    disk_limit: str = "poll"
    #: Start a tenant's warm process on every alive node at its first launch, so a gang re-placed
    #: onto a node new to the tenant starts warm too (one process with torch imported, per
    #: tenant and node).
    prewarm: bool = True

    def __post_init__(self) -> None:
        if not 1000 <= self.uid_first <= self.uid_last:
            raise ValueError("the sandbox uid range must lie above 1000 and not be empty")
        if self.job_disk_gb is not None and self.job_disk_gb <= 0:
            raise ValueError("job_disk_gb must be positive")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot make its namespaces on this host."""


@dataclass(frozen=True)
class SandboxSpec:
    """One sandbox: who runs in it and what it may write.

    ``hidden`` are host directories that must not be visible even where a read-only directory
    holds them (the state directory inside a repository checkout, say); ``exposed`` are shown
    read-only even inside a hidden one (a served model's artifact in the state directory).
    """

    uid: int
    gid: int
    workdir: str
    writable: tuple[str, ...]
    hidden: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    exposed: tuple[str, ...] = ()
    readonly: tuple[str, ...] = field(default_factory=lambda: tuple(readonly_paths()))
    #: Sizes of the private ``/tmp`` and ``/dev/shm`` (tmpfs: over them a write fails with
    #: ENOSPC; their pages count against the job's memory cgroup as well).
    tmp_bytes: int = TMP_BYTES
    shm_bytes: int = SHM_BYTES

    def __post_init__(self) -> None:
        if self.uid <= 0 or self.gid <= 0:
            raise ValueError("a sandbox never runs as root (uid and gid must be positive)")


def readonly_paths() -> list[str]:
    """Directories a Python job needs to read: the system's, the interpreter's prefixes, its
    site-packages (the venv's and the base interpreter's: :func:`_site_packages`) and
    aicluster's own package. Nothing is taken from the import path: Ray puts the driver's
    working directory there (a checkout, with whatever state a demo left in it), and a job
    needs none of it, nor any other directory of the launcher's path."""
    found = [path for path in _SYSTEM_DIRS if os.path.lexists(path)]  # symlinks stay symlinks
    prefixes = {
        os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p
    } | {os.path.dirname(os.path.realpath(sys.executable))}
    for path in [*sorted(prefixes | _site_packages()), _package_dir()]:
        if path == "/" or not os.path.isdir(path) or any(_inside(path, p) for p in _PRIVATE):
            continue
        if not any(_inside(path, shown) for shown in found):
            found.append(path)
    return found


def _package_dir() -> str:
    """aicluster's own package: a job imports ``aicluster.train``, and its launcher runs the
    shims in its runtime subpackages (sandbox/, gang/, warm/). In site-packages, or, for an editable
    install, ``src/aicluster`` of the checkout, which the install's ``.pth`` puts on the path as
    ``src``: the package is shown, and nothing else of the checkout (``src`` inside is an empty
    directory leading to it)."""
    return str(Path(__file__).resolve().parents[2])


def _site_packages() -> set[str]:
    """The running interpreter's site-packages, as real paths: ``purelib`` and ``platlib`` (the
    venv's in a venv) and ``site``'s list (the base interpreter's too where a venv sees them)."""
    paths = sysconfig.get_paths()
    found = {paths["purelib"], paths["platlib"], *site.getsitepackages()}
    return {os.path.realpath(path) for path in found}


def gpu_device_nodes(indices: Iterable[int]) -> tuple[str, ...]:
    """The NVIDIA device nodes of the given GPUs plus the shared control nodes, where they exist."""
    nodes = [f"/dev/nvidia{index}" for index in indices]
    return tuple(path for path in (*nodes, *_NVIDIA_SHARED) if os.path.exists(path))


def _mounts_for(path: str, kind: str) -> list[str]:
    if os.path.islink(path) and os.path.dirname(path) == "/":
        return ["--symlink", os.readlink(path), path]
    return [kind, path, path]


def bwrap_argv(
    spec: SandboxSpec, command: Sequence[str], python: str = sys.executable
) -> list[str]:
    """The bwrap command line that runs ``command`` in ``spec``'s sandbox (see the module doc)."""
    argv = [
        BWRAP,
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
    ]
    argv += _parents(spec.readonly)
    for path in spec.readonly:
        argv += _mounts_for(path, "--ro-bind")
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for path, size in (("/tmp", spec.tmp_bytes), ("/dev/shm", spec.shm_bytes)):
        argv += ["--perms", "1777", "--size", str(size), "--tmpfs", path]
    for path in spec.hidden:
        if any(_inside(path, shown) for shown in spec.readonly):
            argv += ["--perms", "0755", "--tmpfs", path]  # an empty directory over it
    for device in spec.devices:
        argv += ["--dev-bind", device, device]
    argv += _parents(spec.exposed)
    for path in spec.exposed:
        argv += ["--ro-bind", path, path]
    argv += _parents(spec.writable)
    for path in spec.writable:
        argv += ["--bind", path, path]
    argv += ["--chdir", spec.workdir, "--"]
    program = filter_program().hex()  # installed by the entry, last before it execs the job
    argv += [python, "-I", "-S", _ENTRY, str(spec.uid), str(spec.gid), program, *command]
    return argv


def _parents(paths: Iterable[str]) -> list[str]:
    """Directories leading to ``paths``, made traversable: bwrap running as root would make them
    0700 (root's), and the tenant's uid could not reach what is mounted below them."""
    ancestors: set[str] = set()
    for path in paths:
        parent = os.path.dirname(path.rstrip("/"))
        while parent not in ("/", ""):
            ancestors.add(parent)
            parent = os.path.dirname(parent)
    argv: list[str] = []
    for parent in sorted(ancestors, key=lambda p: (p.count("/"), p)):
        argv += ["--perms", "0755", "--dir", parent]
    return argv


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def probe(uid: int = 65534, gid: int = 65534, timeout_s: float = 20.0) -> str | None:
    """None when this host can sandbox ranks (bwrap present, namespaces allowed, running as
    root), else why not, in words."""
    hidden = [p for p in (sys.prefix, sys.executable) if _inside(os.path.realpath(p), "/tmp")]
    if hidden:  # readonly_paths leaves /tmp out: a sandbox has a private one
        return (
            f"this Python ({hidden[0]}) is under /tmp, which every sandbox replaces with a "
            "private one; install aicluster outside /tmp"
        )
    if shutil.which(BWRAP) is None:
        return "bubblewrap (bwrap) is not installed"
    if os.geteuid() != 0:
        return "the node side is not root: it cannot run jobs as the tenants' own uids"
    try:
        filter_program()
    except (ImportError, OSError, RuntimeError) as error:
        return f"cannot build the sandbox's seccomp filter (libseccomp): {error}"
    spec = SandboxSpec(uid, gid, workdir="/tmp", writable=())
    command = [sys.executable, "-I", "-S", "-c", "import os; print(os.getuid())"]
    try:
        done = subprocess.run(
            bwrap_argv(spec, command), capture_output=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap failed: {error}"
    if done.returncode != 0 or done.stdout.strip() != str(uid).encode():
        why = done.stderr.decode(errors="replace").strip()[-300:]
        return f"bubblewrap cannot make its namespaces here: {why or done.returncode}"
    return None
