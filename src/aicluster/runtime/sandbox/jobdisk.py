"""A job's disk cap, held by the kernel: its data directory is a size-capped file system of its own.

The host's root is ext4 without project quotas (no ``CONFIG_QUOTA``), so each sandboxed job gets
a sparse ext4 image, ``<state_dir>/jobdisks/<job_id>.img`` (a directory only root enters),
loop-mounted over its data directory (``tenants/<tenant>/jobs/<job_id>``) by the launcher before
its first rank starts. A write past the cap fails with ENOSPC from the kernel. The image lives as
long as the job is not over: every attempt mounts the same one (its checkpoints are in it). Once
the job has ended, :func:`detach` copies the image's files back into a plain data directory
(what the API, goodput and the model registry read afterwards), unmounts it and deletes the
image. Where the host cannot loop-mount (not root, no loop device), :func:`probe` says "poll" and
the ranks' launcher polls the directory's size instead (:mod:`..gang.worker`).

Mounts made under ``tenants/`` after a tenant's warm process started must still reach it (its
ranks are forked there): :func:`share_tenants` makes ``tenants/`` a shared bind mount of
itself, so each job's mount propagates into the warm processes' sandboxes (bwrap makes their
copies slaves).

util-linux (``mount``, ``umount``) and e2fsprogs (``mkfs.ext4``) through ``subprocess``: no
maintained Python binding makes ext4 or sets up loop devices, and these are the tools an
operator uses to inspect what was made.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

__all__ = [
    "LOOP",
    "POLL",
    "DiskLimit",
    "attach",
    "default_disk_gb",
    "detach",
    "disks_dir",
    "image_bytes",
    "image_path",
    "is_full",
    "probe",
    "share_tenants",
    "stale_jobs",
    "sweep",
]

DiskLimit = Literal["loop", "poll"]
LOOP: DiskLimit = "loop"
POLL: DiskLimit = "poll"
_GIB = 1 << 30
_MIB = 1 << 20
#: ext4 below this has no journal; a smaller cap gets an image of this size.
MIN_IMAGE_BYTES = 16 * _MIB
#: A job's cap when the configuration names none: this share of the state disk's free space.
DEFAULT_SHARE = 0.25
_SUFFIX = ".img"
#: noinit_itable: the kernel need not zero the inode tables either (the sparse file is zeros).
_MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"


def disks_dir(state_dir: str | os.PathLike[str]) -> Path:
    """Where the jobs' images lie: ``<state_dir>/jobdisks``."""
    return Path(state_dir) / "jobdisks"


def image_path(state_dir: str | os.PathLike[str], job_id: str) -> Path:
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise ValueError(f"not a job id: {job_id!r}")
    return disks_dir(state_dir) / f"{job_id}{_SUFFIX}"


def image_bytes(disk_gb: float) -> int:
    """The image's size for a cap of ``disk_gb`` GiB: whole MiB, at least ``MIN_IMAGE_BYTES``
    (the file system's own metadata, a few percent, is inside the cap)."""
    if disk_gb <= 0:
        raise ValueError("disk_gb must be positive")
    wanted = -(-int(disk_gb * _GIB) // _MIB) * _MIB
    return max(wanted, MIN_IMAGE_BYTES)


def default_disk_gb(state_dir: str | os.PathLike[str], share: float = DEFAULT_SHARE) -> float:
    """A quarter (``share``) of the state disk's free space, in GiB to a thousandth."""
    found = os.statvfs(state_dir)
    free_gb = found.f_bavail * found.f_frsize / _GIB
    return max(0.001, int(free_gb * share * 1000) / 1000)


def stale_jobs(image_names: Iterable[str], active: Callable[[str], bool]) -> list[str]:
    """The jobs whose image ``image_names`` (file names in :func:`disks_dir`) holds and that
    are not ``active``: what :func:`sweep` detaches. Other names are left alone."""
    jobs = (name[: -len(_SUFFIX)] for name in image_names if name.endswith(_SUFFIX))
    return sorted(job for job in jobs if job and not job.startswith(".") and not active(job))


def is_full(path: str | os.PathLike[str]) -> bool:
    """Whether the file system at ``path`` has (almost) no room left: what a job that wrote past
    its cap leaves behind (ext4 refuses a little before the last block)."""
    found = os.statvfs(path)
    size = found.f_blocks * found.f_frsize
    return found.f_bavail * found.f_frsize < max(_MIB, size // 50)


def _mounted(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a mount point (``os.path.ismount`` misses a bind mount of a directory
    onto itself: same device)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        points = (line.split()[4] for line in table)
        return any(_unescape(point) == target for point in points)


def _unescape(point: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        point = point.replace(code, char)
    return point


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv[:2])}: {done.stderr.strip() or done.returncode}")


def _make_image(image: Path, size: int) -> None:
    """A sparse ext4 image of ``size`` bytes (a 20 GiB one takes 4 MiB of disk and 30 ms to
    make): no reserved blocks (the tenant gets the whole cap), root's root directory (the
    launcher sets its owner and mode)."""
    image.parent.mkdir(mode=0o700, exist_ok=True)
    partial = image.with_name(f".{image.name}.new")
    with open(partial, "wb") as handle:
        handle.truncate(size)
    # Lazy and no discard: the fresh sparse file reads as zeros, nothing needs zeroing.
    extended = "lazy_itable_init=1,lazy_journal_init=1,nodiscard"
    _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", extended, str(partial))
    os.replace(partial, image)


def attach(data_dir: Path, image: Path, size: int) -> int:
    """Mount ``image`` over ``data_dir``, made with ``size`` bytes when it does not exist yet
    (an existing one, a restarted job's, keeps its size and files). Idempotent: nothing when
    ``data_dir`` is a mount already. Returns the image's size."""
    if not image.exists():
        _make_image(image, size)
    if not _mounted(data_dir):
        _run("mount", "-o", _MOUNT_OPTIONS, str(image), str(data_dir))
        with contextlib.suppress(OSError):
            (data_dir / "lost+found").rmdir()
    return image.stat().st_size


def _unmount(path: Path) -> None:
    try:
        _run("umount", str(path))
    except OSError:  # busy (a straggler's open file): detached now, freed when it lets go
        _run("umount", "-l", str(path))


def detach(data_dir: Path, image: Path) -> None:
    """Copy the image's files into a plain ``data_dir``, unmount it and delete the image.
    Idempotent; a crash half-way leaves the image (the next sweep finishes the job)."""
    if not image.exists():
        if _mounted(data_dir):
            _unmount(data_dir)
        return
    staging = data_dir.with_name(f".{data_dir.name}.out")
    shutil.rmtree(staging, ignore_errors=True)
    if _mounted(data_dir):
        _copy(data_dir, staging)
        _unmount(data_dir)
    else:  # the host restarted, or a sweep after a crash: mount it aside, once, read-only
        aside = image.with_name(f".{image.name}.mnt")
        aside.mkdir(mode=0o700, exist_ok=True)
        _run("mount", "-o", f"ro,{_MOUNT_OPTIONS}", str(image), str(aside))
        try:
            _copy(aside, staging)
        finally:
            _unmount(aside)
            aside.rmdir()
    old = data_dir.with_name(f".{data_dir.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if data_dir.exists():
        os.rename(data_dir, old)
    os.rename(staging, data_dir)
    shutil.rmtree(old, ignore_errors=True)
    image.unlink()


def _copy(source: Path, target: Path) -> None:
    """``cp -a``: owners, modes, links as links (the job's own), sparse files stay sparse."""
    _run("cp", "-a", "--sparse=always", "--", str(source), str(target))
    with contextlib.suppress(OSError):
        (target / "lost+found").rmdir()


def sweep(
    state_dir: str | os.PathLike[str],
    active: Callable[[str], bool],
    data_dir_of: Callable[[str], Path | None],
) -> list[str]:
    """Detach the images of the jobs that are not ``active`` (ended, or unknown: a crashed
    launcher's leftovers); ``data_dir_of`` gives a job's data directory. Returns those jobs."""
    folder = disks_dir(state_dir)
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.is_file()]
    except FileNotFoundError:
        return []
    done = []
    for job_id in stale_jobs(names, active):
        image = image_path(state_dir, job_id)
        data_dir = data_dir_of(job_id)
        if data_dir is None:  # no data directory to give its files back to
            image.unlink(missing_ok=True)
        else:
            detach(data_dir, image)
        done.append(job_id)
    return done


def share_tenants(state_dir: str | os.PathLike[str]) -> None:
    """Make ``<state_dir>/tenants`` a shared bind mount of itself (once), so that the job mounts
    made below it reach the tenants' warm processes' sandboxes. It stays when the server stops:
    warm processes outlive a server, and the next one must reach them through the same mount."""
    tenants = Path(state_dir) / "tenants"
    tenants.mkdir(mode=0o711, exist_ok=True)
    if not _mounted(tenants):
        _run("mount", "--bind", str(tenants), str(tenants))
    _run("mount", "--make-shared", str(tenants))


def probe(state_dir: str | os.PathLike[str]) -> DiskLimit:
    """ "loop" when this host can make, mount and unmount a job's image, else "poll"."""
    if os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("mkfs.ext4", "mount", "cp")):
        return POLL
    folder = disks_dir(state_dir)
    image, target = folder / ".probe.img", folder / ".probe.mnt"
    try:
        _make_image(image, MIN_IMAGE_BYTES)
        target.mkdir(exist_ok=True)
        _run("mount", "-o", _MOUNT_OPTIONS, str(image), str(target))
        _unmount(target)
        return LOOP
    except OSError:
        return POLL
    finally:
        with contextlib.suppress(OSError):
            target.rmdir()
        image.unlink(missing_ok=True)
