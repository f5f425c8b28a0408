"""The on-disk layout of a job's checkpoints and the steps that make one visible atomically.

::

    <checkpoint_dir>/
      step-000000120/              complete: renamed into place after every file was fsynced
        manifest.json              written last, lists every file and its size
        .metadata  __0_0.distcp …  torch.distributed.checkpoint's files (one data file per rank)
      step-000000140.tmp-<token>/  being written by the Checkpointer whose token it is
      step-000000100.deleting-<token>/  being pruned (renamed first, so never half-visible)

A checkpoint is *complete* when its directory is named ``step-<n>`` (no suffix), holds a
``manifest.json`` for step ``n``, and every file the manifest lists exists with its size. Readers
consider nothing else, so a writer killed at any point leaves at worst a ``.tmp-`` directory that
is never chosen and is removed by the next writer. Pure standard library (no torch): the control
plane can ask for a job's latest checkpoint cheaply.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

__all__ = [
    "FORMAT",
    "MANIFEST",
    "commit",
    "complete_steps",
    "final_path",
    "fsync_dir",
    "latest_step",
    "prune",
    "read_manifest",
    "remove_stale",
    "tmp_path",
]

FORMAT = "aicluster-checkpoint/1"
MANIFEST = "manifest.json"
_COMPLETE = re.compile(r"^step-([0-9]+)$")  # ASCII: "١" is a \d too
_TRANSIENT = re.compile(r"^step-[0-9]+\.(tmp|deleting)-(\w+)$", re.ASCII)


def final_path(directory: Path, step: int) -> Path:
    """Where the complete checkpoint of ``step`` lives (zero-padded, so names sort by step)."""
    return directory / f"step-{step:09d}"


def tmp_path(directory: Path, step: int, token: str) -> Path:
    """Where the writer with ``token`` writes ``step`` before committing it."""
    return directory / f"step-{step:09d}.tmp-{token}"


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of the checkpoint at ``path`` if it is complete, else ``None``."""
    match = _COMPLETE.match(path.name)
    if match is None:
        return None
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    if manifest.get("step") != int(match.group(1)):
        return None
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        _has_size(path / name, size) for name, size in files.items()
    ):
        return None
    return manifest


def _has_size(path: Path, size: Any) -> bool:
    try:
        return bool(path.stat().st_size == size)
    except OSError:
        return False


def complete_steps(directory: Path) -> list[int]:
    """Steps of the complete checkpoints in ``directory``, ascending (empty if none or missing)."""
    try:
        names = [entry.name for entry in os.scandir(directory) if entry.is_dir()]
    except FileNotFoundError:
        return []
    steps = []
    for name in names:
        match = _COMPLETE.match(name)
        if match and read_manifest(directory / name) is not None:
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_step(directory: Path) -> int | None:
    """The newest complete step, or ``None``."""
    steps = complete_steps(directory)
    return steps[-1] if steps else None


def commit(tmp: Path, final: Path, manifest: dict[str, Any]) -> int | None:
    """Make ``tmp`` the complete checkpoint ``final``: manifest, fsync, rename, fsync parent.

    ``manifest`` gets ``format`` and ``files`` (every file in ``tmp`` with its size) added. The
    data files must already be durable (torch.distributed.checkpoint fsyncs what it writes).
    Returns the bytes committed. If ``final`` already exists (the step was saved before) the
    existing one is kept, ``tmp`` is removed and ``None`` returned: a complete checkpoint is
    never replaced in place.
    """
    files = {
        entry.name: entry.stat().st_size
        for entry in os.scandir(tmp)
        if entry.is_file() and entry.name != MANIFEST
    }
    body = {**manifest, "format": FORMAT, "files": files}
    with open(tmp / MANIFEST, "w", encoding="utf-8") as handle:
        json.dump(body, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(tmp)  # the directory entries of the files, before the name that publishes them
    if final.exists():
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    os.rename(tmp, final)
    fsync_dir(final.parent)
    return sum(files.values())


def prune(directory: Path, keep_last: int, token: str = "prune") -> list[int]:
    """Delete all but the newest ``keep_last`` (at least 1) complete checkpoints; returns them.

    Each is first renamed to ``.deleting-`` (atomic), so a reader never sees half of one.
    """
    steps = complete_steps(directory)
    doomed = steps[: max(0, len(steps) - max(1, keep_last))]
    for step in doomed:
        path = final_path(directory, step)
        graveyard = path.with_name(f"{path.name}.deleting-{token}")
        try:
            os.rename(path, graveyard)
        except OSError:
            continue  # pruned concurrently, or already gone
        shutil.rmtree(graveyard, ignore_errors=True)
    if doomed:
        fsync_dir(directory)
    return doomed


def remove_stale(directory: Path, keep_token: str) -> list[str]:
    """Remove other writers' ``.tmp-`` directories (dead attempts) and any ``.deleting-`` ones.

    Returns their names. Call only while no other writer uses ``directory`` (one attempt of a
    job runs at a time); the ``.tmp-`` directories of ``keep_token`` are left alone.
    """
    removed: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return removed
    for entry in entries:
        match = _TRANSIENT.match(entry.name)
        stale = match is not None and (match.group(1) == "deleting" or match.group(2) != keep_token)
        if stale and entry.is_dir():
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (creations, renames) durable; a no-op where unsupported."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
