"""A rank's working directory: a fresh writable copy of the job's code on the rank's node.

Each node fetches a job's shipped tree from the code store once (per tenant and hash), checks its
SHA-256 while unpacking (:func:`aicluster.artifacts.unpack_tree`) into a node cache that only root
writes, and copies it into the attempt's work directory for that node, owned by the tenant's uid,
as Ray's ``working_dir`` does: the stored original stays immutable, a job may write beside its
code. Ranks of one attempt on one node share the copy; a lock file in the node's cache (root's)
makes one of them make it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aicluster.runtime.rundir import RunDir, make_owned_dir

__all__ = ["CodeSource", "file_lock", "node_cache", "prepare_workdir", "tree_bytes"]


class CodeSource:
    """Where a job's code comes from: a shipped tree (``tenant`` and ``sha256``), a trusted folder
    of the node (``folder``: tests and the operator's own jobs), or nothing (an empty folder)."""

    def __init__(
        self, tenant: str = "", sha256: str | None = None, folder: str | None = None
    ) -> None:
        self.tenant, self.sha256, self.folder = tenant, sha256, folder


def node_cache(state_dir: str | os.PathLike[str], node: str) -> Path:
    """The node's own cache of unpacked trees (root's; never mounted into a sandbox)."""
    return Path(state_dir) / "nodes" / node


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (made, with its folders, if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cached_tree(state_dir: str, node: str, source: CodeSource) -> Path:
    """The unpacked tree of ``source`` in the node's cache, fetched and checked once."""
    from aicluster.artifacts import code_store, unpack_tree
    from aicluster.core.names import part

    assert source.sha256 is not None
    cache = node_cache(state_dir, node) / "code" / part(source.tenant)  # injective (core/names)
    tree = cache / source.sha256
    with file_lock(cache / f"{source.sha256}.lock"):
        if not tree.is_dir():
            with code_store(Path(state_dir)).open(source.tenant, source.sha256) as archive:
                unpack_tree(archive, tree, source.sha256)
    return tree


def prepare_workdir(
    run: RunDir, node: str, source: CodeSource, owner: tuple[int, int] | None
) -> Path:
    """Make (once per attempt and node) the rank's working directory and return its real path.

    Raises ``OSError`` or :class:`aicluster.artifacts.CodeTreeError` when the code cannot be
    fetched or does not match its hash."""
    state_dir = str(run.state_dir)
    work = run.work_dir(node)
    with file_lock(node_cache(state_dir, node) / "locks" / f"{run.job_id}.{run.attempt}.lock"):
        if work.is_dir():
            return Path(os.path.realpath(work))
        if source.sha256 is not None:
            origin: Path | None = _cached_tree(state_dir, node, source)
        else:
            origin = Path(source.folder) if source.folder else None
        staging = work.with_name(f".{work.name}.staging")
        shutil.rmtree(staging, ignore_errors=True)
        if origin is not None:
            shutil.copytree(origin, staging, symlinks=True)
        else:
            staging.mkdir()
        if owner is not None:
            _chown_tree(staging, owner)
        os.rename(staging, work)  # root's directory: nobody else can have made ``work``
        make_owned_dir(work, owner)
    return Path(os.path.realpath(work))


def tree_bytes(root: str | os.PathLike[str]) -> int:
    """Bytes of disk the files under ``root`` take (links not followed)."""
    total, folders = 0, [os.fspath(root)]
    while folders:
        try:
            entries = list(os.scandir(folders.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)
                else:
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                continue
    return total


def _chown_tree(root: Path, owner: tuple[int, int]) -> None:
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.chown(os.path.join(folder, name), *owner, follow_symlinks=False)
    os.chown(root, *owner, follow_symlinks=False)
