"""The model registry's costs: registering a version, loading it, and tiny_gpt's predict latency.

Prints figures, asserts nothing. Trains nothing: exports an untrained tiny_gpt of the default size
(2 layers, 64 wide, 64-character context), registers it N times in a SQLite or PostgreSQL store
(copy, fsync-free read-only files, one transaction each), loads it with ``load_predictor`` and
times greedy completions with 1 and with the default number of torch threads.

    .venv/bin/python bench/registry.py
    .venv/bin/python bench/registry.py --url postgresql://postgres@127.0.0.1/test --count 50
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from aicluster.core import Tenant
from aicluster.store import Store
from aicluster.train.export import categorical_reference, export_model, load_predictor

JOBS = Path(__file__).resolve().parents[1] / "examples" / "jobs"
TEXT = (JOBS.parent / "data" / "coriolanus.txt").read_text(encoding="utf-8")


def export_tiny_gpt(directory: Path) -> Path:
    spec = importlib.util.spec_from_file_location("bench_tiny_gpt", JOBS / "tiny_gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    vocab = sorted(set(TEXT))
    torch.manual_seed(0)
    model = module.TinyGPT(len(vocab), 64, 64, 2, 4)
    config = {"vocab": "".join(vocab), "block": 64, "width": 64, "layers": 2, "heads": 4}
    return export_model(
        model,
        entrypoint="tiny_gpt.py:load_for_serving",
        config=config,
        metrics={"loss": 4.0},
        drift=categorical_reference(TEXT, vocab, feature="prompt"),
        directory=directory,
        code_dir=JOBS,
    )


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p50 = statistics.median(ordered) * 1000
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000
    return f"p50 {p50:7.2f} ms  p99 {p99:7.2f} ms"


def bench_register(store: Store, source: Path, count: int) -> None:
    store.create_tenant(Tenant("bench"), "bench")
    times = []
    for i in range(count):
        start = time.perf_counter()
        store.register_model_version(
            "bench",
            "tiny-gpt",
            source_dir=source,
            job_id=f"j-{i}",
            spec_hash=None,
            code_version="0" * 64,
            dataset_hash=None,
            metrics={"loss": 4.0},
            registered_by="bench",
        )
        times.append(time.perf_counter() - start)
    size = sum(f.stat().st_size for f in source.rglob("*") if f.is_file())
    print(f"register ({size / 1024:.0f} KiB artifact, {store.dialect}, n={count}): {ms(times)}")
    start = time.perf_counter()
    store.get_model_version("bench", "tiny-gpt")
    print(f"get latest version: {(time.perf_counter() - start) * 1000:.2f} ms")


def bench_predict(source: Path, repeats: int) -> None:
    start = time.perf_counter()
    predictor = load_predictor(source)
    print(f"load_predictor: {(time.perf_counter() - start) * 1000:.1f} ms")
    prompt = {"prompt": "First Citizen:\n"}
    default_threads = torch.get_num_threads()
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        for tokens in (8, 32):
            request = {**prompt, "max_new_tokens": tokens}
            predictor.predict(request)  # warm up
            times = []
            for _ in range(repeats):
                begin = time.perf_counter()
                predictor.predict(request)
                times.append(time.perf_counter() - begin)
            print(f"predict {tokens:2d} tokens, {threads} torch thread(s): {ms(times)}")
    torch.set_num_threads(default_threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=None, help="database URL (default: SQLite in a tmp dir)")
    parser.add_argument("--count", type=int, default=30, help="registrations")
    parser.add_argument("--repeats", type=int, default=30, help="predictions per setting")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        source = export_tiny_gpt(Path(tmp) / "export")
        with Store.open(args.url or Path(tmp) / "state", state_dir=Path(tmp) / "state") as store:
            bench_register(store, source, args.count)
        bench_predict(source, args.repeats)


if __name__ == "__main__":
    main()
