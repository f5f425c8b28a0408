"""Free-capacity index: free GPUs per node, bucketed by amount, with per-domain histograms;
free CPUs and memory per node beside them. :class:`FreeIndex` is what the scheduler asks and
changes: allocating and releasing slots, taking nodes out of placement, capacity by node and by
domain, and tentative sections.

A scheduling cycle makes tentative allocations inside :meth:`FreeIndex.tentative`, which rolls
them back on exit: the scheduler stays a pure function of its snapshot.

The tables and the bookkeeping that keeps them are :mod:`.tables`.
"""

from __future__ import annotations

from collections.abc import Sequence

from aicluster.core import Job, Slot
from aicluster.scheduler.index.domains import Domain
from aicluster.scheduler.index.fit import CapacityBuckets
from aicluster.scheduler.index.tables import IndexTables

__all__ = ["FreeIndex", "Tentative"]

_TOUCH = -2  # the NVLink domain of a journal entry that only moves a node within its bucket
_CONTENT_MEMO_SIZE = 1 << 16
_UNBOUNDED = 1 << 62  # units a node can take of a resource the job does not ask for


class FreeIndex(IndexTables):
    """Mutable index of free GPUs. Owned by a control loop; read by the scheduler."""

    # -- public operations ------------------------------------------------------------------

    def allocate(self, slots: Sequence[Slot]) -> None:
        for slot in slots:
            i = self.node_id[slot.node]
            if slot.gpus:
                self._change(i, slot.nvlink_domain, -slot.gpus)
            if slot.cpus or slot.memory_gb:
                cpus, memory, heavy = self._host_of(i, slot)
                self._change_host(i, -cpus, -memory, heavy)

    def release(self, slots: Sequence[Slot]) -> None:
        for slot in slots:
            i = self.node_id[slot.node]
            if slot.gpus:
                self._change(i, slot.nvlink_domain, slot.gpus)
            if slot.cpus or slot.memory_gb:
                cpus, memory, heavy = self._host_of(i, slot)
                self._change_host(i, cpus, memory, -heavy)

    def round_trip(self, slot_lists: Sequence[Sequence[Slot]]) -> bool:
        """Leave the index exactly as releasing every list of slots in order and allocating them
        back in reverse order would, without doing it; False (nothing done) where it cannot.

        Such a round trip restores every count but moves each node it touched to the end of its
        free-GPU bucket, in the order of the node's last touch (best fit takes the first node of
        a bucket, so the order is part of the index). Inside :meth:`tentative` the journal gets
        touches that make the rollback reorder the buckets as rolling back the round trip would.
        Not for nodes split into NVLink domains (spreading over them need not restore the split)
        nor for fractional watts (their sums need not come back bit for bit)."""
        node_id = self.node_id
        # Only slots with GPUs move a node in its bucket (CPUs and memory have none).
        order = [node_id[slot.node] for slots in slot_lists for slot in slots if slot.gpus]
        if not self._whole_watts or any(self.nvlink_free[i] is not None for i in order):
            return False
        # Re-allocation touches the nodes list by list from the last, slots in order.
        back = [node_id[slot.node] for slots in reversed(slot_lists) for slot in slots if slot.gpus]
        self._touch(_by_last_touch(back))
        if self._journal is not None:
            # The rollback undoes the re-allocations, then the releases in reverse order: the
            # nodes end in the order of their last touch there, i.e. along ``order`` reversed.
            # Journal entries are undone last first, so they go in reversed.
            undone = _by_last_touch(order[::-1])
            self._journal.extend((i, _TOUCH, 0, False) for i in reversed(undone))
        return True

    def set_schedulable(self, node: str, schedulable: bool) -> None:
        """Take a node out of (or back into) placement: unhealthy or cordoned nodes are out."""
        i = self.node_id[node]
        if self.schedulable[i] == schedulable:
            return
        self.version += 1
        self.content_version += 1
        if self.content_hash is not None:  # the key past the node's GPU counts marks it out
            self.content_hash ^= self._zobrist[i][-1]
        sign = 1 if schedulable else -1
        self.free_millicpus_total += sign * self.free_millicpus[i]
        self.free_memory_mib_total += sign * self.free_memory_mib[i]
        if schedulable:
            self.schedulable[i] = True
            self._add(i)
        else:
            self._remove(i)
            self.schedulable[i] = False

    def by_capacity(self, rack: bool, unit: int) -> CapacityBuckets | None:
        """Shortcut: the racks (``rack``) or pods by their capacity in units of ``unit`` GPUs
        (:mod:`.fit`), made when first asked and kept up to date from then on; None with
        ``fit_shortcut`` off (then callers list every domain's capacity, the plain way)."""
        if not self.fit_shortcut or unit <= 0:
            return None
        found = self._by_capacity.get((rack, unit))
        if found is None:
            domains: list[Domain] = self.racks if rack else self.pods
            owner = self.node_rack if rack else self.node_pod
            found = CapacityBuckets(domains, owner, unit, self.nodes, self.schedulable)
            self._by_capacity[(rack, unit)] = found
            self._fits.append(found)
        return found

    def remember(self, key: tuple[object, ...], answer: object) -> None:
        """Keep an answer in :attr:`content_memo` (``key`` ends with the content hash). Bounded:
        when full it starts over, as a replay revisits recent contents far more than old ones."""
        if len(self.content_memo) >= _CONTENT_MEMO_SIZE:
            self.content_memo.clear()
        self.content_memo[key] = answer

    def tentative(self) -> Tentative:
        """A context manager: allocations and releases made inside are undone on exit, even on
        error."""
        return Tentative(self)

    def _begin_tentative(self) -> None:
        if self._journal is not None:
            raise RuntimeError("tentative sections do not nest")
        self._journal = []

    def holds_exactly(self, slot_lists: Sequence[Sequence[Slot]]) -> bool:
        """Whether this tentative section made exactly the allocations of ``slot_lists``, in
        order, and nothing else: then keeping it leaves the index as rolling it back and
        allocating them again would (the same counts, the same bucket order, bit-identical
        watts where they are whole numbers), only versions apart."""
        journal, host_journal = self._journal, self._host_journal
        if journal is None or not self._whole_watts:
            return False
        node_id, at, host_at = self.node_id, 0, 0
        for slots in slot_lists:
            for slot in slots:
                i = node_id[slot.node]
                if slot.gpus:
                    expected_gpus = (i, slot.nvlink_domain, -slot.gpus, False)
                    if at >= len(journal) or journal[at] != expected_gpus:
                        return False
                    at += 1
                if slot.cpus or slot.memory_gb:
                    cpus, memory, heavy = self._host_of(i, slot)
                    expected = (i, -cpus, -memory, heavy)  # what allocate journals
                    if host_at >= len(host_journal) or host_journal[host_at] != expected:
                        return False
                    host_at += 1
        return at == len(journal) and host_at == len(host_journal)

    def _keep(self) -> None:
        """End the tentative section keeping what it did."""
        self._journal, self._host_journal = None, []

    def _roll_back(self) -> None:
        journal, self._journal = self._journal or [], None
        host_journal, self._host_journal = self._host_journal, []
        for i, millicpus_delta, memory_delta, heavy in reversed(host_journal):
            self._change_host(i, -millicpus_delta, -memory_delta, -heavy)
        for i, nvlink_domain, delta, floating in reversed(journal):
            if nvlink_domain == _TOUCH:  # recorded by round_trip
                self._touch((i,))
            else:
                self._change(i, nvlink_domain, -delta, floating)

    # -- queries ----------------------------------------------------------------------------

    def unit_capacity(self, i: int, unit: int, needs_nvlink: bool) -> int:
        """Placement units of ``unit`` GPUs node ``i`` can take now."""
        if not self.schedulable[i] or unit <= 0:
            return 0
        split = self.nvlink_free[i]
        if split is None or not needs_nvlink:
            return self.free[i] // unit
        return sum(free // unit for free in split)

    def host_units(self, i: int, unit_millicpus: int, unit_memory_mib: int) -> int:
        """Units of ``unit_millicpus`` CPUs and ``unit_memory_mib`` memory node ``i`` has room
        for now (its GPUs aside)."""
        by_cpus = self.free_millicpus[i] // unit_millicpus if unit_millicpus else _UNBOUNDED
        by_memory = self.free_memory_mib[i] // unit_memory_mib if unit_memory_mib else _UNBOUNDED
        return min(by_cpus, by_memory)

    def host_binds(self, job: Job) -> bool:
        """Whether ``job``'s CPUs or memory can limit where its GPUs go (else only its GPUs
        need searching). The plain answer is whether it asks for any.

        Shortcut: not when no allocated slot holds more CPUs or memory per GPU than its node has
        and ``job``'s unit asks no more per GPU than the least any node with GPUs has. Then on
        every node free CPUs >= the node's CPUs per GPU x its free GPUs >= the job's per GPU x
        free GPUs, so CPUs hold as many units as GPUs do (memory alike), on each node and in
        total: every CPU and memory test of a GPU search would pass."""
        if not job.needs_host:
            return False
        if not self.host_shortcut or self.host_heavy_slots or not job.unit_gpus:
            return True
        return not (
            _within(job.unit_millicpus, job.unit_gpus, self._least_cpus_per_gpu)
            and _within(job.unit_memory_mib, job.unit_gpus, self._least_memory_per_gpu)
        )

    def powered(self, i: int) -> bool:
        """Whether node ``i`` already holds work (a placement's ``powered_nodes`` score)."""
        return self.free[i] < self.nodes[i].gpus

    def set_powered(self, i: int, on: bool) -> None:
        """Power node ``i`` on or off: its draw (whether it takes work is set_schedulable)."""
        if self.powered_on[i] != on:
            self.watts -= self.node_watts(i)
            self.powered_on[i] = on
            self.watts += self.node_watts(i)

    def digest(self) -> tuple[object, ...]:
        """A value that changes whenever the index does (for purity checks in tests)."""
        return (
            tuple(self.free),
            tuple(tuple(s) if s else None for s in self.nvlink_free),
            tuple(tuple(s) if s else None for s in self.nvlink_floating),
            tuple(self.schedulable),
            round(self.watts, 6),
            tuple(self.powered_on),
            tuple(self.free_millicpus),
            tuple(self.free_memory_mib),
        )


def _by_last_touch(touches: Sequence[int]) -> list[int]:
    """Distinct nodes ordered by their last occurrence in ``touches``."""
    return list(reversed(dict.fromkeys(reversed(touches))))


class Tentative:
    """What :meth:`FreeIndex.tentative` returns. A class rather than ``@contextmanager``: every
    scheduling cycle enters one, and a class compiles with mypyc (setup.py) where contextlib's
    generator wrapper stays interpreted (three Python calls a cycle in a compiled replay)."""

    __slots__ = ("index", "keep")

    def __init__(self, index: FreeIndex) -> None:
        self.index = index
        self.keep = False  # set inside the section: keep its changes on a normal exit

    def __enter__(self) -> FreeIndex:
        self.index._begin_tentative()
        return self.index

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if self.keep and exc_type is None:
            self.index._keep()
        else:
            self.index._roll_back()


def _within(amount: int, gpus: int, least: tuple[int, int] | None) -> bool:
    """Whether ``amount`` per ``gpus`` GPUs is at most ``least`` (an amount and its GPUs)."""
    return least is not None and amount * least[1] <= least[0] * gpus
