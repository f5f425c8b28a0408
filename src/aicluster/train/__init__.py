"""The library imported inside jobs: distributed setup, step telemetry, checkpoints, stopping.

``ctx = train.init()`` then ``train.report(step, loss=..., samples=...)`` each step;
``train.Checkpointer`` saves and resumes (:mod:`aicluster.train.checkpoint`), and
``train.mesh()`` lays the ranks out for hybrid parallelism (:mod:`aicluster.train.devicemesh`);
``train.should_stop()`` says when the runtime asked the job to stop
(:mod:`aicluster.train.preemption`); :mod:`aicluster.train.export` writes the trained model for
the registry and loads it for serving. It never imports the control plane (``aicluster.control``,
``aicluster.api``, ``aicluster.store``) nor the Ray runtime. ``torch`` is imported only when a
function needs it: the runtime reads this package's telemetry format without loading torch.
"""

from typing import TYPE_CHECKING, Any

from aicluster.train.data import dataset
from aicluster.train.preemption import request_stop, should_stop, stop_requested
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

if TYPE_CHECKING:
    from aicluster.train.checkpoint import Checkpointer, ResumeState

__all__ = [
    "Checkpointer",
    "Context",
    "ResumeState",
    "StepRecord",
    "TelemetryWriter",
    "barrier",
    "choose_backend",
    "context",
    "dataset",
    "init",
    "is_main",
    "mesh",
    "read_records",
    "report",
    "request_stop",
    "should_stop",
    "shutdown",
    "stop_requested",
]

_LAZY = {"Checkpointer", "ResumeState"}


def mesh(*, pipeline: int | None = None, data: int | None = None, tensor: int | None = None) -> Any:
    """The job's ``DeviceMesh`` (``pp``, ``dp``, ``tp``): see :mod:`aicluster.train.devicemesh`."""
    from aicluster.train import devicemesh

    return devicemesh.mesh(pipeline=pipeline, data=data, tensor=tensor)


def __getattr__(name: str) -> Any:
    # The checkpoint module imports torch; load it on first use only.
    if name in _LAZY:
        from aicluster.train import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'aicluster.train' has no attribute {name!r}")
