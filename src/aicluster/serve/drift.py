"""Drift signal: how far a served version's live inputs have moved from its training data.

Per (tenant, model, version) the gateway's observer hands over the predict inputs; one request
in ``sample_every`` is kept (a counter, no random draw), and the value of the model's
``drift.feature`` (from ``model.json``) is counted into the bins of its reference: characters or
categories for a categorical feature (plus one *other* bin for anything unseen in training),
the reference's edges for a numeric one. Counts live in a ring of time buckets, so the live
histogram covers a sliding window of ``window_s`` in bounded memory (buckets × bins per version).

The score is the **Jensen–Shannon distance** (base 2) between the live histogram and the
reference. Why not the population stability index: PSI divides by the reference proportion, so a
category never seen in training (a character outside the vocabulary: exactly the drift worth
seeing) makes it infinite unless an arbitrary epsilon is added; JS is finite for empty bins,
symmetric, a metric, and bounded in [0, 1], so one threshold reads the same for every model.
A sample of N counts over k bins has a noise floor of roughly sqrt((k - 1) / (8 N ln 2)) even
without drift, hence ``min_samples``: no score before that many counts are in the window.

:meth:`DriftMonitor.tick` (a leader task) turns threshold crossings into events, once per
crossing (with hysteresis: it re-arms when the score falls under 80% of the threshold);
:meth:`DriftMonitor.collect` exports ``aicluster_model_drift_score`` when metrics are scraped.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from aicluster.core import Clock

__all__ = [
    "DRIFT_FAMILY",
    "DriftMonitor",
    "Reference",
    "install",
    "js_distance",
]

log = logging.getLogger(__name__)

DRIFT_FAMILY = "aicluster_model_drift_score"
#: At most this many values of one request are counted (a huge prompt costs no more).
MAX_ITEMS_PER_SAMPLE = 1024
#: Under ``threshold × REARM`` a version that drifted may raise a new event.
REARM = 0.8

Key = tuple[str, str, int]
#: (tenant, kind, details) -> None: appends an event (the store's ``record_model_event``).
Emit = Callable[[str, str, dict[str, Any]], None]


def js_distance(p: Sequence[float], q: Sequence[float]) -> float:
    """Jensen–Shannon distance (base 2) of two histograms (normalised here), in [0, 1]."""
    if len(p) != len(q):
        raise ValueError(f"histograms differ in length ({len(p)} vs {len(q)})")
    total_p, total_q = float(sum(p)), float(sum(q))
    if total_p <= 0 or total_q <= 0:
        raise ValueError("a histogram is empty")
    divergence = 0.0
    for a, b in zip(p, q, strict=True):
        a, b = a / total_p, b / total_q
        m = (a + b) / 2
        if m == 0:  # a and b at most the smallest subnormal: m underflows, their terms are ~0
            continue
        if a > 0:
            divergence += a * math.log2(a / m) / 2
        if b > 0:
            divergence += b * math.log2(b / m) / 2
    return math.sqrt(min(1.0, max(0.0, divergence)))


@dataclass(frozen=True)
class Reference:
    """A feature's reference distribution, from ``model.json``'s ``drift`` section.

    ``proportions`` has one more bin than the categories for a categorical feature (values never
    seen in training, reference 0).
    """

    feature: str
    proportions: tuple[float, ...]
    categories: Mapping[str, int] = field(default_factory=dict)
    characters: bool = False  # categories are single characters: count a string's characters
    cuts: tuple[float, ...] = ()  # numeric: inner bin boundaries (bisect_right)

    @classmethod
    def from_meta(cls, drift: Mapping[str, Any]) -> Reference:
        """Parse a ``drift`` section; raises ``ValueError`` with a readable message."""
        feature, kind = drift.get("feature"), drift.get("kind")
        reference = [float(x) for x in drift.get("reference") or []]
        if not isinstance(feature, str) or not feature or not reference:
            raise ValueError("drift needs a 'feature' name and a non-empty 'reference'")
        if kind == "categorical":
            categories = [str(c) for c in drift.get("categories") or []]
            if len(categories) != len(reference):
                raise ValueError("drift: 'categories' and 'reference' differ in length")
            index = {c: i for i, c in enumerate(categories)}
            chars = all(len(c) == 1 for c in categories)
            return cls(feature, (*reference, 0.0), index, chars)
        if kind == "numeric":
            edges = [float(x) for x in drift.get("edges") or []]
            if len(edges) == len(reference) + 1:  # outer edges included: bins between them
                edges = edges[1:-1]
            if len(edges) != len(reference) - 1 or edges != sorted(edges):
                raise ValueError("drift: 'edges' must be sorted and fit the 'reference' bins")
            return cls(feature, tuple(reference), cuts=tuple(edges))
        raise ValueError(f"drift: unknown kind {kind!r} (categorical or numeric)")

    def bins(self, value: Any) -> list[int]:
        """The bin of each item of an input value (unusable items are skipped). The common
        shapes — a string of characters, a flat list of numbers — take a fast path."""
        if self.categories:
            other = len(self.proportions) - 1
            index = self.categories
            if isinstance(value, str):
                items: Any = value[:MAX_ITEMS_PER_SAMPLE] if self.characters else (value,)
                return [index.get(item, other) for item in items]
            return [index.get(str(i), other) for i in _items(value, split=self.characters)]
        if isinstance(value, list) and all(type(v) in (int, float) for v in value):
            numbers: list[Any] = value[:MAX_ITEMS_PER_SAMPLE]
        else:
            numbers = [i for i in _items(value, split=False) if _finite_number(i)]
        cuts = self.cuts
        return [bisect.bisect_right(cuts, v) for v in numbers if math.isfinite(v)]


def _finite_number(item: Any) -> bool:
    return isinstance(item, int | float) and not isinstance(item, bool) and math.isfinite(item)


def _items(value: Any, *, split: bool) -> Iterator[Any]:
    """Up to MAX_ITEMS_PER_SAMPLE items: a string's characters (when split), a list's elements
    (flattened), or the value itself."""
    stack: list[Any] = [value]
    count = 0
    while stack and count < MAX_ITEMS_PER_SAMPLE:
        item = stack.pop()
        if isinstance(item, str) and split:
            for char in item[: MAX_ITEMS_PER_SAMPLE - count]:
                count += 1
                yield char
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item[:MAX_ITEMS_PER_SAMPLE]))
        else:
            count += 1
            yield item


@dataclass
class _Window:
    """Counts per time bucket for one version: a ring of ``len(slots)`` buckets."""

    reference: Reference
    slots: list[tuple[int, list[int]]]
    seen: int = 0  # requests offered (for sampling)
    above: bool = False  # last reported side of the threshold

    def add(self, bucket: int, bins: Iterable[int]) -> None:
        slot = bucket % len(self.slots)
        index, counts = self.slots[slot]
        if index != bucket:
            counts = [0] * len(self.reference.proportions)
            self.slots[slot] = (bucket, counts)
        for b in bins:
            counts[b] += 1

    def histogram(self, bucket: int) -> list[int]:
        total = [0] * len(self.reference.proportions)
        for index, counts in self.slots:
            if bucket - len(self.slots) < index <= bucket:
                for i, c in enumerate(counts):
                    total[i] += c
        return total


class DriftMonitor:
    """Sliding-window drift scores of served versions. Thread-safe; cheap per request.

    ``reference_for(tenant, name, version)`` returns the version's ``drift`` section or None
    (asked once per version, then cached: no database read per request).
    """

    def __init__(
        self,
        reference_for: Callable[[str, str, int], Mapping[str, Any] | None],
        clock: Clock,
        *,
        sample_every: int = 8,
        window_s: float = 300.0,
        buckets: int = 10,
        threshold: float = 0.2,
        min_samples: int = 1000,
    ) -> None:
        if sample_every < 1 or window_s <= 0 or buckets < 1 or not 0 < threshold <= 1:
            raise ValueError("drift: bad sampling, window or threshold settings")
        self.reference_for, self.clock = reference_for, clock
        self.sample_every, self.threshold, self.min_samples = sample_every, threshold, min_samples
        self.buckets, self.bucket_s = buckets, window_s / buckets
        self._windows: dict[Key, _Window | None] = {}
        self._lock = threading.Lock()

    # -- the gateway's observer ---------------------------------------------------------------

    def __call__(self, tenant: str, name: str, version: int, inputs: Any) -> None:
        """Observer hook: count one request's feature (1 in ``sample_every``). Never raises."""
        try:
            self.observe(tenant, name, version, inputs)
        except Exception as error:  # a drift bug must never fail a prediction
            log.warning("drift observer failed for %s/%s:%s: %s", tenant, name, version, error)

    def observe(self, tenant: str, name: str, version: int, inputs: Any) -> None:
        key = (tenant, name, version)
        window = self._windows.get(key, _MISSING)
        if window is _MISSING:
            window = self._load(key)
        if window is None:
            return
        # No lock for the counter: a lost increment between threads only shifts the sample.
        window.seen += 1
        if (window.seen - 1) % self.sample_every or not isinstance(inputs, Mapping):
            return
        bins = window.reference.bins(inputs.get(window.reference.feature))
        bucket = int(self.clock.now() // self.bucket_s)
        with self._lock:
            window.add(bucket, bins)

    def _load(self, key: Key) -> _Window | None:
        key = (key[0], key[1], int(key[2]))
        try:
            meta = self.reference_for(*key)
            reference = Reference.from_meta(meta) if meta else None
        except Exception as error:
            log.warning("no drift reference for %s/%s:%s: %s", *key, error)
            reference = None
        window = None
        if reference is not None:
            empty = [0] * len(reference.proportions)
            window = _Window(reference, [(-1, list(empty)) for _ in range(self.buckets)])
        with self._lock:
            return self._windows.setdefault(key, window)

    # -- scores, events, metrics --------------------------------------------------------------

    def scores(self) -> dict[Key, float]:
        """The current score of every version with at least ``min_samples`` counts."""
        bucket = int(self.clock.now() // self.bucket_s)
        with self._lock:
            live = {k: (w, w.histogram(bucket)) for k, w in self._windows.items() if w}
        result = {}
        for key, (window, histogram) in live.items():
            if sum(histogram) >= self.min_samples:
                result[key] = js_distance(histogram, window.reference.proportions)
        return result

    def tick(self, emit: Emit) -> None:
        """Report threshold crossings: ``model.drift`` going over, ``model.drift_cleared``
        once back under ``REARM × threshold``. Idempotent between crossings."""
        for (tenant, name, version), score in self.scores().items():
            window = self._windows.get((tenant, name, version))
            if window is None:
                continue
            if not window.above and score >= self.threshold:
                kind = "model.drift"
            elif window.above and score < self.threshold * REARM:
                kind = "model.drift_cleared"
            else:
                continue
            details = {
                "model": name,
                "version": version,
                "feature": window.reference.feature,
                "score": round(score, 4),
                "threshold": self.threshold,
                "window_s": self.bucket_s * self.buckets,
            }
            emit(tenant, kind, details)  # first, so a failed write is retried next tick
            window.above = kind == "model.drift"

    def forget(self, tenant: str, name: str, version: int) -> None:
        """Drop a version's window (it was undeployed)."""
        with self._lock:
            self._windows.pop((tenant, name, int(version)), None)

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            DRIFT_FAMILY,
            "Jensen-Shannon distance between a version's live inputs and its training reference "
            "over a sliding window (0 = same distribution, 1 = disjoint).",
            labels=["tenant", "model", "version"],
        )
        for (tenant, name, version), score in sorted(self.scores().items()):
            gauge.add_metric([tenant, name, str(version)], score)
        yield gauge


_MISSING: Any = object()


def install(
    serving: Any, store: Any, clock: Clock, environ: Mapping[str, str] | None = None
) -> DriftMonitor:
    """Watch every prediction ``serving``'s gateway routes (``aicluster.serve.Serving``) and
    report crossings from the leader. Settings from the environment: ``AICLUSTER_DRIFT_THRESHOLD``
    (0.2), ``AICLUSTER_DRIFT_SAMPLE_EVERY`` (8), ``AICLUSTER_DRIFT_WINDOW_S`` (300),
    ``AICLUSTER_DRIFT_MIN_SAMPLES`` (1000)."""
    env = os.environ if environ is None else environ

    def reference_for(tenant: str, name: str, version: int) -> Mapping[str, Any] | None:
        drift = store.get_model_version(tenant, name, version).meta.get("drift")
        return drift if isinstance(drift, Mapping) else None

    def emit(tenant: str, kind: str, details: dict[str, Any]) -> None:
        store.record_deployment_event(tenant, details["model"], kind, "drift-monitor", details)

    monitor = DriftMonitor(
        reference_for,
        clock,
        threshold=float(env.get("AICLUSTER_DRIFT_THRESHOLD", 0.2)),
        sample_every=int(env.get("AICLUSTER_DRIFT_SAMPLE_EVERY", 8)),
        window_s=float(env.get("AICLUSTER_DRIFT_WINDOW_S", 300)),
        min_samples=int(env.get("AICLUSTER_DRIFT_MIN_SAMPLES", 1000)),
    )
    serving.gateway.observers.append(monitor)
    serving.leader_tasks.append(lambda now: monitor.tick(emit))
    return monitor
