"""Core domain types: validation, state machine, cluster and tenant files."""

import pytest

from aicluster.core import (
    ConfigError,
    DomainLevel,
    IllegalTransition,
    Job,
    JobState,
    Parallelism,
    check_transition,
    make_cluster,
    parse_cluster,
    parse_tenants,
    priority_of,
)


def test_generated_cluster_fills_racks_and_pods() -> None:
    cluster = make_cluster(nodes=64, gpus_per_node=8, nodes_per_rack=16, racks_per_pod=2)
    assert cluster.total_gpus == 512
    assert len(cluster.racks()) == 4
    assert len(cluster.pods()) == 2


def test_job_units_follow_workers_and_tensor_parallelism() -> None:
    job = Job(id="j", tenant="a", workers=8, gpus_per_worker=1, parallelism=Parallelism(tensor=4))
    assert (job.unit_gpus, job.units, job.needs_nvlink) == (4, 2, True)
    with pytest.raises(ValueError, match="divide"):
        Job(id="k", tenant="a", workers=1, gpus_per_worker=3, parallelism=Parallelism(tensor=2))


def test_state_machine_refuses_leaving_a_terminal_state() -> None:
    check_transition(JobState.PENDING, JobState.STARTING)
    with pytest.raises(IllegalTransition):
        check_transition(JobState.SUCCEEDED, JobState.RUNNING)


def test_priority_names_and_numbers() -> None:
    assert priority_of("high") > priority_of("normal") > priority_of("low")
    assert priority_of("250") == 250
    with pytest.raises(ValueError, match="unknown priority"):
        priority_of("urgent")


def test_cluster_file_layout_and_explicit_nodes() -> None:
    cluster = parse_cluster(
        """
name: small
defaults: {gpus: 8, gpu_type: A100}
layout: {pods: 1, racks_per_pod: 2, nodes_per_rack: 2}
nodes:
  - {name: big, rack: rack-9, pod: pod-1, gpus: 4, gpu_type: H100, nvlink_domain_size: 2}
""",
        "small.yaml",
    )
    assert len(cluster.nodes) == 5
    assert cluster.gpus_by_type() == {"A100": 32, "H100": 4}
    assert cluster.nodes[-1].nvlink_domains == 2


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("name: x\nlayout: {nodes_per_rack: -1}\n", 2, "at least 1"),
        ("name: x\nlayout:\n  nodes_per_rack: 2\n  gpus: eight\n", 4, "must be an integer"),
        ("name: x\nlayot: {}\n", 2, "unknown field 'layot'"),
        ("name: x\nlayout: [1, 2\n", 3, "not valid YAML"),
        ("name: x\n", 1, "no nodes"),
    ],
)
def test_cluster_file_errors_name_file_and_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_cluster(text, "bad.yaml")
    assert caught.value.source == "bad.yaml"
    assert caught.value.line == line
    assert fragment in str(caught.value)


def test_tenants_file() -> None:
    tenants = parse_tenants(
        "tenants:\n  - {name: vision, quota: {A100: 16}, borrow_limit: {A100: 8}, weight: 2}\n"
    )
    vision = tenants["vision"]
    assert vision.quota_for("A100") == 16
    assert vision.quota_for("H100") == 0
    assert vision.borrow_limit_for("A100") == 8
    with pytest.raises(ConfigError, match="listed twice"):
        parse_tenants("tenants:\n  - {name: a}\n  - {name: a}\n")


def test_domain_level_parse() -> None:
    assert DomainLevel.parse("Rack") is DomainLevel.RACK
    with pytest.raises(ValueError, match="unknown topology level"):
        DomainLevel.parse("row")
