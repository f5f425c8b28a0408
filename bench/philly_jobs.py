"""The Philly trace's jobs for the replay benches, optionally each asking for CPUs and memory
in proportion to its GPUs (the trace has neither: the scheduler's host placement then runs)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from aicluster.sim import TraceJob, load_philly

__all__ = ["add_host_options", "philly_jobs"]


def add_host_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpus-per-gpu", type=float, default=0.0)
    parser.add_argument("--memory-per-gpu", type=float, default=0.0, help="GB")


def philly_jobs(limit: int | None, args: argparse.Namespace) -> list[TraceJob]:
    """The first ``limit`` jobs (all: None), with the CPUs and memory ``args`` ask per GPU."""
    jobs = load_philly()[:limit]
    if not (args.cpus_per_gpu or args.memory_per_gpu):
        return jobs
    return [
        replace(
            job, cpus=job.num_gpus * args.cpus_per_gpu, memory_gb=job.num_gpus * args.memory_per_gpu
        )
        for job in jobs
    ]
