"""One job of a trace (:class:`TraceJob`), in a module of its own so that the compiled build
(setup.py) compiles it: a month at 220,000 GPUs makes four million of them."""

from __future__ import annotations

from dataclasses import dataclass

from aicluster.core import ANY_GPU_TYPE, PRIORITY_CLASSES
from aicluster.core.init_args import rebuilt_by_init

__all__ = ["DEFAULT_TENANT", "TraceJob"]

DEFAULT_TENANT = "default"
_NORMAL = PRIORITY_CLASSES["normal"]


@dataclass(frozen=True, slots=True, init=False)
class TraceJob:
    """One job of a trace: when it arrives, how long it runs, how many GPUs it holds, and the
    CPUs and memory (GB) it holds in all (0: it asks for none; traces such as Philly give none).
    A job of no GPU asks for CPUs or memory, and is one worker.

    ``comm_sensitivity``: None takes the configuration's default (sim.comm). ``workers``: the
    gang's shape where the trace gives it (a live cluster's export); None: gang_shape's.
    ``duration_estimate``: the user's estimate (backfill reads it). ``predicted_duration``: the
    live cluster's prediction of its run time at submit (a twin export): a replay with
    predictions on reads it instead of predicting again, as the live cluster decided.
    ``dataset``: the dataset the job reads ("": none; sim.data), ``data_gb`` its size."""

    id: str
    submit_time: float
    duration: float
    num_gpus: int
    tenant: str
    priority: int
    gpu_type: str
    cpus: float
    memory_gb: float
    comm_sensitivity: float | None
    workers: int | None
    duration_estimate: float | None
    predicted_duration: float | None
    dataset: str
    data_gb: float

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return rebuilt_by_init(self)  # (see core/init_args.py)

    # Written out (init=False) rather than generated: mypyc compiles a class's own __init__ (about
    # thirty times faster, measured) but leaves the one dataclasses generates interpreted.
    def __init__(
        self,
        id: str,
        submit_time: float,
        duration: float,
        num_gpus: int,
        tenant: str = DEFAULT_TENANT,
        priority: int = _NORMAL,
        gpu_type: str = ANY_GPU_TYPE,
        cpus: float = 0.0,
        memory_gb: float = 0.0,
        comm_sensitivity: float | None = None,
        workers: int | None = None,
        duration_estimate: float | None = None,
        predicted_duration: float | None = None,
        dataset: str = "",
        data_gb: float = 0.0,
    ) -> None:
        # (object.__setattr__: the class is frozen; mypyc compiles each call to a store)
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "submit_time", submit_time)
        object.__setattr__(self, "duration", duration)
        object.__setattr__(self, "num_gpus", num_gpus)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "gpu_type", gpu_type)
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "memory_gb", memory_gb)
        object.__setattr__(self, "comm_sensitivity", comm_sensitivity)
        object.__setattr__(self, "workers", workers)
        object.__setattr__(self, "duration_estimate", duration_estimate)
        object.__setattr__(self, "predicted_duration", predicted_duration)
        object.__setattr__(self, "dataset", dataset)
        object.__setattr__(self, "data_gb", data_gb)
