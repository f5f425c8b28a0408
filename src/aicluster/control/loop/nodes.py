"""The control loop's nodes: what Ray reports each tick, recorded in the store (a node Ray lost is
unhealthy until it is back, unless power saving turned it off), the records as this tick read
them, and the cluster a fresh scheduler state is built on. A change of the set of nodes (or of
a node's GPUs, type, rack or pod) makes the loop rebuild its state; a change of a node's
health only changes whether the scheduler may place on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aicluster.control.loop.ports import GangRuntime
from aicluster.control.loop.power import MANAGED
from aicluster.control.settings import ACTOR, LoopSettings
from aicluster.core import Clock, Cluster, Node, make_cluster
from aicluster.core.power import PowerState
from aicluster.runtime import ClusterView
from aicluster.scheduler import SchedulerState
from aicluster.store import NodeHealth, NodeRecord, Store

__all__ = ["LiveNodes", "live_cluster"]

log = logging.getLogger(__name__)

# What a scheduler state is built on, by node: a change rebuilds it.
NodeKey = tuple[tuple[str, int, str, str, str], ...]


class LiveNodes:
    """The nodes as of this tick: :attr:`records` (the store's) and :attr:`alive` (Ray's health
    by node; None without discovery)."""

    def __init__(
        self,
        store: Store,
        runtime: GangRuntime | None,
        discover: Callable[[], ClusterView] | None,
        clock: Clock,
    ) -> None:
        self.store, self.runtime, self.discover, self.clock = store, runtime, discover, clock
        self.alive: dict[str, bool] | None = None
        self.records: list[NodeRecord] = []
        self._key: NodeKey = ()

    def sync(self, state: SchedulerState | None) -> bool:
        """Record what Ray reports; True when the set of nodes changed (the state is rebuilt),
        else each node's schedulability is set in ``state``."""
        if self.discover is not None:
            view = self.discover()
            if self.runtime is not None:
                self.runtime.warm_up(view)  # each node's warm process, before its first gang
            found = view.cluster.nodes
            self.store.upsert_nodes(found, seen_at=self.clock.now())
            alive = self.alive = view.health()
            for record in self.store.list_nodes():
                name = record.node.name
                if PowerState(record.power) in MANAGED:
                    continue  # gone from Ray while powered down: power saving's to judge
                if not alive.get(name, False) and record.health is NodeHealth.HEALTHY:
                    self.store.set_node_health(
                        name, NodeHealth.UNHEALTHY, ACTOR, "Ray node is down"
                    )
                elif alive.get(name) and record.health is NodeHealth.UNHEALTHY:
                    self.store.set_node_health(name, NodeHealth.HEALTHY, ACTOR, None)
        records = self.records = self.store.list_nodes()
        key = tuple(
            sorted(
                (r.node.name, r.node.gpus, r.node.gpu_type, r.node.rack, r.node.pod)
                for r in records
            )
        )
        changed = key != self._key
        self._key = key
        if state is not None and not changed:
            for record in records:
                state.set_node_schedulable(record.node.name, record.schedulable)
        return changed


def live_cluster(nodes: tuple[Node, ...], settings: LoopSettings) -> Cluster:
    """The registered nodes with the cluster file's power model and budgets; a budget of a
    rack no node is in yet is left out until one is (a warning says so)."""
    if not nodes:
        return make_cluster(nodes=1, gpus_per_node=0)
    racks = {node.rack for node in nodes}
    budgets = tuple(b for b in settings.budgets if b.racks is None or b.racks <= racks)
    if len(budgets) < len(settings.budgets):
        log.warning("power budgets of racks with no registered node are not checked yet")
    return Cluster("live", nodes, settings.power, budgets=budgets)
