"""Power budgets (the cluster file's ``power_budget_w`` of the cluster, its racks and circuits):
placement never lets the modelled draw of a budgeted part exceed its budget.

The check runs only when the cluster has budgets (``SchedulerState.budgets`` is None
otherwise): it allocates a found placement tentatively and adds up the draw of the racks the
placement touches, node by node (a rack's nodes: tens), so nothing is kept up to date on the
hot path. A placement over a rack's or circuit's budget is searched again without that part's
nodes; over the cluster's, the job waits, and its reason names the budget
("power budget rack r2: 38.2 of 40.0 kW; starting it would draw 41.3 kW").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from aicluster.core import Job, PendingCode, Placement, Slot
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.placement import PlacementFailure, find_placement

__all__ = ["Budgets", "Refusal", "within_budgets"]

#: What a refused placement says: the nodes of the budget it would exceed (None: the
#: cluster's, which no other placement avoids) and the reason.
Refusal = tuple[frozenset[int] | None, str]


class Budgets:
    """The cluster's budgets, each with its nodes, and each node's budgets."""

    def __init__(self, index: FreeIndex) -> None:
        self.index = index
        self.budgets = index.cluster.budgets
        self.nodes: list[frozenset[int]] = []
        self.of_node: list[list[int]] = [[] for _ in index.nodes]
        for b, budget in enumerate(self.budgets):
            members = frozenset(
                i
                for i, node in enumerate(index.nodes)
                if budget.racks is None or node.rack in budget.racks
            )
            self.nodes.append(members)
            for i in members:
                self.of_node[i].append(b)

    def draw(self, b: int) -> float:
        """The modelled draw of budget ``b``'s nodes now, in watts."""
        if self.budgets[b].racks is None:
            return self.index.watts
        return sum(self.index.node_watts(i) for i in self.nodes[b])

    def check(self, slots: Sequence[Slot]) -> Refusal | None:
        """The first budget that placing ``slots`` would exceed, or None (index unchanged)."""
        index = self.index
        touched = sorted({b for slot in slots for b in self.of_node[index.node_id[slot.node]]})
        before = [self.draw(b) for b in touched]
        index.allocate(slots)
        after = [self.draw(b) for b in touched]
        index.release(slots)
        for b, was, would in zip(touched, before, after, strict=True):
            budget = self.budgets[b]
            if would > budget.watts:
                message = (
                    f"power budget {budget.name}: {was / 1000:.1f} of {budget.watts / 1000:.1f} kW;"
                    f" starting it would draw {would / 1000:.1f} kW"
                )
                return (None if budget.racks is None else self.nodes[b]), message
        return None

    def draws(self) -> dict[str, float]:
        """The modelled draw now, in watts, of each rack (by its name) and of each budget (by
        its: "circuit a", "cluster"): what the simulator keeps the peaks of."""
        draws: dict[str, float] = {}
        for i, node in enumerate(self.index.nodes):
            draws[node.rack] = draws.get(node.rack, 0.0) + self.index.node_watts(i)
        for b, budget in enumerate(self.budgets):
            draws[budget.name] = self.draw(b)
        return draws


def within_budgets(
    budgets: Budgets,
    job: Job,
    found: Placement,
    exclude: Collection[int],
    types: Sequence[str],
) -> Placement | PlacementFailure:
    """``found`` if it keeps every budget; else a placement found without the nodes of each
    budget it would exceed in turn, or the first refusal's reason (``exclude``: the nodes the
    search that found it left out)."""
    first: str | None = None
    left_out = set(exclude)
    while True:
        refused = budgets.check(found.slots)
        if refused is None:
            return found
        nodes, message = refused
        first = first or message
        if nodes is None:  # the cluster's own budget: no other placement draws less
            return PlacementFailure(PendingCode.POWER_CAP, first)
        left_out |= nodes
        again = find_placement(budgets.index, job, exclude=left_out, types=types, explain=False)
        if isinstance(again, PlacementFailure):
            return PlacementFailure(PendingCode.POWER_CAP, first)
        found = again
