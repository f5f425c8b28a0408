"""A dataset version as content-addressed shards, and its manifest.

A folder is cut into shards by size (:func:`plan_folder`): a file of at least half the shard
size gets shards of its own (split every ``shard_bytes``), smaller files are grouped, in path
order, into shards of up to ``shard_bytes``. So an unchanged large file gives the same shards in
every version, and a small change touches few shards. Each shard is named by the SHA-256 of its
bytes. The manifest lists the files (path, size, pieces: ``[shard index, offset in the shard,
length]`` in file order) and the shards (``sha256``, ``size``); it is named by the SHA-256 of its
canonical JSON (:func:`manifest_hash`).

Paths are relative POSIX paths of safe parts (no ``..``, no absolute path, no NUL); a symbolic
link is followed only while it stays inside the folder (:class:`DatasetError` otherwise).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "MAX_FILES",
    "MAX_SHARD_BYTES",
    "DatasetError",
    "FolderPlan",
    "check_dataset_name",
    "check_manifest",
    "check_path",
    "manifest_hash",
    "plan_folder",
    "shard_chunks",
]

DEFAULT_SHARD_BYTES = 64 << 20
#: The largest shard a server takes (one upload's cap).
MAX_SHARD_BYTES = 256 << 20
MAX_FILES = 100_000
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


class DatasetError(ValueError):
    """A folder, name or manifest that cannot be a dataset version."""


def check_dataset_name(name: str) -> str:
    """``name`` if it is a dataset name: lower-case letters, digits, ``.``, ``_``, ``-`` (at most
    63, starting with a letter or digit)."""
    if not _NAME.fullmatch(name):
        raise DatasetError(
            f"{name!r} is not a dataset name (lower-case letters, digits, '.', '_' and '-', "
            "at most 63, starting with a letter or digit)"
        )
    return name


def check_path(path: str) -> str:
    """``path`` if it is a safe relative POSIX path of a dataset file."""
    parts = path.split("/")
    bad = (
        not path
        or len(path) > 1024
        or path.startswith("/")
        or "\x00" in path
        or "\\" in path
        or any(part in ("", ".", "..") for part in parts)
    )
    if bad:
        raise DatasetError(f"{path!r} is not a relative path inside the dataset")
    return path


@dataclass
class FolderPlan:
    """A folder cut into shards: the manifest's files and, per shard, the file ranges it
    holds (``(path on disk, offset, length)``). Shards are hashed by :meth:`hash_shards`."""

    root: Path
    shard_bytes: int
    files: list[dict[str, Any]] = field(default_factory=list)
    members: list[list[tuple[Path, int, int]]] = field(default_factory=list)
    shards: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(entry["size"] for entry in self.files)

    def hash_shards(self) -> None:
        self.shards = []
        for index in range(len(self.members)):
            digest, size = hashlib.sha256(), 0
            for chunk in shard_chunks(self, index):
                digest.update(chunk)
                size += len(chunk)
            self.shards.append({"sha256": digest.hexdigest(), "size": size})

    def manifest(self) -> dict[str, Any]:
        return {"format": 1, "files": self.files, "shards": self.shards}


def _walk(root: Path) -> list[tuple[str, Path]]:
    """``(relative path, real path)`` of each file under ``root``, in path order."""
    return sorted(_files_under(root))


def _files_under(root: Path) -> Iterator[tuple[str, Path]]:
    real_root = root.resolve()
    for folder, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(names + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
            path = Path(folder, name)
            relative = path.relative_to(root).as_posix()
            real = path.resolve()
            if real != real_root and real_root not in real.parents:
                raise DatasetError(f"{relative}: a symbolic link out of the folder")
            if real.is_dir():
                raise DatasetError(f"{relative}: a symbolic link to a folder is not followed")
            if not real.is_file():
                raise DatasetError(f"{relative}: not a regular file")
            yield check_path(relative), real


def plan_folder(root: Path, shard_bytes: int = DEFAULT_SHARD_BYTES) -> FolderPlan:
    """The shards of ``root`` (see the module doc), hashed. Raises :class:`DatasetError`."""
    if not root.is_dir():
        raise DatasetError(f"{root} is not a folder")
    if not 0 < shard_bytes <= MAX_SHARD_BYTES:
        raise DatasetError(f"the shard size must be 1 to {MAX_SHARD_BYTES} bytes")
    plan = FolderPlan(root, shard_bytes)
    group: list[tuple[Path, int, int]] = []
    group_size = 0
    for relative, real in _walk(root):
        size = real.stat().st_size
        entry: dict[str, Any] = {"path": relative, "size": size, "pieces": []}
        plan.files.append(entry)
        if len(plan.files) > MAX_FILES:
            raise DatasetError(f"more than {MAX_FILES} files")
        if size >= shard_bytes // 2:  # shards of its own, after the group so far
            if group:
                plan.members.append(group)
                group, group_size = [], 0
            for offset in range(0, size, shard_bytes):
                length = min(shard_bytes, size - offset)
                entry["pieces"].append([len(plan.members), 0, length])
                plan.members.append([(real, offset, length)])
            continue
        if group and group_size + size > shard_bytes:
            plan.members.append(group)
            group, group_size = [], 0
        if size:
            entry["pieces"].append([len(plan.members), group_size, size])
            group.append((real, 0, size))
            group_size += size
    if group:
        plan.members.append(group)
    plan.hash_shards()
    return plan


def shard_chunks(plan: FolderPlan, index: int) -> Iterator[bytes]:
    """The bytes of shard ``index`` of ``plan``, read from the folder in chunks."""
    for path, offset, length in plan.members[index]:
        with path.open("rb") as handle:
            handle.seek(offset)
            left = length
            while left > 0:
                chunk = handle.read(min(_CHUNK, left))
                if not chunk:
                    raise DatasetError(f"{path} changed while it was pushed")
                left -= len(chunk)
                yield chunk


def manifest_hash(manifest: dict[str, Any]) -> str:
    """SHA-256 of the manifest's canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(canonical_json(manifest)).hexdigest()


def canonical_json(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def check_manifest(manifest: Any) -> dict[str, Any]:
    """The manifest, checked whole: safe unique paths (none a folder of another), pieces that
    lie inside their shards and add up to each file's size. Raises :class:`DatasetError`."""
    if not isinstance(manifest, dict) or manifest.get("format") != 1:
        raise DatasetError("the manifest must be an object with format 1")
    shards, files = manifest.get("shards"), manifest.get("files")
    if not isinstance(shards, list) or not isinstance(files, list) or len(files) > MAX_FILES:
        raise DatasetError(f"the manifest needs lists of shards and of up to {MAX_FILES} files")
    sizes = [_shard_size(shard) for shard in shards]
    paths: set[str] = set()
    for entry in files:
        path = _checked_file(entry, sizes)
        if path in paths:
            raise DatasetError(f"{path}: given twice")
        paths.add(path)
    folders = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
    if clash := sorted(paths & folders):
        raise DatasetError(f"{clash[0]}: both a file and a folder")
    return {"format": 1, "files": files, "shards": shards}


def _shard_size(shard: Any) -> int:
    ok = isinstance(shard, dict) and set(shard) == {"sha256", "size"}
    if not ok or not _SHA.fullmatch(str(shard["sha256"])) or not _count(shard["size"]):
        raise DatasetError("a shard must be {sha256: 64 hex digits, size: bytes}")
    if shard["size"] > MAX_SHARD_BYTES:
        raise DatasetError(f"a shard is larger than {MAX_SHARD_BYTES} bytes")
    return int(shard["size"])


def _checked_file(entry: Any, sizes: list[int]) -> str:
    if not isinstance(entry, dict) or set(entry) != {"path", "size", "pieces"}:
        raise DatasetError("a file must be {path, size, pieces}")
    path = check_path(str(entry["path"])) if isinstance(entry["path"], str) else ""
    pieces = entry["pieces"]
    if not path or not _count(entry["size"]) or not isinstance(pieces, list):
        raise DatasetError(f"{entry['path']!r}: a file needs a path, a size and pieces")
    total = 0
    for piece in pieces:
        ok = isinstance(piece, list) and len(piece) == 3 and all(_count(v) for v in piece)
        if not ok or piece[0] >= len(sizes) or piece[1] + piece[2] > sizes[piece[0]]:
            raise DatasetError(f"{path}: a piece lies outside its shard")
        total += piece[2]
    if total != entry["size"]:
        raise DatasetError(f"{path}: its pieces hold {total} bytes, not {entry['size']}")
    return path


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
