"""A gang's shape, computed purely: names in Ray, ranks on nodes, bundles, selectors, environment.

Nothing here talks to Ray; :mod:`aicluster.runtime.gang.launch` applies it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aicluster.core import Job, Placement
from aicluster.core.numbers import ascii_int
from aicluster.runtime.labels import GPU_RESOURCE, LABEL_NODE, SIM_GPU_RESOURCE
from aicluster.train import env as train_env

__all__ = [
    "GANG_PREFIX",
    "NAMESPACE",
    "GangSpec",
    "RankSlot",
    "actor_name",
    "bundles",
    "gang_name",
    "label_selectors",
    "parse_gang_name",
    "rank_env",
    "rank_layout",
]

#: The Ray namespace holding every gang's placement group and actors.
NAMESPACE = "aicluster"
GANG_PREFIX = "aicluster-gang"

# Ray refuses a bundle without resources; a worker that asks for nothing takes this much CPU.
_MIN_CPU = 0.01


@dataclass(frozen=True)
class GangSpec:
    """What to run for one attempt of a job, and where (``placement`` from the scheduler).

    ``entrypoint`` is a Python file of the job's code run as ``python -u entrypoint *args`` (or
    ``module`` as ``python -u -m module *args``) in a fresh copy of that code on each node: the
    tree ``code`` (its SHA-256) that ``tenant`` shipped, else the node's folder ``working_dir``
    (trusted callers only: tests, an operator's job), else an empty folder. ``user`` is the
    tenant's ``(uid, gid)``: its ranks then run in the tenant's sandbox
    (:mod:`aicluster.runtime.sandbox.bwrap`); None runs them unsandboxed, as the node's own user.
    ``cpus_per_worker`` and ``memory_gb_per_worker`` are reserved in Ray besides the GPUs.
    ``secrets`` are the job's sealed secrets (name -> token,
    :mod:`aicluster.runtime.sandbox.secretbox`): each rank's actor opens them into its process's
    environment; only their names are written to the run directory.
    """

    job_id: str
    entrypoint: str | None
    placement: Placement
    workers: int = 1
    gpus_per_worker: int = 0
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    attempt: int = 0
    cpus_per_worker: float = 1.0
    memory_gb_per_worker: float = 0.0
    working_dir: str | None = None
    module: str | None = None
    tenant: str = "default"
    code: str | None = None
    user: tuple[int, int] | None = None
    disk_gb: float | None = None  # cap on the job's data directory (sandboxed jobs)
    disk_limit: str = "poll"  # how it is held: "loop" (a mount of its own) or "poll"
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    tensor: int = 1  # the spec's tensor-parallel degree: GPUs a tensor-parallel group spans

    def __post_init__(self) -> None:
        if not self.job_id or "/" in self.job_id:
            raise ValueError(f"job id {self.job_id!r} must be non-empty and contain no '/'")
        if (self.entrypoint is None) == (self.module is None):
            raise ValueError("give either an entrypoint or a module")
        if self.attempt < 0:
            raise ValueError("attempt cannot be negative")
        if self.tensor < 1:
            raise ValueError("tensor parallelism must be at least 1")

    @property
    def ranks_per_worker(self) -> int:
        """A rank per GPU; a worker without GPUs is one rank."""
        return max(self.gpus_per_worker, 1)

    @property
    def cpus_per_rank(self) -> float:
        """The worker's CPUs split evenly over its ranks (Ray accepts fractional CPUs)."""
        return self.cpus_per_worker / self.ranks_per_worker

    @property
    def memory_gb_per_rank(self) -> float:
        """A rank's share of its worker's memory: its Ray bundle's, and its rlimit where no cgroup
        can be made (with a cgroup the worker's ranks share all of it)."""
        return self.memory_gb_per_worker / self.ranks_per_worker

    @classmethod
    def for_job(
        cls,
        job: Job,
        placement: Placement,
        entrypoint: str | None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        attempt: int = 0,
        working_dir: str | None = None,
        *,
        module: str | None = None,
        code: str | None = None,
        user: tuple[int, int] | None = None,
        disk_gb: float | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> GangSpec:
        """The spec of a scheduler :class:`Job` admitted on ``placement``."""
        return cls(
            job_id=job.id,
            entrypoint=entrypoint,
            module=module,
            tenant=job.tenant,
            code=code,
            user=user,
            disk_gb=disk_gb,
            placement=placement,
            workers=job.workers,
            gpus_per_worker=job.gpus_per_worker,
            args=tuple(args),
            env=dict(env or {}),
            attempt=attempt,
            cpus_per_worker=job.cpus_per_worker,
            memory_gb_per_worker=job.memory_gb_per_worker,
            working_dir=working_dir,
            secrets=dict(secrets or {}),
            tensor=job.parallelism.tensor,
        )

    def launch_for(self, rank_vars: Mapping[str, str], worker: int = 0) -> dict[str, Any]:
        """What a rank's actor needs to start its process (see ``RankWorker.start``); ``worker``
        is the index of the rank's worker (:attr:`RankSlot.worker`)."""
        return {
            "entrypoint": self.entrypoint,
            "module": self.module,
            "args": list(self.args),
            "env": dict(rank_vars),
            "secrets": dict(self.secrets),  # sealed
            "code": {"tenant": self.tenant, "sha256": self.code, "folder": self.working_dir},
            "user": list(self.user) if self.user else None,
            # The rank's share of its worker's CPUs; the worker's memory, which its ranks share
            # (its cgroup), and the rank's share of it (an rlimit where no cgroup can be made).
            "limits": {
                "memory_gb": self.memory_gb_per_rank,
                "cpus": self.cpus_per_rank,
                "worker_memory_gb": self.memory_gb_per_worker,
                "worker": worker,
                "workers": self.workers,
                "disk_gb": self.disk_gb,
                "disk_limit": self.disk_limit,
            },
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, written to the run directory so a restarted control plane has it."""
        return {
            "job_id": self.job_id,
            "tenant": self.tenant,
            "entrypoint": self.entrypoint,
            "module": self.module,
            "code": self.code,
            "user": list(self.user) if self.user else None,
            "args": list(self.args),
            "env": dict(self.env),
            "secrets": sorted(self.secrets),  # names only
            "workers": self.workers,
            "gpus_per_worker": self.gpus_per_worker,
            "tensor": self.tensor,
            "attempt": self.attempt,
            "cpus_per_worker": self.cpus_per_worker,
            "memory_gb_per_worker": self.memory_gb_per_worker,
            "working_dir": self.working_dir,
            "placement": {
                "level": self.placement.level.label,
                "domain": self.placement.domain,
                "slots": [
                    {
                        "node": s.node,
                        "gpus": s.gpus,
                        "nvlink_domain": s.nvlink_domain,
                        "cpus": s.cpus,
                        "memory_gb": s.memory_gb,
                    }
                    for s in self.placement.slots
                ],
            },
        }


@dataclass(frozen=True, slots=True)
class RankSlot:
    """Where one rank runs: its node, its index among the gang's ranks on that node, the NVLink
    domain of its GPU (-1: the scheduler let its worker's GPUs float over the node's domains)
    and, once :func:`aicluster.runtime.gang.devices.assign_devices` chose it, its GPU's index on the
    node. ``worker`` is the index of the worker (a placement unit's share) the rank belongs to."""

    rank: int
    node: str
    local_rank: int
    local_world_size: int
    node_rank: int
    nvlink_domain: int = 0
    worker: int = 0
    device: int | None = None


def gang_name(job_id: str, attempt: int) -> str:
    """Name of the attempt's placement group (unique per job and attempt)."""
    return f"{GANG_PREFIX}/{job_id}/{attempt}"


def actor_name(job_id: str, attempt: int, rank: int) -> str:
    return f"{gang_name(job_id, attempt)}/rank-{rank}"


def parse_gang_name(name: str) -> tuple[str, int] | None:
    """``(job_id, attempt)`` of a placement group name made by :func:`gang_name`, else None."""
    parts = name.split("/")
    attempt = ascii_int(parts[2]) if len(parts) == 3 else None
    if attempt is None or parts[0] != GANG_PREFIX:
        return None
    return parts[1], attempt


def rank_layout(
    placement: Placement,
    workers: int,
    gpus_per_worker: int,
    racks: Mapping[str, str] | None = None,
) -> tuple[RankSlot, ...]:
    """A rank per GPU (a rank per worker without GPUs), numbered so the placement shows in it:
    a rack's ranks are consecutive (``racks``: node name to rack), then a node's (racks and
    nodes in placement order), and inside a node those of one NVLink domain (floating workers
    last). A slot
    holds one placement unit, i.e. one worker, or several workers of one tensor-parallel group
    (``slot.gpus // gpus_per_worker`` of them); its ranks stay consecutive, so a tensor-parallel
    group (``train.mesh()`` lays tp innermost) is consecutive ranks of one slot.

    Raises ``ValueError`` when the placement does not hold exactly ``workers`` workers.
    """
    located = _workers_in_rank_order(_workers_of(placement, workers, gpus_per_worker), racks)
    per_worker = max(gpus_per_worker, 1)
    node_order = list(dict.fromkeys(node for node, _ in located))
    per_node = {node: per_worker * sum(1 for n, _ in located if n == node) for node in node_order}
    seen: dict[str, int] = {}
    layout: list[RankSlot] = []
    for worker, (node, domain) in enumerate(located):
        for _ in range(per_worker):
            local = seen.get(node, 0)
            seen[node] = local + 1
            rank = len(layout)
            node_rank = node_order.index(node)
            layout.append(RankSlot(rank, node, local, per_node[node], node_rank, domain, worker))
    return tuple(layout)


def _workers_of(placement: Placement, workers: int, gpus_per_worker: int) -> list[tuple[str, int]]:
    """``(node, NVLink domain)`` of each worker, in placement order."""
    located: list[tuple[str, int]] = []
    if len(placement.slots) == workers:
        located = [(slot.node, slot.nvlink_domain) for slot in placement.slots]
    elif gpus_per_worker > 0:
        for slot in placement.slots:
            if slot.gpus % gpus_per_worker:
                raise ValueError(
                    f"slot of {slot.gpus} GPUs on {slot.node} does not hold whole workers of "
                    f"{gpus_per_worker} GPUs"
                )
            located += [(slot.node, slot.nvlink_domain)] * (slot.gpus // gpus_per_worker)
    if len(located) != workers:
        raise ValueError(
            f"placement holds {len(located) or len(placement.slots)} workers, the job has {workers}"
        )
    return located


def _workers_in_rank_order(
    located: list[tuple[str, int]], racks: Mapping[str, str] | None
) -> list[tuple[str, int]]:
    """Workers grouped by rack, then node (each in placement order), then NVLink domain;
    stable, so a slot's workers stay together and in order."""
    node_order = {node: i for i, node in enumerate(dict.fromkeys(n for n, _ in located))}
    rack_of = {node: (racks or {}).get(node, "") for node in node_order}
    rack_order = {rack: i for i, rack in enumerate(dict.fromkeys(rack_of.values()))}

    def key(worker: tuple[str, int]) -> tuple[int, int, int]:
        node, domain = worker
        return rack_order[rack_of[node]], node_order[node], domain if domain >= 0 else 1 << 30

    return sorted(located, key=key)


def bundles(
    spec: GangSpec, layout: Sequence[RankSlot], gpu_resources: Mapping[str, str]
) -> list[dict[str, float]]:
    """One placement-group bundle per rank: its GPU (in the resource its node counts them in)
    and its share of the worker's CPUs and memory. ``gpu_resources`` maps node name to ``GPU``
    or the simulated resource."""
    made = []
    for slot in layout:
        bundle: dict[str, float] = {}
        if spec.gpus_per_worker:
            bundle[gpu_resources.get(slot.node, SIM_GPU_RESOURCE)] = 1.0
        if spec.cpus_per_worker:
            bundle["CPU"] = _ray_quantity(spec.cpus_per_rank)
        if spec.memory_gb_per_worker:
            bundle["memory"] = float(int(spec.memory_gb_per_rank * (1 << 30)))
        made.append(bundle or {"CPU": _MIN_CPU})
    return made


def _ray_quantity(amount: float) -> float:
    """``amount`` rounded down to Ray's resource precision (1e-4), so a worker's bundles never
    ask for more than the worker, but at least the floor Ray needs in a bundle (0.01)."""
    return max(_MIN_CPU, int(amount * 10_000) / 10_000)


def label_selectors(layout: Sequence[RankSlot]) -> list[dict[str, str]]:
    """Per-bundle label selectors pinning each rank to the node the scheduler chose."""
    return [{LABEL_NODE: slot.node} for slot in layout]


def rank_env(
    spec: GangSpec,
    slot: RankSlot,
    *,
    master_addr: str,
    master_port: int,
    run_dir: str,
    telemetry_file: str,
    checkpoint_dir: str,
    gpu_resource: str | None,
) -> dict[str, str]:
    """The environment of one rank's process: torch's ``env://`` variables plus aicluster's.

    The job's own ``env`` wins over nothing but the thread defaults (``OMP_NUM_THREADS``):
    rank identity is always the runtime's.
    """
    made = {"OMP_NUM_THREADS": str(max(1, int(spec.cpus_per_rank)))}
    made.update(spec.env)
    made.update(
        {
            train_env.RANK: str(slot.rank),
            train_env.WORLD_SIZE: str(spec.workers * spec.ranks_per_worker),
            train_env.LOCAL_RANK: str(slot.local_rank),
            train_env.LOCAL_WORLD_SIZE: str(slot.local_world_size),
            train_env.NODE_RANK: str(slot.node_rank),
            train_env.MASTER_ADDR: master_addr,
            train_env.MASTER_PORT: str(master_port),
            train_env.JOB_ID: spec.job_id,
            train_env.ATTEMPT: str(spec.attempt),
            train_env.RUN_DIR: run_dir,
            train_env.TELEMETRY_FILE: telemetry_file,
            train_env.CHECKPOINT_DIR: checkpoint_dir,
            train_env.GPUS: "1" if spec.gpus_per_worker else "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    made.update(_device_env(spec, slot, gpu_resource))
    return made


def _device_env(spec: GangSpec, slot: RankSlot, gpu_resource: str | None) -> dict[str, str]:
    """The rank's one device: on real GPUs only its GPU is visible (``CUDA_VISIBLE_DEVICES``,
    the index chosen in the scheduler's NVLink domain, which replaces the one Ray picked for the
    rank's actor); on simulated ones its index is a variable. A job without GPUs runs on CPU."""
    if not spec.gpus_per_worker:
        return {train_env.ACCELERATOR: "cpu"}
    made = {train_env.ACCELERATOR: "cuda" if gpu_resource == GPU_RESOURCE else "sim"}
    if slot.device is not None:
        made[train_env.DEVICE_INDEX] = str(slot.device)
        made[train_env.NVLINK_DOMAIN] = str(slot.nvlink_domain)
        if gpu_resource == GPU_RESOURCE:
            made["CUDA_VISIBLE_DEVICES"] = str(slot.device)
    return made
