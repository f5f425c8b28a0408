"""Pure runtime helpers: rank layout, bundles, selectors, names, rank environment, labels."""

import pytest

from aicluster.core import DomainLevel, Job, NodeShape, Parallelism, Placement, Slot, make_cluster
from aicluster.runtime.embedded import ray_start_command
from aicluster.runtime.labels import (
    GPU_RESOURCE,
    LABEL_NODE,
    SIM_GPU_RESOURCE,
    gpu_resource_of,
    node_from_ray,
    node_labels,
    node_resources,
)
from aicluster.runtime.layout import (
    GangSpec,
    actor_name,
    bundles,
    gang_name,
    label_selectors,
    parse_gang_name,
    rank_env,
    rank_layout,
)


def placement(*slots: tuple[str, int]) -> Placement:
    return Placement(tuple(Slot(node, gpus) for node, gpus in slots), DomainLevel.RACK, "rack-0")


def test_one_slot_per_worker_keeps_rank_order_and_local_ranks() -> None:
    layout = rank_layout(placement(("a", 2), ("a", 2), ("b", 2), ("b", 2)), 4, 2)
    assert [s.node for s in layout] == ["a", "a", "b", "b"]
    assert [s.local_rank for s in layout] == [0, 1, 0, 1]
    assert [s.node_rank for s in layout] == [0, 0, 1, 1]
    assert {s.local_world_size for s in layout} == {2}


def test_tensor_parallel_slot_holds_several_workers() -> None:
    job = Job(id="j", tenant="t", workers=8, gpus_per_worker=1, parallelism=Parallelism(tensor=4))
    layout = rank_layout(placement(("a", 4), ("b", 4)), job.workers, job.gpus_per_worker)
    assert [s.node for s in layout] == ["a"] * 4 + ["b"] * 4
    assert layout[5].local_rank == 1


def test_layout_rejects_a_placement_of_the_wrong_size() -> None:
    with pytest.raises(ValueError, match="placement holds"):
        rank_layout(placement(("a", 4)), 2, 4)
    with pytest.raises(ValueError, match="whole workers"):
        rank_layout(placement(("a", 3)), 2, 2)


def test_bundles_use_each_nodes_gpu_resource_and_never_come_out_empty() -> None:
    plan = placement(("a", 2), ("b", 2))
    spec = GangSpec("j", "x.py", plan, workers=2, gpus_per_worker=2, memory_gb_per_worker=1)
    layout = rank_layout(plan, 2, 2)
    made = bundles(spec, layout, {"a": GPU_RESOURCE, "b": SIM_GPU_RESOURCE})
    assert made == [
        {"GPU": 2.0, "CPU": 1.0, "memory": float(1 << 30)},
        {SIM_GPU_RESOURCE: 2.0, "CPU": 1.0, "memory": float(1 << 30)},
    ]
    assert label_selectors(layout) == [{LABEL_NODE: "a"}, {LABEL_NODE: "b"}]
    bare = GangSpec("j", "x.py", placement(("a", 0)), cpus_per_worker=0)
    assert bundles(bare, rank_layout(bare.placement, 1, 0), {})[0]["CPU"] > 0


def test_names_round_trip_and_job_ids_cannot_hide_a_slash() -> None:
    assert parse_gang_name(gang_name("job-7", 3)) == ("job-7", 3)
    assert actor_name("job-7", 3, 1).startswith(gang_name("job-7", 3) + "/")
    assert parse_gang_name("someone-else/pg") is None
    with pytest.raises(ValueError):
        GangSpec("a/b", "x.py", placement(("a", 1)))


def test_rank_env_sets_torch_and_aicluster_variables_and_user_env_cannot_override_rank() -> None:
    plan = placement(("a", 1), ("b", 1))
    spec = GangSpec(
        "j",
        "x.py",
        plan,
        workers=2,
        gpus_per_worker=1,
        attempt=2,
        env={"RANK": "9", "OMP_NUM_THREADS": "4", "FOO": "bar"},
    )
    slot = rank_layout(plan, 2, 1)[1]
    env = rank_env(
        spec,
        slot,
        master_addr="10.0.0.1",
        master_port=1234,
        run_dir="/r",
        telemetry_file="/r/t",
        checkpoint_dir="/c",
        gpu_resource=SIM_GPU_RESOURCE,
    )
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["NODE_RANK"]) == (
        "1",
        "2",
        "0",
        "1",
    )
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "1234")
    assert env["AICLUSTER_ACCELERATOR"] == "sim" and env["AICLUSTER_ATTEMPT"] == "2"
    assert (env["OMP_NUM_THREADS"], env["FOO"]) == ("4", "bar")


def test_spec_from_a_scheduler_job() -> None:
    job = Job(id="j", tenant="t", workers=2, gpus_per_worker=4, cpus_per_worker=3)
    spec = GangSpec.for_job(job, placement(("a", 4), ("a", 4)), "x.py", ["--steps", "5"])
    assert (spec.workers, spec.gpus_per_worker, spec.cpus_per_worker) == (2, 4, 3)
    slot = spec.to_dict()["placement"]["slots"][0]
    assert slot == {"node": "a", "gpus": 4, "nvlink_domain": 0, "cpus": 0.0, "memory_gb": 0.0}


def test_node_labels_and_resources_round_trip_through_ray_form() -> None:
    for node in make_cluster(
        nodes=4,
        gpus_per_node=8,
        nodes_per_rack=2,
        shape=NodeShape(gpu_type="sim-gpu", nvlink_domain_size=4, cpus=2, memory_gb=4),
    ).nodes:
        resources = {"CPU": node.cpus, "memory": node.memory_gb * (1 << 30), **node_resources(node)}
        assert node_from_ray(node_labels(node), resources) == node


def test_gpu_resource_prefers_real_gpus_and_unlabelled_nodes_are_not_aicluster_nodes() -> None:
    assert gpu_resource_of({"GPU": 8, SIM_GPU_RESOURCE: 8}) == GPU_RESOURCE
    assert gpu_resource_of({"CPU": 4}) is None
    assert node_from_ray({"ray.io/node-id": "x"}, {"CPU": 4}) is None
    node = node_from_ray(
        {LABEL_NODE: "n", "ray.io/accelerator-type": "A100", "team": "x"}, {"GPU": 4.0}
    )
    assert node is not None
    assert (node.gpus, node.gpu_type, node.labels) == (4, "A100", {"team": "x"})


def test_ray_start_command_carries_labels_and_resources() -> None:
    node = make_cluster(nodes=1, gpus_per_node=8).nodes[0]
    head = ray_start_command(node)
    assert head[:3] == ["ray", "start", "--head"] and "--num-gpus=8" in head
    assert any(arg.startswith("--labels=") and "aicluster.io/node=node-0" in arg for arg in head)
    joined = ray_start_command(node, head_address="10.0.0.1:6379", gpu_resource=SIM_GPU_RESOURCE)
    assert "--address=10.0.0.1:6379" in joined
    assert '--resources={"aicluster/gpu": 8.0}' in joined
