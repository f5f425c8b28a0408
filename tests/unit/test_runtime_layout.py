"""Pure runtime helpers: rank layout, bundles, selectors, names, rank environment, labels."""

import pytest

from aicluster.core import DomainLevel, Job, NodeShape, Parallelism, Placement, Slot, make_cluster
from aicluster.runtime.cluster.embedded import ray_start_command
from aicluster.runtime.gang.devices import NodeGpus, assign_devices
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
    RankSlot,
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


def test_a_rank_per_gpu_in_slot_order_with_local_ranks() -> None:
    layout = rank_layout(placement(("a", 2), ("a", 2), ("b", 2), ("b", 2)), 4, 2)
    assert [s.node for s in layout] == ["a"] * 4 + ["b"] * 4
    assert [s.worker for s in layout] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [s.local_rank for s in layout] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [s.node_rank for s in layout] == [0] * 4 + [1] * 4
    assert {s.local_world_size for s in layout} == {4}
    assert [s.rank for s in layout] == list(range(8))


def test_a_worker_without_gpus_is_one_rank() -> None:
    layout = rank_layout(placement(("a", 0), ("b", 0), ("a", 0)), 3, 0)
    assert [(s.node, s.local_rank) for s in layout] == [("a", 0), ("a", 1), ("b", 0)]


def test_ranks_go_domain_then_node_and_a_slots_ranks_stay_together() -> None:
    """Slots in placement order, nodes interleaved and domains out of order: a node's ranks
    come together, in domain order (floating ones last), each slot's ranks consecutive."""
    slots = (Slot("a", 2, 1), Slot("b", 2, 0), Slot("a", 2, 0), Slot("a", 2, -1))
    plan = Placement(slots, DomainLevel.RACK, "rack-0")
    layout = rank_layout(plan, 4, 2)
    assert [(s.node, s.nvlink_domain, s.worker) for s in layout] == [
        ("a", 0, 0), ("a", 0, 0), ("a", 1, 1), ("a", 1, 1),
        ("a", -1, 2), ("a", -1, 2), ("b", 0, 3), ("b", 0, 3),
    ]  # fmt: skip
    assert [s.local_rank for s in layout] == [0, 1, 2, 3, 4, 5, 0, 1]


def test_a_racks_ranks_come_together_when_the_placement_interleaves_racks() -> None:
    plan = placement(("a", 1), ("c", 1), ("b", 1), ("d", 1))
    racks = {"a": "r0", "b": "r0", "c": "r1", "d": "r1"}
    layout = rank_layout(plan, 4, 1, racks)
    assert [s.node for s in layout] == ["a", "b", "c", "d"]
    assert [s.node_rank for s in layout] == [0, 1, 2, 3]


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


def test_bundles_a_gpu_each_and_the_workers_cpus_and_memory_split_over_its_ranks() -> None:
    plan = placement(("a", 2), ("b", 2))
    spec = GangSpec("j", "x.py", plan, workers=2, gpus_per_worker=2, memory_gb_per_worker=1)
    layout = rank_layout(plan, 2, 2)
    made = bundles(spec, layout, {"a": GPU_RESOURCE, "b": SIM_GPU_RESOURCE})
    half = {"CPU": 0.5, "memory": float(1 << 29)}
    assert made == [{"GPU": 1.0, **half}] * 2 + [{SIM_GPU_RESOURCE: 1.0, **half}] * 2
    assert label_selectors(layout) == [{LABEL_NODE: "a"}] * 2 + [{LABEL_NODE: "b"}] * 2
    bare = GangSpec("j", "x.py", placement(("a", 0)), cpus_per_worker=0)
    assert bundles(bare, rank_layout(bare.placement, 1, 0), {})[0]["CPU"] > 0
    thirds = GangSpec("j", "x.py", placement(("a", 3)), gpus_per_worker=3, cpus_per_worker=1)
    made = bundles(thirds, rank_layout(thirds.placement, 1, 3), {"a": SIM_GPU_RESOURCE})
    assert [bundle["CPU"] for bundle in made] == [0.3333] * 3  # never more than the worker's


def test_a_ranks_launch_names_its_worker_whose_memory_its_ranks_share() -> None:
    """Ray's bundles split the worker's memory, but the hard limit is the worker's, shared by its
    ranks (a cgroup per worker): a rank's launch carries its worker and the worker's memory, and
    its share for the rlimit where no cgroup can be made."""
    plan = placement(("a", 8), ("b", 8))
    spec = GangSpec("j", "x.py", plan, workers=2, gpus_per_worker=8, memory_gb_per_worker=1)
    layout = rank_layout(plan, 2, 8)
    assert [slot.worker for slot in layout] == [0] * 8 + [1] * 8
    limits = spec.launch_for({}, layout[9].worker)["limits"]
    assert limits["worker"] == 1 and limits["workers"] == 2
    assert limits["worker_memory_gb"] == 1 and limits["memory_gb"] == 0.125
    assert spec.launch_for({})["limits"]["worker"] == 0


def test_names_round_trip_and_job_ids_cannot_hide_a_slash() -> None:
    assert parse_gang_name(gang_name("job-7", 3)) == ("job-7", 3)
    assert actor_name("job-7", 3, 1).startswith(gang_name("job-7", 3) + "/")
    assert parse_gang_name("someone-else/pg") is None
    with pytest.raises(ValueError):
        GangSpec("a/b", "x.py", placement(("a", 1)))


def env_of(spec: GangSpec, slot: RankSlot, gpu_resource: str | None) -> dict[str, str]:
    return rank_env(
        spec,
        slot,
        master_addr="10.0.0.1",
        master_port=1234,
        run_dir="/r",
        telemetry_file="/r/t",
        checkpoint_dir="/c",
        gpu_resource=gpu_resource,
    )


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
    env = env_of(spec, rank_layout(plan, 2, 1)[1], SIM_GPU_RESOURCE)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["NODE_RANK"]) == (
        "1",
        "2",
        "0",
        "1",
    )
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "1234")
    assert env["AICLUSTER_ACCELERATOR"] == "sim" and env["AICLUSTER_ATTEMPT"] == "2"
    assert (env["OMP_NUM_THREADS"], env["FOO"]) == ("4", "bar")


def test_each_rank_of_a_worker_gets_one_device_and_the_world_counts_gpus() -> None:
    plan = Placement((Slot("a", 4, -1), Slot("b", 4, -1)), DomainLevel.RACK, "rack-0")
    spec = GangSpec("j", "x.py", plan, workers=2, gpus_per_worker=4, cpus_per_worker=8)
    shapes = {"a": NodeGpus(8, 4), "b": NodeGpus(8, 4)}
    layout = assign_devices(rank_layout(plan, 2, 4), shapes, {})
    real = [env_of(spec, slot, GPU_RESOURCE) for slot in layout]
    assert {env["WORLD_SIZE"] for env in real} == {"8"}
    assert [env["LOCAL_RANK"] for env in real] == ["0", "1", "2", "3"] * 2
    assert {env["LOCAL_WORLD_SIZE"] for env in real} == {"4"}
    assert [env["CUDA_VISIBLE_DEVICES"] for env in real] == ["0", "1", "2", "3"] * 2
    assert real[0]["AICLUSTER_GPUS"] == "1" and real[0]["OMP_NUM_THREADS"] == "2"
    simulated = [env_of(spec, slot, SIM_GPU_RESOURCE) for slot in layout]
    assert all("CUDA_VISIBLE_DEVICES" not in env for env in simulated)
    assert [env["AICLUSTER_DEVICE_INDEX"] for env in simulated] == ["0", "1", "2", "3"] * 2
    assert {env["AICLUSTER_NVLINK_DOMAIN"] for env in simulated} == {"0"}
    cpu = GangSpec("j", "x.py", placement(("a", 0), ("b", 0)), workers=2, gpus_per_worker=0)
    env = env_of(cpu, rank_layout(cpu.placement, 2, 0)[1], None)
    assert (env["WORLD_SIZE"], env["AICLUSTER_ACCELERATOR"]) == ("2", "cpu")
    assert "AICLUSTER_DEVICE_INDEX" not in env


def test_devices_come_from_the_slots_domain_and_skip_indices_other_gangs_hold() -> None:
    # node a: domains {0,1} {2,3}; another gang holds 0 and 2; node b: one domain of 4.
    plan = Placement(
        (Slot("a", 1, 1), Slot("a", 1, 0), Slot("b", 2, 0)), DomainLevel.RACK, "rack-0"
    )
    layout = rank_layout(plan, 4, 1)  # the 2-GPU slot holds two 1-GPU workers
    shapes = {"a": NodeGpus(4, 2), "b": NodeGpus(4, 0)}
    placed = assign_devices(layout, shapes, {"a": {0, 2}, "b": {1}})
    assert [(s.node, s.nvlink_domain, s.device) for s in placed] == [
        ("a", 0, 1), ("a", 1, 3), ("b", 0, 0), ("b", 0, 2),
    ]  # fmt: skip
    # Domain 0 full by the records: its ranks go to the other domain, which has room.
    moved = assign_devices(layout, shapes, {"a": {0, 1}})
    assert [(s.nvlink_domain, s.device) for s in moved[:2]] == [(1, 2), (1, 3)]
    # Nothing left by the records (a gang of another state directory): ranks share indices.
    crowded = assign_devices(layout, shapes, {"a": {0, 1, 2, 3}})
    assert [(s.nvlink_domain, s.device) for s in crowded[:2]] == [(0, 0), (1, 2)]


def test_floating_workers_take_a_tensor_parallel_group_from_one_domain() -> None:
    """A worker of 4 GPUs on a node of domains of 2 floats; with tensor 2 each group is one
    domain's, the fullest that holds it; without room in one domain it spreads."""
    plan = Placement((Slot("a", 4, -1),), DomainLevel.NODE, "a")
    layout = rank_layout(plan, 1, 4)
    shapes = {"a": NodeGpus(8, 2)}
    placed = assign_devices(layout, shapes, {"a": {0, 2, 3}}, tensor=2)
    domains = [s.nvlink_domain for s in placed]
    assert domains[0] == domains[1] and domains[2] == domains[3]
    assert {s.device for s in placed}.isdisjoint({0, 2, 3})
    spread = assign_devices(layout, shapes, {"a": {0, 2, 4, 6}}, tensor=2)
    assert sorted(s.device for s in spread) == [1, 3, 5, 7]


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
    assert '--system-config={"enable_metrics_collection": false}' in head  # no open metrics port
    assert "--no-monitor" in head  # nor the autoscaler's
    assert "--include-log-monitor=False" in head  # nor the log monitor (log_to_driver=False)
    assert any(arg.startswith("--labels=") and "aicluster.io/node=node-0" in arg for arg in head)
    joined = ray_start_command(node, head_address="10.0.0.1:6379", gpu_resource=SIM_GPU_RESOURCE)
    assert "--address=10.0.0.1:6379" in joined
    assert '--resources={"aicluster/gpu": 8.0}' in joined
