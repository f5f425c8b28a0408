"""What one scheduling cycle remembers (a shortcut: the plain path asks every question anew).

Answers are kept with what they depend on, so that they are read only while it holds:
- placements and placement failures by job shape, GPU types and reservation, valid at the index
  version they saw (a placement only at exactly that version: best fit breaks ties by the
  buckets' order, which a victim search's round trip changes; a failure depends only on how
  many GPUs are free where, so it carries over a round trip, see :meth:`CycleMemo.carry_over`);
- placement failures across cycles, in the index's ``content_memo`` under its content hash;
- victim searches that failed and candidate lists, shared with :mod:`.preemption.search` and
  :mod:`.preemption.candidates`;
- the GPU types each requested type allows, the queue's shapes, and the early-stop answers.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from aicluster.core import Job, PendingReason, Placement
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.placement import PlacementFailure, gpu_types_for
from aicluster.scheduler.preemption import CandidateMemo

__all__ = ["CycleMemo"]

PlacementKey = tuple[Hashable, ...]


@dataclass(slots=True)
class CycleMemo:
    failures: dict[PlacementKey, tuple[int, PlacementFailure]] = field(default_factory=dict)
    placements: dict[PlacementKey, tuple[int, Placement]] = field(default_factory=dict)
    victim_failures: dict[tuple[object, ...], int] = field(default_factory=dict)
    victim_lists: CandidateMemo = field(default_factory=dict)
    types_by_gpu_type: dict[str, tuple[list[str], tuple[str, ...]]] = field(default_factory=dict)
    reserved_free_at: tuple[int, bool] = (-1, False)  # (index version, answer)
    nothing_fits_at: tuple[int, bool] = (-1, False)
    reservation_reasons: dict[tuple[int, bool], PendingReason] = field(default_factory=dict)
    shape_heads: list[tuple[Hashable, Job]] | None = None

    def across_cycles(
        self, key: PlacementKey, index: FreeIndex, lasting: PlacementKey | None
    ) -> PlacementFailure | None:
        """A failure remembered under the index's content (``lasting``), kept for this cycle."""
        if lasting is None:
            return None
        failure = index.content_memo.get(lasting)
        if not isinstance(failure, PlacementFailure):
            return None
        self.failures[key] = (index.version, failure)
        return failure

    def remember(
        self,
        key: PlacementKey,
        index: FreeIndex,
        lasting: PlacementKey | None,
        found: Placement | PlacementFailure,
        keep_placement: bool,
    ) -> None:
        """Keep a search's answer: a failure for the cycle (and across cycles under ``lasting``),
        a placement for this index version when ``keep_placement``."""
        if isinstance(found, PlacementFailure):
            self.failures[key] = (index.version, found)
            if lasting is not None:
                index.remember(lasting, found)
        elif keep_placement:
            self.placements[key] = (index.version, found)

    def carry_over(self, before: int, after: int) -> None:
        """A failed victim search gives every GPU back, so what the cycle knew of the index at
        version ``before`` still holds at ``after``: failures and free sums depend only on free
        GPUs, not on the order in which the index lists nodes (which the round trip changes)."""
        for key, (version, failure) in self.failures.items():
            if version == before:
                self.failures[key] = (after, failure)
        for key, seen in self.victim_failures.items():
            if seen == before:
                self.victim_failures[key] = after
        if self.reserved_free_at[0] == before:
            self.reserved_free_at = (after, self.reserved_free_at[1])
        if self.nothing_fits_at[0] == before:  # whether a shape fits does not hang on order
            self.nothing_fits_at = (after, self.nothing_fits_at[1])

    def types_for(self, index: FreeIndex, job: Job) -> tuple[list[str], tuple[str, ...]]:
        """The GPU types ``job`` may use, as a list and as a tuple (a key)."""
        found = self.types_by_gpu_type.get(job.gpu_type)
        if found is None:
            types = gpu_types_for(index, job)
            found = self.types_by_gpu_type[job.gpu_type] = (types, tuple(types))
        return found
