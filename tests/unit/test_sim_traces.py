"""Trace loaders, the GPU-count-to-gang mapping and the synthetic generator."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from aicluster.core import PRIORITY_CLASSES
from aicluster.sim import (
    SyntheticMix,
    TraceError,
    arrival_rate,
    gang_shape,
    load_csv,
    load_philly,
    load_trace,
    synthetic_jobs,
)
from aicluster.sim.synthetic import _choice


@pytest.mark.parametrize(
    ("gpus", "shape"),
    [
        (1, (1, 1)),
        (6, (1, 6)),
        (8, (1, 8)),
        (12, (3, 4)),
        (16, (2, 8)),
        (24, (3, 8)),
        (128, (16, 8)),
    ],
)
def test_gang_shape_keeps_small_jobs_on_one_node_and_splits_big_ones(
    gpus: int, shape: tuple[int, int]
) -> None:
    assert gang_shape(gpus, 8) == shape


def test_the_packaged_philly_trace_loads_sorted_with_tenants() -> None:
    jobs = load_trace("philly")
    assert len(jobs) == 82_247
    assert jobs[0].submit_time == 0.0
    assert all(a.submit_time <= b.submit_time for a, b in itertools.pairwise(jobs))
    assert len({job.tenant for job in jobs}) == 15
    assert sum(job.num_gpus == 128 for job in jobs) == 3
    assert jobs[-1] == load_philly()[-1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_a_generic_csv_with_optional_columns(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "submit_time,duration,num_gpus,tenant,priority,gpu_type,note\n"
        "10,60,2,vision,high,A100,x\n"
        "0,30,1,,,,\n",
    )
    first, second = load_csv(path)
    assert (first.id, first.submit_time, first.tenant) == ("job-2", 0.0, "default")
    assert (second.priority, second.gpu_type, second.num_gpus) == (
        PRIORITY_CLASSES["high"],
        "A100",
        2,
    )


def test_a_generic_csv_carries_cpus_and_memory_and_jobs_without_gpus(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "submit_time,duration,num_gpus,cpus,memory_gb\n0,60,16,32,256\n1,60,0,4,\n2,60,1,,\n",
    )
    gpu_job, cpu_job, plain = load_csv(path)
    assert (gpu_job.cpus, gpu_job.memory_gb) == (32.0, 256.0)
    assert (cpu_job.num_gpus, cpu_job.cpus, cpu_job.memory_gb) == (0, 4.0, 0.0)
    assert (plain.cpus, plain.memory_gb) == (0.0, 0.0)
    assert gang_shape(0, 8) == (1, 0)


def test_a_generic_csv_carries_communication_sensitivities(tmp_path: Path) -> None:
    path = write(tmp_path, "submit_time,duration,num_gpus,comm_sensitivity\n0,60,16,0.3\n1,60,8,\n")
    given, default = load_csv(path)
    assert (given.comm_sensitivity, default.comm_sensitivity) == (0.3, None)
    bad = write(tmp_path, "submit_time,duration,num_gpus,comm_sensitivity\n0,60,16,1.5\n")
    with pytest.raises(TraceError) as caught:
        load_csv(bad)
    assert str(caught.value) == f"{bad}:2: comm_sensitivity must lie between 0 and 1, got '1.5'"


def test_the_simulator_places_a_traces_cpus_and_memory(tmp_path: Path) -> None:
    """Two CPU-heavy jobs of 1 GPU each cannot share a node's 16 CPUs: the second waits for the
    first although 7 GPUs stay free."""
    from aicluster.core import NodeShape, make_cluster
    from aicluster.sim import simulate

    path = write(tmp_path, "submit_time,duration,num_gpus,cpus\n0,100,1,12\n1,100,1,12\n")
    cluster = make_cluster(nodes=1, gpus_per_node=8, shape=NodeShape(cpus=16, memory_gb=64))
    result = simulate(cluster, load_csv(path), "fifo")
    starts = dict(zip(result.jobs.ids, result.jobs.start, strict=True))
    assert starts == {"job-1": 0.0, "job-2": 100.0}


@pytest.mark.parametrize(
    ("rows", "line", "message"),
    [
        ("0,60,1\n5,abc,1\n", 3, "duration must be a positive number, got 'abc'"),
        ("0,0,1\n", 2, "duration must be a positive number, got '0'"),
        ("-1,60,1\n", 2, "submit_time must be a non-negative number, got '-1'"),
        ("0,60,two\n", 2, "num_gpus must be a whole number of GPUs (at least 0), got 'two'"),
        ("0,60,0\n", 2, "a job must ask for GPUs, CPUs or memory (num_gpus, cpus, memory_gb)"),
        ("0,60\n", 2, "expected 3 fields, got 2"),
    ],
)
def test_a_bad_row_names_file_line_and_problem(
    tmp_path: Path, rows: str, line: int, message: str
) -> None:
    path = write(tmp_path, "submit_time,duration,num_gpus\n" + rows)
    with pytest.raises(TraceError) as caught:
        load_trace(str(path))
    assert str(caught.value) == f"{path}:{line}: {message}"


def test_missing_columns_and_missing_files_are_reported(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"trace.csv:1: missing column\(s\) num_gpus"):
        load_trace(str(write(tmp_path, "submit_time,duration\n0,1\n")))
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(str(tmp_path / "absent.csv"))


def test_a_philly_formatted_csv_is_recognised_by_its_header(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-01 00:01:00,60,1,60,b\n"
        "2017-10-01 00:00:00,30,2,60,a\n"
        "2017-10-01 00:00:aa,30,2,60,a\n",
    )
    with pytest.raises(TraceError, match=r"trace\.csv:4: timestamp must be"):
        load_trace(str(path))
    path.write_text("\n".join(path.read_text().splitlines()[:3]) + "\n")
    jobs = load_trace(str(path))
    assert [(job.submit_time, job.tenant, job.num_gpus) for job in jobs] == [
        (0.0, "a", 2),
        (60.0, "b", 1),
    ]


def test_the_synthetic_generator_offers_the_requested_load() -> None:
    mix = SyntheticMix(gpu_scale=8)
    horizon = 20 * 86_400.0
    jobs = list(
        synthetic_jobs(random.Random(1), total_gpus=1024, load=0.7, horizon=horizon, mix=mix)
    )
    assert all(a.submit_time <= b.submit_time < horizon for a, b in itertools.pairwise(jobs))
    assert {job.num_gpus for job in jobs} <= {8 * gpus for gpus, _ in mix.gpu_mix}
    expected = arrival_rate(1024, 0.7, mix) * horizon
    assert len(jobs) == pytest.approx(expected, rel=0.05)
    offered = sum(job.num_gpus * job.duration for job in jobs) / horizon / 1024
    assert offered == pytest.approx(0.7, rel=0.25)  # heavy-tailed durations: a loose check
    again = list(
        synthetic_jobs(random.Random(1), total_gpus=1024, load=0.7, horizon=horizon, mix=mix)
    )
    assert again == jobs


def test_the_clipped_lognormal_mean_matches_sampling() -> None:
    mix = SyntheticMix(max_duration=86_400.0)
    rng = random.Random(5)
    draws = [min(max(1.0, rng.lognormvariate(7.04, 2.2)), 86_400.0) for _ in range(200_000)]
    assert sum(draws) / len(draws) == pytest.approx(mix.mean_duration(), rel=0.02)
    assert SyntheticMix().mean_duration() / 3600 == pytest.approx(3.56, rel=0.05)


def test_the_generator_draws_a_choice_as_random_choices_does() -> None:
    """``_choice`` replaces ``rng.choices(..., cum_weights=...)[0]`` for speed: the same draw from
    the same state, so a seed gives the workload it always gave."""
    population, weights = ["a", "b", "c", "d"], [1, 5, 5, 9]
    ours, theirs = random.Random(3), random.Random(3)
    for _ in range(2_000):
        assert (
            _choice(ours, population, weights) == theirs.choices(population, cum_weights=weights)[0]
        )
    assert ours.random() == theirs.random()  # the same state after
