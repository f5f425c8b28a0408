"""The node's dataset cache: shards kept per node (byte-bounded, least recently used out), and
each dataset version assembled once per node into a read-only directory the ranks read.

Ranks of one node run concurrently; a lock file per version makes one of them assemble it while
the others wait (and then find it ready), and a lock file per shard makes one fetch it, so each
missing shard is fetched once per node. A fetched shard's SHA-256 is checked before it enters the
cache: one whose bytes do not match raises :class:`CorruptData` naming the shard and the dataset
(the job then fails for good: see ``aicluster.control.loop.lifecycle``). Everything here is root's,
under ``<state_dir>/nodes/<node>/data``; a sandboxed rank sees a version's directory read-only.

A version's directory hard-links each file that is one whole shard (no copy) and copies the
bytes of files grouped with others in a shard or split over several. The bound counts the shards
in the cache; evicting one frees its disk once no version directory links it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from aicluster.artifacts.datasets import DatasetFiles
from aicluster.core import names
from aicluster.runtime.joboutput import read_json
from aicluster.runtime.rundir import RunDir, write_json_atomic
from aicluster.runtime.workdir import file_lock, node_cache

__all__ = [
    "CORRUPT_DATA",
    "CorruptData",
    "DataInput",
    "DataStats",
    "NodeDataCache",
    "prepare_inputs",
    "read_data_stats",
    "read_inventory",
]

#: The cache's list of the shards it holds, under its root (NodeDataCache.report).
INVENTORY = "inventory.json"
#: How a rank's exit reason starts when its data was corrupt (a failure no restart mends).
CORRUPT_DATA = "found corrupt data"


class CorruptData(RuntimeError):
    """A shard (or manifest) in the data store does not match its SHA-256."""


@dataclass(frozen=True)
class DataInput:
    """A dataset version a job reads, as the control plane resolved it."""

    name: str
    version: int
    manifest: str  # its manifest's SHA-256

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


@dataclass
class DataStats:
    """What preparing one rank's datasets did on its node: shards served from the cache,
    shards fetched from the store and their bytes, and seconds the rank waited for it all."""

    cache_hits: int = 0
    shards_fetched: int = 0
    bytes_fetched: int = 0
    wait_seconds: float = 0.0

    def add(self, other: DataStats) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)


class NodeDataCache:
    """One node's cache under ``root`` (see the module doc), filled from ``files``."""

    def __init__(self, root: Path, files: DatasetFiles, max_bytes: int) -> None:
        self.root, self.files, self.max_bytes = Path(root), files, max_bytes

    def prepare(self, tenant: str, wanted: DataInput) -> tuple[Path, DataStats]:
        """The version's read-only directory on this node, assembled once, and what it took."""
        started, stats = time.monotonic(), DataStats()
        view = (
            self.root / "views" / names.part(tenant) / names.join(wanted.name, str(wanted.version))
        )
        with file_lock(self.root / "locks" / f"{view.parent.name}.{view.name}.lock"):
            manifest = self._manifest(tenant, wanted)
            if view.is_dir():
                stats.cache_hits = len(manifest["shards"])
            else:
                self._assemble(tenant, wanted, manifest, view, stats)
        stats.wait_seconds = time.monotonic() - started
        return view, stats

    def report(self) -> None:
        """Write what the cache holds (``<tenant folder>/<sha256>`` -> bytes) to its inventory,
        atomically: what the control loop reads for data locality (:func:`read_inventory`)."""
        held = {
            f"{path.parent.name}/{path.name}": path.stat().st_size
            for path in sorted((self.root / "shards").glob("*/*"))
            if path.is_file() and not path.name.startswith(".fetch-")
        }
        write_json_atomic(self.root / INVENTORY, {"shards": held})

    def _manifest(self, tenant: str, wanted: DataInput) -> dict[str, Any]:
        try:
            manifest = self.files.read_manifest(tenant, wanted.manifest)
        except ValueError as error:
            raise CorruptData(f"dataset {wanted.ref}: {error}") from None
        return manifest

    def _assemble(
        self, tenant: str, wanted: DataInput, manifest: dict[str, Any], view: Path, stats: DataStats
    ) -> None:
        staging = view.with_name(f".{view.name}.staging")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o755, parents=True)
        shards = manifest["shards"]
        for entry in manifest["files"]:
            target = staging.joinpath(*entry["path"].split("/"))
            target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            pieces = [(shards[index], offset, length) for index, offset, length in entry["pieces"]]
            if len(pieces) == 1 and pieces[0][1] == 0 and pieces[0][2] == pieces[0][0]["size"]:
                with self._held(tenant, wanted, pieces[0][0], stats) as cached:
                    os.link(cached, target)  # no copy
                continue
            with open(target, "wb") as out:
                for shard, offset, length in pieces:
                    with self._held(tenant, wanted, shard, stats) as cached:
                        _copy_range(cached, offset, length, out)
        _seal(staging)
        view.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.rename(staging, view)

    @contextmanager
    def _held(
        self, tenant: str, wanted: DataInput, shard: dict[str, Any], stats: DataStats
    ) -> Iterator[Path]:
        """The cached shard, fetched (once per node) and checked when missing; its lock is
        held while the caller reads it, so no eviction removes it meanwhile."""
        sha256 = str(shard["sha256"])
        path = self.root / "shards" / names.part(tenant) / sha256
        with file_lock(self._lock_of(path)):
            if path.is_file():
                os.utime(path)  # recently used
                stats.cache_hits += 1
            else:
                self._fetch(tenant, wanted, sha256, path)
                stats.shards_fetched += 1
                stats.bytes_fetched += path.stat().st_size
            yield path
        self._evict()

    def _lock_of(self, shard: Path) -> Path:
        return self.root / "locks" / "shards" / f"{shard.parent.name}.{shard.name}.lock"

    def _fetch(self, tenant: str, wanted: DataInput, sha256: str, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=".fetch-")
        digest = hashlib.sha256()
        try:
            with os.fdopen(descriptor, "wb") as out:
                for chunk in self.files.open_shard(tenant, sha256):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != sha256:
                raise CorruptData(
                    f"shard {sha256} of dataset {wanted.ref} does not match its SHA-256 "
                    f"(the stored bytes hash to {digest.hexdigest()})"
                )
            os.chmod(name, 0o444)
            os.rename(name, path)
        finally:
            Path(name).unlink(missing_ok=True)

    def _evict(self) -> None:
        """Least recently used shards out until the cache holds at most its bound; a shard
        someone holds (being fetched or read) stays."""
        folder = self.root / "shards"
        found = [
            (p.stat().st_mtime, p.stat().st_size, p)
            for p in folder.glob("*/*")
            if p.is_file() and not p.name.startswith(".fetch-")
        ]
        total = sum(size for _, size, _ in found)
        for _, size, path in sorted(found):
            if total <= self.max_bytes:
                return
            if _unlink_unless_held(path, self._lock_of(path)):
                total -= size


def _unlink_unless_held(path: Path, lock: Path) -> bool:
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        path.unlink(missing_ok=True)
        return True
    finally:
        os.close(descriptor)  # releases the lock


def _seal(root: Path) -> None:
    """Files read-only to everyone, folders readable and not writable."""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
        os.chmod(folder, 0o555)


def _copy_range(source: Path, offset: int, length: int, out: Any) -> None:
    with open(source, "rb") as handle:
        handle.seek(offset)
        left = length
        while left > 0:
            chunk = handle.read(min(1 << 20, left))
            if not chunk:
                raise CorruptData(f"shard {source.name} is shorter than its manifest says")
            out.write(chunk)
            left -= len(chunk)


def read_data_stats(run_path: Path) -> dict[str, Any]:
    """What the ranks' actors wrote of their data in an attempt's run directory: per rank, per
    node (summed over its ranks) and in all."""
    ranks: dict[str, dict[str, Any]] = {}
    for path in sorted(run_path.glob("rank-*.data.json")):
        try:
            record = json.loads(path.read_text())
        except ValueError:
            continue
        ranks[str(record["rank"])] = record
    nodes: dict[str, DataStats] = {}
    total = DataStats()
    for record in ranks.values():
        stats = DataStats(**{key: record[key] for key in asdict(DataStats())})
        nodes.setdefault(record["node"], DataStats()).add(stats)
        total.add(stats)
    by_node = {node: asdict(stats) for node, stats in sorted(nodes.items())}
    return {"ranks": ranks, "nodes": by_node, "total": asdict(total)}


class _Inventory(BaseModel):
    shards: dict[str, int]  # key -> bytes


#: An inventory's bound: a key is under 100 bytes, so about 160,000 shards.
_INVENTORY_LIMIT = 16 << 20


def read_inventory(path: Path) -> list[str]:
    """The shard keys an inventory lists (none where it cannot be read). Read with the
    project's bounded reader of files under the state directory (no symlinks followed, size
    capped), as the control loop reads everything a node writes."""
    inventory = read_json(path.parent, path.name, _Inventory, limit=_INVENTORY_LIMIT)
    return [] if inventory is None else list(inventory.shards)


def prepare_inputs(
    run: RunDir, rank: int, node: str, tenant: str, inputs: str | None
) -> dict[str, str]:
    """Each dataset of ``inputs`` (the JSON the control plane put in the rank's environment)
    ready on this node: name -> its directory. What that took is written beside the rank's exit
    record (root's; :func:`read_data_stats`)."""
    from aicluster.artifacts.datasets import dataset_files
    from aicluster.artifacts.storage import storage_settings

    wanted = [DataInput(**item) for item in json.loads(inputs or "[]")]
    if not wanted:
        return {}
    state_dir = str(run.state_dir)
    bound = storage_settings(state_dir).node_cache_bytes
    cache = NodeDataCache(node_cache(state_dir, node) / "data", dataset_files(state_dir), bound)
    total, found = DataStats(), {}
    for item in wanted:
        view, stats = cache.prepare(tenant, item)
        found[item.name] = str(view)
        total.add(stats)
    if total.shards_fetched:  # the cache changed: tell the scheduler (data locality)
        cache.report()
    record = {"rank": rank, "node": node, **asdict(total), "datasets": found}
    write_json_atomic(run.path / f"rank-{rank}.data.json", record)
    return found
