"""The free-capacity index's tables and the bookkeeping that keeps them, node by node:
:class:`IndexTables`, what :class:`~.free.FreeIndex` is built on. Building them from a cluster,
adding and removing a node's counts, changing its free GPUs, CPUs and memory (each change
journaled inside a tentative section), and the watts it draws.

Updates are O(1) per node change, so a scheduling cycle never rescans the cluster:
- ``buckets[type][f]`` holds the schedulable nodes of a GPU type with exactly ``f`` free GPUs
  (best-fit for a single-node gang is the first non-empty bucket at or above its size);
- every rack and pod domain (one per GPU type) keeps a histogram ``nodes with f free`` so its
  capacity in units of ``u`` GPUs is ``sum(count[f] * (f // u))`` without visiting nodes.

- CPUs and memory (whole milli-CPUs and MiB, so that sums come back exactly) are plain lists per
  node with cluster-wide totals: GPUs are what gangs are packed by, and a node's CPUs and
  memory only bound how many units of a job it takes (see ``FreeIndex.host_units``).

The domains and their histograms are :mod:`.domains`; the content hash's keys are
:mod:`.keys`; each node's fixed part of the bookkeeping, :mod:`.books`.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from aicluster.core import Cluster, Node, Slot
from aicluster.core.resources import memory_mib, millicpus
from aicluster.scheduler.index.books import NodeBooks
from aicluster.scheduler.index.domains import build_domains, spread
from aicluster.scheduler.index.fit import CapacityBuckets
from aicluster.scheduler.index.keys import content_hash, host_key, zobrist_keys

__all__ = ["IndexTables"]

_HOLES_KEPT = 32  # deleted keys a bucket keeps, beyond a quarter of its size (_compact_bucket)


class IndexTables:
    """The index's tables of free capacity and their bookkeeping (the queries and operations
    the scheduler calls are :class:`~.free.FreeIndex`'s)."""

    def __init__(self, cluster: Cluster, *, random_seed: int | None = None) -> None:
        nodes = cluster.nodes
        self.cluster = cluster
        #: Not None: gangs are placed at random with this seed (``placement.strategy: random``,
        #: :mod:`..placement.random`), not packed by topology. Kept here, beside the capacity
        #: every placement search reads, so that each search (admission, victim search, the
        #: live loop's checks) places by the same strategy.
        self.random_seed = random_seed
        #: The data-locality term (``placement.preferences: [data_cached_bytes]``) and the
        #: input shards each node's cache holds (node index -> ``tenant/sha256`` keys; only
        #: nodes that reported some): :mod:`..locality`.
        self.locality = False
        self.node_shards: dict[int, frozenset[str]] = {}
        self.nodes: tuple[Node, ...] = nodes
        self.node_id = {node.name: i for i, node in enumerate(nodes)}
        self.gpu_types = sorted({node.gpu_type for node in nodes})
        self.max_gpus = max((node.gpus for node in nodes), default=0)
        self.max_gpus_by_type = _most_by_type(nodes, [node.gpus for node in nodes])
        #: Every node's GPUs by type, schedulable or not: the capacity reasons name.
        self.gpus_by_type = dict.fromkeys(self.gpu_types, 0)
        for node in nodes:
            self.gpus_by_type[node.gpu_type] += node.gpus
        self.nodes_of_type: dict[str, list[int]] = {t: [] for t in self.gpu_types}
        for i, node in enumerate(nodes):
            self.nodes_of_type[node.gpu_type].append(i)
        self.free = [node.gpus for node in nodes]
        # Free GPUs per NVLink domain, only for nodes split into several domains.
        self.nvlink_free: list[list[int] | None] = [
            [node.nvlink_size] * node.nvlink_domains if node.nvlink_domains > 1 else None
            for node in nodes
        ]
        # Of the used GPUs per NVLink domain, those held by slots that need no domain: only they
        # may be given back to a domain when such a slot ends (see _change).
        self.nvlink_floating: list[list[int] | None] = [
            [0] * len(split) if split is not None else None for split in self.nvlink_free
        ]
        self.schedulable = [True] * len(nodes)
        self.free_millicpus = [millicpus(node.cpus) for node in nodes]
        self.free_memory_mib = [memory_mib(node.memory_gb) for node in nodes]
        #: Free CPUs and memory on schedulable nodes (a quick test before any search).
        self.free_millicpus_total = sum(self.free_millicpus)
        self.free_memory_mib_total = sum(self.free_memory_mib)
        #: The least CPUs and memory any node has: a unit within both fits every node's.
        self.least_millicpus = min(self.free_millicpus, default=0)
        self.least_memory_mib = min(self.free_memory_mib, default=0)
        #: The most CPUs and memory one node of a GPU type has (what no unit may exceed).
        self.max_millicpus_by_type = _most_by_type(nodes, self.free_millicpus)
        self.max_memory_mib_by_type = _most_by_type(nodes, self.free_memory_mib)
        self._start_host_shortcut()
        self.free_by_type = dict.fromkeys(self.gpu_types, 0)
        self.buckets: dict[str, list[dict[int, None]]] = {
            gpu_type: [{} for _ in range(self.max_gpus + 1)] for gpu_type in self.gpu_types
        }
        self.racks, self.pods, self.node_rack, self.node_pod = build_domains(nodes, self.max_gpus)
        #: Shortcut switch (the configuration's ``scheduler.shortcuts``): see FreeIndex.by_capacity.
        self.fit_shortcut = True
        self._by_capacity: dict[tuple[bool, int], CapacityBuckets] = {}
        self._fits: list[CapacityBuckets] = []  # the same, each told of every change
        self._fill()
        self._start_versions()
        self._books = self._node_books()

    def _node_books(self) -> list[NodeBooks]:
        """Speed-up for _change: each node's part of the bookkeeping in one object."""
        holes = {t: [0] * (self.max_gpus + 1) for t in self.gpu_types}
        return [
            NodeBooks(
                gpus=node.gpus,
                gpu_type=node.gpu_type,
                keys=self._zobrist[i] if self._zobrist else (),
                buckets=self.buckets[node.gpu_type],
                holes=holes[node.gpu_type],
                rack=self.racks[self.node_rack[i]].histogram,
                pod=self.pods[self.node_pod[i]].histogram,
                busy_more=float(
                    self._power[node.gpu_type].busy_watts - self._power[node.gpu_type].idle_watts
                ),
            )
            for i, node in enumerate(self.nodes)
        ]

    def _fill(self) -> None:
        """Put every node in its bucket and histograms, and add up the power it draws."""
        self._power = {t: self.cluster.power_of(t) for t in self.gpu_types}
        #: Whether each node is powered (off, it draws nothing; see scheduler/power.py).
        self.powered_on = [True] * len(self.nodes)
        # What a node draws besides its GPUs: its base and its CPUs (0 unless the file says).
        self._base_watts = [
            self._power[node.gpu_type].node_watts + node.cpus * self._power[node.gpu_type].cpu_watts
            for node in self.nodes
        ]
        self.watts = 0.0
        for i in range(len(self.nodes)):
            self._add(i)
            self.watts += self.node_watts(i)
        # Watts are sums of whole numbers here, so adding and taking back a node's draw leaves
        # them exactly as they were (what lets round_trip skip the arithmetic).
        self._whole_watts = all(
            float(p.idle_watts).is_integer() and float(p.busy_watts).is_integer()
            for p in self._power.values()
        ) and all(float(w).is_integer() for w in self._base_watts)

    def _start_host_shortcut(self) -> None:
        """What ``FreeIndex.host_binds`` reads: each node's CPUs, memory and GPUs, the least CPUs
        and memory per GPU of a node with GPUs (as a pair to compare by cross-multiplying), and
        the count of allocated slots holding more per GPU than their node."""
        #: Shortcut switch (the configuration's ``scheduler.shortcuts``): see FreeIndex.host_binds.
        self.host_shortcut = True
        self._host_capacity = [
            (cpus, memory, node.gpus)
            for cpus, memory, node in zip(
                self.free_millicpus, self.free_memory_mib, self.nodes, strict=True
            )
        ]
        with_gpus = [c for c in self._host_capacity if c[2] > 0]
        self._least_cpus_per_gpu = min(
            ((c[0], c[2]) for c in with_gpus), key=lambda p: Fraction(*p), default=None
        )
        self._least_memory_per_gpu = min(
            ((c[1], c[2]) for c in with_gpus), key=lambda p: Fraction(*p), default=None
        )
        self.host_heavy_slots = 0

    def _start_versions(self) -> None:
        """The journal (none outside ``FreeIndex.tentative``), the versions and the content hash."""
        self._journal: list[tuple[int, int, int, bool]] | None = None
        self._host_journal: list[tuple[int, int, int, int]] = []
        #: Bumped by every change, so a cycle can tell the index is exactly as it last saw it.
        self.version = 0
        #: Bumped by every change of free GPUs or of what is schedulable, but not by a change of
        #: bucket order alone (``round_trip`` and its rollback): what depends only on how many
        #: GPUs are free where (fit tests, capacity) holds while it stays the same.
        self.content_version = 0
        # A Zobrist hash of the same content (each node's free GPUs and whether it is
        # schedulable), equal whenever the content is, however it came back to it: answers that
        # depend only on the content (a placement failure) are remembered across cycles by it.
        # None on clusters with nodes split into NVLink domains (their splits are content too).
        self._zobrist: list[tuple[int, ...]] = []
        self.content_hash: int | None = None
        self._host_keys: list[int] = []  # host_key of each node, while the hash is kept
        if not any(split is not None for split in self.nvlink_free):  # else never read
            self._zobrist = zobrist_keys(self.nodes)
            self._host_keys = [
                host_key(i, cpus, memory)
                for i, (cpus, memory) in enumerate(
                    zip(self.free_millicpus, self.free_memory_mib, strict=True)
                )
            ]
            self.content_hash = content_hash(self._zobrist, self.free, self._host_keys)
        #: Answers that depend only on the content (placement failures, the nodes a blocked job
        #: reserves), by what else decides them and the content hash: see ``FreeIndex.remember``.
        self.content_memo: dict[tuple[object, ...], object] = {}

    # -- bookkeeping ------------------------------------------------------------------------

    def _add(self, i: int) -> None:
        if not self.schedulable[i]:
            return
        free, gpu_type = self.free[i], self.nodes[i].gpu_type
        self.buckets[gpu_type][free][i] = None
        self.racks[self.node_rack[i]].histogram[free] += 1
        self.pods[self.node_pod[i]].histogram[free] += 1
        self.free_by_type[gpu_type] += free
        for fit in self._fits:
            fit.joined(i, free, 1)

    def _remove(self, i: int) -> None:
        if not self.schedulable[i]:
            return
        free, gpu_type = self.free[i], self.nodes[i].gpu_type
        del self.buckets[gpu_type][free][i]
        self.racks[self.node_rack[i]].histogram[free] -= 1
        self.pods[self.node_pod[i]].histogram[free] -= 1
        self.free_by_type[gpu_type] -= free
        for fit in self._fits:
            fit.joined(i, free, -1)

    def node_watts(self, i: int) -> float:
        node, power = self.nodes[i], self._power[self.nodes[i].gpu_type]
        if not self.powered_on[i]:
            return 0.0
        busy = node.gpus - self.free[i]
        gpus = node.gpus * power.idle_watts + busy * (power.busy_watts - power.idle_watts)
        return self._base_watts[i] + gpus

    def _change(self, i: int, nvlink_domain: int, delta: int, floating: bool = False) -> None:
        """Change node ``i``'s free GPUs by ``delta`` (negative allocates).

        On a node split into NVLink domains, a slot that needs no domain (``nvlink_domain`` -1)
        *floats*: it takes GPUs from the freest domains, and its GPUs go back only to domains
        that hold floating GPUs. Giving them back to a domain whose GPUs are all held by pinned
        slots would show free GPUs there that are not, and a pinned slot could over-fill it."""
        split = self.nvlink_free[i]
        if split is not None and nvlink_domain < 0:
            held = self.nvlink_floating[i]
            for domain, step in spread(split, delta, self.nodes[i].nvlink_size, held):
                self._change(i, domain, step, floating=True)
            return
        before = self.free[i]
        after = before + delta
        books = self._books[i]  # (read once: see books.py)
        if not 0 <= after <= books.gpus:
            raise ValueError(f"node {self.nodes[i].name}: free GPUs out of range")
        self.version += 1
        self.content_version += 1
        if self.content_hash is not None:
            keys = books.keys
            self.content_hash ^= keys[before] ^ keys[after]
        if self.schedulable[i]:  # _remove and _add, written out (the hottest bookkeeping)
            buckets = books.buckets
            left = buckets[before]
            del left[i]
            buckets[after][i] = None
            if before:  # (no search walks bucket 0, the nodes with no GPU free, for a node)
                holes = books.holes
                holes[before] += 1
                if holes[before] > _HOLES_KEPT + len(left) // 4:
                    _compact_bucket(left)
                    holes[before] = 0
            rack = books.rack
            rack[before] -= 1
            rack[after] += 1
            pod = books.pod
            pod[before] -= 1
            pod[after] += 1
            self.free_by_type[books.gpu_type] += delta
            for fit in self._fits:  # (none unless a shortcut asked for them)
                fit.changed(i, before, after)
        whole = self._whole_watts
        if not whole:
            self.watts -= self.node_watts(i)
        self.free[i] = after
        if split is not None:
            split[nvlink_domain] += delta
            held = self.nvlink_floating[i]
            if floating and held is not None:
                held[nvlink_domain] -= delta
        if not whole:
            self.watts += self.node_watts(i)
        elif self.powered_on[i]:
            # Speed-up: in whole watts, taking the node's draw out and putting it back is exactly
            # adding the difference, each GPU taken (delta < 0) drawing busy less idle watts more.
            self.watts -= delta * books.busy_more
        if self._journal is not None:
            self._journal.append((i, nvlink_domain, delta, floating))

    def _change_host(self, i: int, millicpus_delta: int, memory_delta: int, heavy: int) -> None:
        """Change node ``i``'s free CPUs and memory (negative allocates), and the count of slots
        heavier than their node by ``heavy``."""
        cpus = self.free_millicpus[i] + millicpus_delta
        memory = self.free_memory_mib[i] + memory_delta
        if cpus < 0 or memory < 0:
            raise ValueError(f"node {self.nodes[i].name}: free CPUs or memory out of range")
        self.version += 1
        self.content_version += 1
        if self.content_hash is not None:
            after = host_key(i, cpus, memory)
            self.content_hash ^= self._host_keys[i] ^ after
            self._host_keys[i] = after
        if self.schedulable[i]:
            self.free_millicpus_total += millicpus_delta
            self.free_memory_mib_total += memory_delta
        self.free_millicpus[i] = cpus
        self.free_memory_mib[i] = memory
        self.host_heavy_slots += heavy
        if self._journal is not None:
            self._host_journal.append((i, millicpus_delta, memory_delta, heavy))

    def _host_of(self, i: int, slot: Slot) -> tuple[int, int, int]:
        """``slot``'s millicpus and memory (MiB) on node ``i``, and 1 when it holds more of
        either per GPU than the node has, else 0 (allocate, release and holds_exactly alike)."""
        cpus, memory = millicpus(slot.cpus), memory_mib(slot.memory_gb)
        node_cpus, node_memory, node_gpus = self._host_capacity[i]
        gpus = slot.gpus
        heavy = cpus * node_gpus > node_cpus * gpus or memory * node_gpus > node_memory * gpus
        return cpus, memory, int(heavy)

    def _touch(self, nodes: Sequence[int]) -> None:
        """Move nodes to the end of their buckets, in order (what a change and its undoing
        leave behind)."""
        for i in nodes:
            if self.schedulable[i]:
                bucket = self.buckets[self.nodes[i].gpu_type][self.free[i]]
                del bucket[i]
                bucket[i] = None
        self.version += 1


def _compact_bucket(bucket: dict[int, None]) -> None:
    """Speed-up: a dict keeps the slot of each deleted key until it next grows, and finding its
    first key walks past them. Best fit takes a bucket's first node, so such slots gather at the
    front (a 3,000-key dict churned so, first key out and a new key in, took 2.3-2.5 us a step
    in pure Python, against 0.5 us compacted this way): putting the keys back in their order
    drops them, and keeps the order."""
    nodes = list(bucket)
    bucket.clear()
    bucket.update(dict.fromkeys(nodes))


def _most_by_type(nodes: Sequence[Node], amounts: Sequence[int]) -> dict[str, int]:
    """The largest of ``amounts`` (one per node) per GPU type."""
    most: dict[str, int] = {}
    for node, amount in zip(nodes, amounts, strict=True):
        most[node.gpu_type] = max(most.get(node.gpu_type, 0), amount)
    return most
