"""The wakeup calendar gives the entries a plain heap of ``(time, seq, job id)`` would, in the
same order: the scheduler's Tiresias demotions (and so its decisions) depend on that order."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from aicluster.scheduler.wakeups import Wakeups

Entry = tuple[float, int, str]
Later = dict[tuple[int, str], float]

# Few distinct times and seqs, so that times are shared and equal seqs meet (a requeued job).
_entry = st.tuples(
    st.sampled_from([1.0, 2.5, 2.5, 3.0, 7.0, 7.0, 11.0]),
    st.integers(0, 5),
    st.sampled_from(["a", "b", "c", "d"]),
)


def _drain(wakeups: Wakeups, now: float, later: Later) -> list[Entry]:
    """Pop every due entry; for each, add the job's next entry (``later``) as the state does."""
    out: list[Entry] = []
    while (due := wakeups.pop_due(now)) is not None:
        when, jobs = due
        for seq, job_id in jobs:
            out.append((when, seq, job_id))
            step = later.get((seq, job_id))
            if step is not None:
                wakeups.add(when + step, seq, job_id)
    return out


def _drain_plain(heap: list[Entry], now: float, later: Later) -> list[Entry]:
    out: list[Entry] = []
    while heap and heap[0][0] <= now:
        when, seq, job_id = heapq.heappop(heap)
        out.append((when, seq, job_id))
        step = later.get((seq, job_id))
        if step is not None:
            heapq.heappush(heap, (when + step, seq, job_id))
    return out


@settings(max_examples=300, deadline=None)
@given(
    batches=st.lists(st.lists(_entry, max_size=6), min_size=1, max_size=6),
    nows=st.lists(st.sampled_from([0.0, 2.5, 3.0, 6.0, 9.0, 20.0, 40.0]), min_size=1, max_size=6),
    later=st.dictionaries(
        st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", "c", "d"])),
        st.sampled_from([0.5, 4.0, 4.5]),
    ),
)
def test_entries_come_out_as_from_a_plain_heap(
    batches: list[list[Entry]], nows: list[float], later: Later
) -> None:
    wakeups, heap = Wakeups(), list[Entry]()
    now = 0.0
    for batch, step in zip(batches, nows, strict=False):
        for when, seq, job_id in batch:
            wakeups.add(now + when, seq, job_id)
            heapq.heappush(heap, (now + when, seq, job_id))
        now += step
        assert _drain(wakeups, now, later) == _drain_plain(heap, now, later)
    assert _drain(wakeups, 1e9, {}) == _drain_plain(heap, 1e9, {})


@settings(max_examples=200, deadline=None)
@given(entries=st.lists(_entry, max_size=12), live=st.sets(st.sampled_from(["a", "b", "c"])))
def test_first_is_the_earliest_live_time(entries: list[Entry], live: set[str]) -> None:
    wakeups = Wakeups()
    for when, seq, job_id in entries:
        wakeups.add(when, seq, job_id)

    def runs(seq: int, job_id: str) -> bool:
        return job_id in live and seq % 2 == 0

    expected = min((when for when, seq, job_id in entries if runs(seq, job_id)), default=None)
    assert wakeups.first(runs) == expected
    # Times with only stale entries were dropped; the live ones still come out.
    popped: list[Entry] = []
    while (due := wakeups.pop_due(1e9)) is not None:
        popped.extend((due[0], seq, job_id) for seq, job_id in due[1] if runs(seq, job_id))
    assert popped == sorted(entry for entry in entries if runs(entry[1], entry[2]))
