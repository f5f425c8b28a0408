"""Shard throughput: a dataset read from the node cache against straight from the data store,
on the local filesystem and on S3 (a SeaweedFS server started here, as the tests start it).

    nice -n 10 .venv/bin/python bench/data_cache.py [--mb 256] [--files 8] [--repeat 3]

A folder of ``--files`` random files (``--mb`` in all) is cut into shards and stored as a
push stores it (``aicluster.artifacts``). Then, per backend, each figure the best of
``--repeat`` runs, in MB/s of dataset bytes:

- ``store``: every shard streamed from the store and its SHA-256 checked (what each rank would
  do without a node cache);
- ``cache cold``: ``NodeDataCache.prepare`` on an empty cache: each shard fetched once, checked,
  kept, and the version's read-only directory assembled (what the node's first rank waits for);
- ``cache warm``: a rank reading every file of the prepared directory (later ranks and jobs
  on the node: no store traffic).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from aicluster.artifacts.datasets import DatasetFiles
from aicluster.artifacts.shards import manifest_hash, plan_folder, shard_chunks
from aicluster.artifacts.storage import BlobStorage, LocalStorage
from aicluster.runtime.gang.datacache import DataInput, NodeDataCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
from s3server import s3_server  # (the tests' SeaweedFS starter)

TENANT = "bench"


def store_dataset(files: DatasetFiles, folder: Path) -> DataInput:
    plan = plan_folder(folder)
    for index, shard in enumerate(plan.shards):
        with tempfile.TemporaryFile() as spool:
            for chunk in shard_chunks(plan, index):
                spool.write(chunk)
            spool.seek(0)
            files.put_shard(TENANT, shard["sha256"], spool)
    manifest = plan.manifest()
    digest = manifest_hash(manifest)
    files.put_manifest(TENANT, digest, manifest)
    return DataInput("bench", 1, digest)


def best_rate(size: int, repeat: int, run: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return size / best / 1e6


def measure(storage: BlobStorage, folder: Path, size: int, repeat: int) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="data-cache-bench-"))
    try:
        files = DatasetFiles(storage, work / "spool")
        wanted = store_dataset(files, folder)
        shards = [s["sha256"] for s in files.read_manifest(TENANT, wanted.manifest)["shards"]]

        def from_store() -> None:
            for sha in shards:
                digest = hashlib.sha256()
                for chunk in files.open_shard(TENANT, sha):
                    digest.update(chunk)
                assert digest.hexdigest() == sha

        def cold() -> None:
            shutil.rmtree(work / "cache", ignore_errors=True)
            NodeDataCache(work / "cache", files, 1 << 40).prepare(TENANT, wanted)

        view, _ = NodeDataCache(work / "cache", files, 1 << 40).prepare(TENANT, wanted)

        def warm() -> None:
            NodeDataCache(work / "cache", files, 1 << 40).prepare(TENANT, wanted)  # all hits
            for path in sorted(view.rglob("*")):
                if path.is_file():
                    with path.open("rb") as handle:
                        while handle.read(1 << 20):
                            pass

        rates = {"store": best_rate(size, repeat, from_store)}
        rates["cache cold"] = best_rate(size, repeat, cold)
        NodeDataCache(work / "cache", files, 1 << 40).prepare(TENANT, wanted)
        rates["cache warm"] = best_rate(size, repeat, warm)
        return rates
    finally:
        for folder_path, dirs, _ in os.walk(work):  # the sealed view is read-only
            for name in dirs:
                os.chmod(os.path.join(folder_path, name), 0o700)
        shutil.rmtree(work, ignore_errors=True)


def row(backend: str, rates: dict[str, float]) -> str:
    store, cold, warm = rates.values()
    return f"{backend:<8} {store:>9,.0f} {cold:>11,.0f} {warm:>11,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="dataset size in MB")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="data-cache-src-"))
    try:
        per_file = args.mb * 1_000_000 // args.files
        for index in range(args.files):
            (folder / f"part-{index:03d}.bin").write_bytes(os.urandom(per_file))
        size = per_file * args.files
        print(f"{size / 1e6:,.0f} MB in {args.files} files; best of {args.repeat}; MB/s")
        print(f"{'backend':<8} {'store':>9} {'cache cold':>11} {'cache warm':>11}")
        local_root = Path(tempfile.mkdtemp(prefix="data-cache-store-"))
        try:
            rates = measure(LocalStorage(local_root), folder, size, args.repeat)
        finally:
            shutil.rmtree(local_root, ignore_errors=True)
        print(row("local", rates))
        with s3_server() as settings:
            rates = measure(settings.open(folder), folder, size, args.repeat)
        print(row("s3", rates))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
