"""Launch a job's gang on Ray, pinned where the scheduler placed it, and find it again (one
attempt's status, logs and stop: :mod:`.handle`).

Mechanism: one *detached, named* placement group per attempt (``aicluster-gang/<job>/<attempt>``)
with one bundle per rank, each bundle carrying a label selector on ``aicluster.io/node`` so Ray
reserves it on exactly the node the scheduler chose (the scheduler, not Ray, decides placement;
Ray enforces it and owns the resources). In each bundle a detached, named actor
(``.../rank-<r>``) starts the rank's process with torch's ``env://`` variables. Detached and named
so that a restarted control plane finds by name what Ray still runs (:meth:`Runtime.live_gangs`,
:meth:`Runtime.gang`) instead of launching it twice.

Why not Ray Train's ``TorchTrainer``: its controller is tied to the process calling ``fit()`` and
runs a Python function, not a script with its own exit code and logs; restart policy (next issue)
belongs to the control plane, which may re-place a job elsewhere. Its worker-level label selectors
are what we do here with placement-group bundle selectors.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import (
    GetTimeoutError,
    RaySystemError,
)
from ray.util.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    placement_group_table,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from aicluster.runtime.cluster.discovery import ClusterView, discover
from aicluster.runtime.gang.devices import NodeGpus, assign_devices
from aicluster.runtime.gang.handle import GangHandle
from aicluster.runtime.gang.worker import RankWorker
from aicluster.runtime.labels import GPU_RESOURCE
from aicluster.runtime.layout import (
    NAMESPACE,
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
from aicluster.runtime.rundir import LogChunk, RunDir, Stream, write_json_atomic
from aicluster.runtime.sandbox import jobdisk
from aicluster.runtime.sandbox.bwrap import SandboxConfig
from aicluster.runtime.warm.warmup import WarmUps
from aicluster.train.telemetry import StepRecord

__all__ = [
    "GangError",
    "GangStartTimeout",
    "PlacementError",
    "Runtime",
    "named_placement_group",
]

_RankActor = ray.remote(RankWorker)
#: Seconds between checks that the nodes of a pending placement group are still alive.
PG_POLL_S = 1.0


class GangError(RuntimeError):
    """A gang could not be launched or found."""


class PlacementError(GangError):
    """The placement names a node that is not an alive aicluster node, or does not fit the job."""


class GangStartTimeout(GangError):
    """Ray could not reserve the placement (or start the ranks) within the start timeout."""


class Runtime:
    """Gangs on the Ray cluster this process is connected to (see :func:`connect`).

    ``state_dir`` holds run directories (``<state_dir>/runs/...``); it must be the same path on
    every node (one machine, or a shared filesystem). With ``sandbox``, the control loop runs
    each tenant's ranks in that tenant's sandbox (:mod:`aicluster.runtime.sandbox.bwrap`).
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        start_timeout_s: float = 120.0,
        sandbox: SandboxConfig | None = None,
    ):
        if not ray.is_initialized():
            raise GangError("not connected to Ray: call aicluster.runtime.connect(address) first")
        namespace = ray.get_runtime_context().namespace
        if namespace != NAMESPACE:
            raise GangError(f"connected to Ray in namespace {namespace!r}, need {NAMESPACE!r}")
        self.state_dir = os.path.abspath(state_dir)
        self.start_timeout_s = start_timeout_s
        self.sandbox = sandbox
        self._warm_ups = WarmUps(self.state_dir)
        self._devices_lock = threading.Lock()
        if sandbox is not None and sandbox.disk_limit == jobdisk.LOOP:
            jobdisk.share_tenants(self.state_dir)  # before any tenant's warm process starts

    def warm_up(self, view: ClusterView) -> int:
        """Ask every alive node of ``view`` for its warm process (see :mod:`..warm.starter`), so
        that even the first gang on a node (a re-placed one after a node loss) starts warm. Returns
        at once; idempotent per Ray node. Returns how many nodes were asked now."""
        return self._warm_ups.nodes(view)

    def warm_up_tenant(
        self, tenant: str, user: tuple[int, int], view: ClusterView | None = None
    ) -> int:
        """Ask every alive node for ``tenant``'s warm process (in its sandbox), as
        :meth:`warm_up` does for the nodes' own. Returns how many nodes were asked now."""
        return self._warm_ups.tenant(tenant, user, view)

    def launch(self, spec: GangSpec) -> GangHandle:
        """Start ``spec``'s attempt and return once every rank's process runs.

        Idempotent per ``(job_id, attempt)``: what already exists in Ray (placement group, actors,
        started processes) is reused, so calling it again after a crash mid-launch finishes the
        launch instead of doubling it. Raises :class:`PlacementError` (bad placement; nothing
        created), :class:`GangStartTimeout` (Ray could not reserve it in time) and
        :class:`GangError` (a rank could not start, or the attempt was already stopped: launch a
        new attempt instead). A launch that fails half-way removes what it created (placement
        group, actors, processes) and marks the attempt stopped.
        """
        run = RunDir(self.state_dir, spec.job_id, spec.attempt)
        if run.stop_requested():
            raise GangError(f"{spec.job_id} attempt {spec.attempt} was stopped; use a new attempt")
        gpu_resources, shapes, racks = self._check_nodes(spec)
        try:
            layout = rank_layout(spec.placement, spec.workers, spec.gpus_per_worker, racks)
        except ValueError as error:
            raise PlacementError(f"{spec.job_id}: {error}") from None
        run.make_data_dir(spec.tenant, spec.user)
        spec = self._disk(spec, run)
        # Once per tenant: nodes that join later are asked by warm_up (no discover() per launch).
        prewarm = self.sandbox is not None and self.sandbox.prewarm
        if prewarm and spec.user is not None and spec.tenant not in self._warm_ups.tenants:
            self.warm_up_tenant(spec.tenant, spec.user)
        if run.spec() is None:
            write_json_atomic(run.spec_file, self._spec_record(spec, layout))
        try:
            group = self._placement_group(spec, layout, gpu_resources)
            with self._devices_lock:  # two launches never choose the same GPU index
                layout = self._record_devices(run, spec, layout, shapes)
            actors = [self._actor(spec, group, slot, gpu_resources) for slot in layout]
            master = ray.get(actors[0].where.remote(), timeout=self.start_timeout_s)
            port = ray.get(actors[0].rendezvous_port.remote(), timeout=self.start_timeout_s)
            started = []
            for slot, actor in zip(layout, actors, strict=True):
                rank_vars = rank_env(
                    spec,
                    slot,
                    master_addr=master["ip"],
                    master_port=port,
                    run_dir=os.path.realpath(run.job_run_dir),
                    telemetry_file=os.path.realpath(run.telemetry_file(slot.rank)),
                    checkpoint_dir=os.path.realpath(run.checkpoint_dir),
                    gpu_resource=gpu_resources.get(slot.node),
                )
                started.append(actor.start.remote(spec.launch_for(rank_vars, slot.worker)))
            ray.get(started, timeout=self.start_timeout_s)
        except (GetTimeoutError, GangStartTimeout) as error:
            GangHandle(self.state_dir, spec.job_id, spec.attempt).stop(grace_s=0)
            raise GangStartTimeout(f"{spec.job_id} attempt {spec.attempt}: {error}") from None
        except Exception as error:
            # Half-way (an actor that died, a rank that could not start): release the placement
            # group, actors and processes made so far; this attempt is over.
            GangHandle(self.state_dir, spec.job_id, spec.attempt).stop(grace_s=0)
            raise GangError(f"{spec.job_id} attempt {spec.attempt}: {error}") from error
        return GangHandle(self.state_dir, spec.job_id, spec.attempt)

    def _disk(self, spec: GangSpec, run: RunDir) -> GangSpec:
        """A sandboxed job's disk cap (the default when none is configured), held by a mount of
        its own where this host can (:mod:`..sandbox.jobdisk`): made before any rank starts."""
        if self.sandbox is None or spec.user is None:
            return spec
        image = jobdisk.image_path(self.state_dir, spec.job_id)
        disk_gb = spec.disk_gb
        if disk_gb is None and image.exists():  # a restart: the cap its image was made with
            disk_gb = round(image.stat().st_size / (1 << 30), 3)
        disk_gb = disk_gb or jobdisk.default_disk_gb(self.state_dir)
        if self.sandbox.disk_limit == jobdisk.LOOP:
            size = jobdisk.image_bytes(disk_gb)
            jobdisk.attach(run.data_dir_for(spec.tenant), image, size)
            run.make_data_dir(spec.tenant, spec.user)  # its directories, inside the image
        return replace(spec, disk_gb=disk_gb, disk_limit=self.sandbox.disk_limit)

    def release_disks(self, active: Callable[[str], bool]) -> list[str]:
        """Give back the images of the jobs that are no longer ``active``: their files copied
        into plain data directories, unmounted, deleted (:func:`..sandbox.jobdisk.sweep`)."""
        if self.sandbox is None or self.sandbox.disk_limit != jobdisk.LOOP:
            return []

        def data_dir_of(job_id: str) -> Path | None:
            link = RunDir(self.state_dir, job_id, 0).data_link
            return Path(os.path.realpath(link)) if link.is_symlink() else None

        return jobdisk.sweep(self.state_dir, active, data_dir_of)

    def _check_nodes(
        self, spec: GangSpec
    ) -> tuple[dict[str, str], dict[str, NodeGpus], dict[str, str]]:
        """Each node's GPU resource name, GPU shape and rack; refuses dead and GPU-less nodes."""
        view = discover()
        gpu_resources: dict[str, str] = {}
        shapes: dict[str, NodeGpus] = {}
        racks: dict[str, str] = {}
        for node in spec.placement.nodes:
            if not view.alive(node):
                raise PlacementError(f"{spec.job_id}: node {node!r} is not an alive aicluster node")
            info = view.nodes[node]
            if spec.gpus_per_worker and info.gpu_resource is None:
                raise PlacementError(f"{spec.job_id}: node {node!r} has no GPUs")
            gpu_resources[node] = info.gpu_resource or ""
            shapes[node] = NodeGpus(info.node.gpus, info.node.nvlink_domain_size)
            racks[node] = info.node.rack
        return gpu_resources, shapes, racks

    @staticmethod
    def _spec_record(spec: GangSpec, layout: tuple[RankSlot, ...]) -> dict[str, Any]:
        return {**spec.to_dict(), "ranks": [_slot(slot) for slot in layout]}

    def _record_devices(
        self,
        run: RunDir,
        spec: GangSpec,
        layout: tuple[RankSlot, ...],
        shapes: dict[str, NodeGpus],
    ) -> tuple[RankSlot, ...]:
        """The layout with each rank's GPU index, chosen once Ray has reserved the gang and
        written to the run directory; a launch resumed after a crash reuses those."""
        ranks = (run.spec() or {}).get("ranks", [])
        if len(ranks) == len(layout) and all(r.get("device") is not None for r in ranks):
            return tuple(
                replace(slot, device=int(r["device"]), nvlink_domain=int(r["nvlink_domain"]))
                for slot, r in zip(layout, ranks, strict=True)
            )
        if not spec.gpus_per_worker:
            return layout
        layout = assign_devices(layout, shapes, self._devices_in_use(spec), spec.tensor)
        write_json_atomic(run.spec_file, self._spec_record(spec, layout))
        return layout

    def _devices_in_use(self, spec: GangSpec) -> dict[str, set[int]]:
        """GPU indices held by the ranks of the other gangs Ray still holds, by node."""
        used: dict[str, set[int]] = {}
        for handle in self.live_gangs():
            if handle.job_id == spec.job_id and handle.attempt == spec.attempt:
                continue
            for entry in (handle.run.spec() or {}).get("ranks", []):
                if entry.get("device") is not None:
                    used.setdefault(str(entry["node"]), set()).add(int(entry["device"]))
        return used

    def _placement_group(
        self, spec: GangSpec, layout: tuple[RankSlot, ...], gpu_resources: dict[str, str]
    ) -> PlacementGroup:
        """The attempt's placement group (made unless a resumed launch made it), once Ray has
        reserved it."""
        name = gang_name(spec.job_id, spec.attempt)
        group = named_placement_group(
            name, lambda: self._new_placement_group(name, spec, layout, gpu_resources)
        )
        deadline = time.monotonic() + self.start_timeout_s
        nodes = sorted({slot.node for slot in layout})
        reserved = group.ready()  # once: each call submits another probe task to the group
        while True:
            left = deadline - time.monotonic()
            ready, _ = ray.wait([reserved], timeout=max(0.0, min(PG_POLL_S, left)))
            if ready:
                return group
            if left <= PG_POLL_S:
                raise GangStartTimeout(
                    f"Ray could not reserve {bundles(spec, layout, gpu_resources)} on nodes "
                    f"{[slot.node for slot in layout]} within {self.start_timeout_s:g}s"
                )
            # A node that died after the scheduler chose it (Ray had not declared it dead yet)
            # never gets its bundles: give up now rather than after the whole start timeout.
            view = discover()
            lost = [node for node in nodes if not view.alive(node)]
            if lost:
                raise GangStartTimeout(f"node(s) {lost} died before the gang was placed")

    @staticmethod
    def _new_placement_group(
        name: str, spec: GangSpec, layout: tuple[RankSlot, ...], gpu_resources: dict[str, str]
    ) -> PlacementGroup:
        # PACK is only the fallback order: every bundle's label selector pins its node.
        group: PlacementGroup = placement_group(
            bundles(spec, layout, gpu_resources),
            strategy="PACK",
            name=name,
            lifetime="detached",
            bundle_label_selector=label_selectors(layout),
        )
        return group

    def _actor(
        self, spec: GangSpec, group: PlacementGroup, slot: RankSlot, gpu_resources: dict[str, str]
    ) -> Any:
        bundle = bundles(spec, [slot], gpu_resources)[0]
        resource = gpu_resources.get(slot.node, "")
        gpus = bundle.get(resource, 0.0) if resource else 0.0
        return _RankActor.options(
            name=actor_name(spec.job_id, spec.attempt, slot.rank),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=0,
            num_cpus=bundle.get("CPU", 0.0),
            num_gpus=gpus if resource == GPU_RESOURCE else 0,
            resources={resource: gpus} if gpus and resource != GPU_RESOURCE else {},
            memory=bundle.get("memory"),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=slot.rank
            ),
        ).remote(self.state_dir, spec.job_id, spec.attempt, slot.rank)

    def gang(self, job_id: str, attempt: int | None = None) -> GangHandle | None:
        """The handle of ``job_id``'s attempt (latest when None) that has a run directory."""
        attempts = RunDir.attempts(self.state_dir, job_id)
        if attempt is None:
            attempt = attempts[-1] if attempts else None
        if attempt is None or attempt not in attempts:
            return None
        if RunDir(self.state_dir, job_id, attempt).spec() is None:
            return None
        return GangHandle(self.state_dir, job_id, attempt)

    def live_gangs(self) -> list[GangHandle]:
        """Gangs Ray still holds (their placement group exists), for reconciliation."""
        found = []
        for entry in placement_group_table().values():
            parsed = parse_gang_name(str(entry.get("name", "")))
            if parsed is None or entry.get("state") == "REMOVED":
                continue
            handle = self.gang(*parsed)
            if handle is not None:
                found.append(handle)
        return found

    def logs(
        self,
        job_id: str,
        rank: int = 0,
        *,
        attempt: int | None = None,
        stream: Stream = "stdout",
        offset: int = 0,
        max_bytes: int = 1 << 20,
    ) -> LogChunk:
        """A chunk of one rank's stdout or stderr (see :meth:`GangHandle.logs`)."""
        handle = self.gang(job_id, attempt)
        if handle is None:
            raise GangError(f"no run of job {job_id!r} (attempt {attempt})")
        return handle.logs(rank, stream=stream, offset=offset, max_bytes=max_bytes)

    def telemetry(self, job_id: str, attempt: int | None = None) -> dict[int, list[StepRecord]]:
        """Every telemetry record of each rank of the attempt (latest when None)."""
        handle = self.gang(job_id, attempt)
        if handle is None:
            raise GangError(f"no run of job {job_id!r} (attempt {attempt})")
        return handle.telemetry()


def named_placement_group(name: str, create: Callable[[], PlacementGroup]) -> PlacementGroup:
    """The placement group called ``name``: the one that exists, else made by ``create``.

    Two launchers of one attempt can both find none and both create it: a deposed control
    plane's launch resuming after a freeze, and its successor's launch of the job it adopted.
    Ray keeps names unique (the second creation raises), so the loser takes the winner's group;
    raising instead would make its clean-up stop the gang the winner runs."""
    group: PlacementGroup
    try:
        group = get_placement_group(name)
    except ValueError:  # none by that name
        try:
            group = create()
        except RaySystemError as error:
            if "already exists" not in str(error):  # Ray's only word for a name taken
                raise
            group = get_placement_group(name)
    return group


def _slot(slot: RankSlot) -> dict[str, Any]:
    return {
        "rank": slot.rank,
        "node": slot.node,
        "local_rank": slot.local_rank,
        "worker": slot.worker,
        "nvlink_domain": slot.nvlink_domain,
        "device": slot.device,
    }
