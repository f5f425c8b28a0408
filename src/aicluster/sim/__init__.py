"""The cluster simulator and digital twin: the real scheduler against a simulated clock.

Trace loaders (Philly, generic CSV, a seeded synthetic generator), node failures and a power
model, the discrete-event engine, metrics, and reports (JSON, CSV, PNG and HTML).
"""

from aicluster.sim.config import LLAMA3_GPU_HOURS_PER_INTERRUPTION, SimConfig
from aicluster.sim.engine import Simulator, simulate
from aicluster.sim.failures import FailureModel
from aicluster.sim.metrics import (
    JobTable,
    Series,
    SimResult,
    jain_index,
    max_min_shares,
    preemption_summary,
    summarize,
)
from aicluster.sim.synthetic import PHILLY_GPU_MIX, SyntheticMix, arrival_rate, synthetic_jobs
from aicluster.sim.traces import (
    PHILLY,
    TraceError,
    TraceJob,
    gang_shape,
    load_csv,
    load_philly,
    load_trace,
)

__all__ = [
    "LLAMA3_GPU_HOURS_PER_INTERRUPTION",
    "PHILLY",
    "PHILLY_GPU_MIX",
    "FailureModel",
    "JobTable",
    "Series",
    "SimConfig",
    "SimResult",
    "Simulator",
    "SyntheticMix",
    "TraceError",
    "TraceJob",
    "arrival_rate",
    "gang_shape",
    "jain_index",
    "load_csv",
    "load_philly",
    "load_trace",
    "max_min_shares",
    "preemption_summary",
    "simulate",
    "summarize",
    "synthetic_jobs",
]
