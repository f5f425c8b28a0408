"""Predicted run times from a cluster's own history (quantile gradient boosting, scikit-learn).

A :class:`DurationPredictor` learns ``log(run time)`` from finished jobs' tenant, user, name,
resources and requested time (the spec's ``duration_estimate``), one model per quantile
(``HistGradientBoostingRegressor(loss="quantile")``). With fewer than ``min_history`` finished
jobs it has no model and says so (:attr:`Prediction.source` ``"request"`` or ``"none"``): the
policy then falls back to the request. :class:`OnlinePredictor` retrains on a schedule over the
jobs finished before each retraining, so a replay predicts as the cluster could have at each
submission (no look-ahead).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from aicluster.sim.traces import TraceJob

__all__ = [
    "DurationPredictor",
    "OnlinePredictor",
    "Prediction",
    "PredictionOptions",
    "Sample",
    "sample_of",
]

_MAX_CATEGORIES = 250  # HistGradientBoosting's categories are codes below 255 (its bins)


@dataclass(frozen=True, slots=True)
class Sample:
    """What a prediction reads of a job (and, to train, the run time it had)."""

    tenant: str
    user: str = ""
    name: str = ""
    gpus: int = 1
    workers: int = 1
    cpus: float = 0.0
    memory_gb: float = 0.0
    requested: float | None = None  # the user's duration_estimate
    duration: float | None = None  # the measured run time (training samples)


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted run time quantiles in seconds (``{0.5: ..., 0.9: ...}``), or none: ``source``
    says where the estimate comes from (``model``, ``request``: no history, the user's estimate;
    ``none``: neither)."""

    quantiles: dict[float, float]
    source: str
    trained_on: int = 0

    @property
    def estimate(self) -> float | None:
        """The value the scheduler reads: the median (or the request without a model)."""
        if not self.quantiles:
            return None
        return self.quantiles.get(0.5, next(iter(self.quantiles.values())))


@dataclass(frozen=True, slots=True)
class PredictionOptions:
    """The configuration's ``prediction`` section, as the simulator and the live loop take it."""

    retrain_interval_s: float = 86_400.0
    min_history: int = 20

    def predictor(self) -> OnlinePredictor:
        return OnlinePredictor(self.retrain_interval_s, min_history=self.min_history)


class _Codes:
    """Category codes of a text feature: its most frequent values; others are missing."""

    def __init__(self, values: Sequence[str]) -> None:
        common = Counter(values).most_common(_MAX_CATEGORIES)
        self.codes = {value: float(code) for code, (value, _) in enumerate(common)}

    def __call__(self, value: str) -> float:
        return self.codes.get(value, math.nan)


class DurationPredictor:
    """Quantile models of the run time; :meth:`fit` then :meth:`predict`."""

    def __init__(
        self, quantiles: Sequence[float] = (0.5, 0.9), min_history: int = 20, seed: int = 0
    ) -> None:
        self.quantiles = tuple(quantiles)
        self.min_history = min_history
        self.seed = seed
        self.models: dict[float, object] = {}
        self.codes: tuple[_Codes, _Codes, _Codes] | None = None
        self.trained_on = 0

    def fit(self, history: Sequence[Sample]) -> bool:
        """Train on ``history`` (samples with a duration); False, and no model, when it holds
        fewer than ``min_history``."""
        from sklearn.ensemble import HistGradientBoostingRegressor

        done = [s for s in history if s.duration is not None and s.duration > 0]
        if len(done) < self.min_history:
            self.models, self.codes, self.trained_on = {}, None, 0
            return False
        self.codes = (
            _Codes([s.tenant for s in done]),
            _Codes([s.user for s in done]),
            _Codes([s.name for s in done]),
        )
        features = self._features(done)
        target = np.log1p([s.duration for s in done if s.duration is not None])
        self.models = {}
        for q in self.quantiles:
            model = HistGradientBoostingRegressor(
                loss="quantile",
                quantile=q,
                categorical_features=[True, True, True] + [False] * 5,
                max_iter=100,
                # Small histories (a new cluster) still split: a leaf of a tenth of them.
                min_samples_leaf=min(20, max(2, len(done) // 10)),
                random_state=self.seed,
            )
            self.models[q] = model.fit(features, target)
        self.trained_on = len(done)
        return True

    def predict(self, sample: Sample) -> Prediction:
        return self.predict_many([sample])[0]

    def predict_many(self, samples: Sequence[Sample]) -> list[Prediction]:
        if not self.models:
            return [_fallback(sample) for sample in samples]
        features = self._features(samples)
        columns = {
            q: np.expm1(model.predict(features))  # type: ignore[attr-defined]
            for q, model in self.models.items()
        }
        return [
            Prediction(
                {q: max(float(values[i]), 1.0) for q, values in columns.items()},
                "model",
                self.trained_on,
            )
            for i in range(len(samples))
        ]

    def _features(self, samples: Sequence[Sample]) -> np.ndarray:
        assert self.codes is not None
        tenant, user, name = self.codes
        rows = [
            [
                tenant(s.tenant),
                user(s.user),
                name(s.name),
                math.log1p(s.gpus),
                float(s.workers),
                s.cpus,
                s.memory_gb,
                -1.0 if s.requested is None else math.log1p(s.requested),  # -1: none given
            ]
            for s in samples
        ]
        return np.asarray(rows, dtype=np.float64)


def _fallback(sample: Sample) -> Prediction:
    """No model: the user's request, else nothing."""
    if sample.requested is None:
        return Prediction({}, "none")
    return Prediction({0.5: sample.requested}, "request")


class OnlinePredictor:
    """A predictor retrained every ``interval_s`` (simulated or live seconds) on the jobs
    finished so far: the simulator reports each job's arrival (:meth:`submitted`, which answers
    its estimate) and its end (:meth:`ended`, with the run time it had)."""

    def __init__(self, interval_s: float = 86_400.0, **options: object) -> None:
        self.interval_s = interval_s
        self.model = DurationPredictor(**options)  # type: ignore[arg-type]
        self.history: list[Sample] = []
        self.waiting: dict[str, Sample] = {}
        self.next_fit = -math.inf
        self.fits = 0
        self.predicted: dict[str, Prediction] = {}  # per job id, what it was told at submission

    def estimate(self, sample: Sample, now: float) -> Prediction:
        """The prediction at ``now`` (retraining first when the schedule says so)."""
        if now >= self.next_fit:
            self.model.fit(self.history)
            self.next_fit = now + self.interval_s
            self.fits += 1
        return self.model.predict(sample)

    def submitted(self, trace: TraceJob, now: float) -> float | None:
        """What the scheduler reads of a job arriving at ``now``: the user's estimate where it
        gave one, else the live cluster's prediction where the trace recorded it (a twin
        export), else the prediction (made in advance by :meth:`predict_ahead`, or now)."""
        sample = self.waiting[trace.id] = sample_of(trace)
        if trace.duration_estimate is not None:
            return trace.duration_estimate
        if trace.predicted_duration is not None:  # the live cluster's, at submit (a twin)
            return trace.predicted_duration
        prediction = self.predicted.get(trace.id)
        if prediction is None:
            prediction = self.predicted[trace.id] = self.estimate(sample, now)
        return prediction.estimate

    def predict_ahead(self, traces: Sequence[TraceJob]) -> None:
        """Predict ``traces`` in one batch with the model as it is, and never retrain: a fixed
        train/test split (``bench/predict_durations.py``), much faster than one by one."""
        self.model.fit(self.history)
        self.next_fit = math.inf
        predictions = self.model.predict_many([sample_of(trace) for trace in traces])
        self.predicted.update(zip((trace.id for trace in traces), predictions, strict=True))

    def ended(self, job_id: str, duration: float) -> None:
        sample = self.waiting.pop(job_id, None)
        if sample is not None:
            self.history.append(replace(sample, duration=duration))


def sample_of(trace: TraceJob) -> Sample:
    """A trace row as the predictor reads it (the trace's tenant, shape and estimate)."""
    return Sample(
        tenant=trace.tenant,
        gpus=trace.num_gpus,
        workers=trace.workers or 1,
        cpus=trace.cpus,
        memory_gb=trace.memory_gb,
        requested=trace.duration_estimate,
    )
