"""The library imported inside jobs: distributed setup and step telemetry.

``ctx = train.init()`` then ``train.report(step, loss=..., samples=...)`` each step.
It never imports the control plane (``aicluster.control``, ``aicluster.api``, ``aicluster.store``)
nor the Ray runtime; checkpoint/resume will join it (next issue).
"""

from aicluster.train.session import (
    Context,
    barrier,
    choose_backend,
    context,
    init,
    is_main,
    report,
    shutdown,
)
from aicluster.train.telemetry import StepRecord, TelemetryWriter, read_records

__all__ = [
    "Context",
    "StepRecord",
    "TelemetryWriter",
    "barrier",
    "choose_backend",
    "context",
    "init",
    "is_main",
    "read_records",
    "report",
    "shutdown",
]
