"""Jobs as the scheduler sees them, and the job state machine."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from aicluster.core.init_args import rebuilt_by_init
from aicluster.core.resources import ANY_GPU_TYPE, memory_mib, millicpus
from aicluster.core.topology import DomainLevel

__all__ = [
    "PRIORITY_CLASSES",
    "TERMINAL_STATES",
    "IllegalTransition",
    "Job",
    "JobState",
    "Parallelism",
    "check_transition",
    "priority_of",
]

#: Named priority classes; higher preempts lower. Any integer is accepted too.
PRIORITY_CLASSES: dict[str, int] = {"low": 100, "normal": 200, "high": 300, "critical": 400}


def priority_of(name_or_value: str | int) -> int:
    """The integer priority of a class name ("high") or an integer given as such."""
    if isinstance(name_or_value, int):
        return name_or_value
    text = name_or_value.strip().lower()
    if text in PRIORITY_CLASSES:
        return PRIORITY_CLASSES[text]
    try:
        return int(text)
    except ValueError:
        names = ", ".join(PRIORITY_CLASSES)
        raise ValueError(
            f"unknown priority {name_or_value!r} (use {names} or an integer)"
        ) from None


@dataclass(frozen=True, slots=True)
class Parallelism:
    """Degrees of parallelism over GPUs: data × tensor × pipeline = the job's GPUs (when set)."""

    data: int = 1
    tensor: int = 1
    pipeline: int = 1

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return rebuilt_by_init(self)  # (see core/init_args.py)

    def __post_init__(self) -> None:
        if min(self.data, self.tensor, self.pipeline) < 1:
            raise ValueError("parallelism degrees must be at least 1")

    @property
    def world(self) -> int:
        return self.data * self.tensor * self.pipeline


_DATA_PARALLEL = Parallelism()  # the default: frozen, so one shared by every job that takes it


@dataclass(frozen=True, slots=True, init=False)
class Job:
    """A gang of ``workers`` identical workers, each holding ``gpus_per_worker`` GPUs (maybe
    none), ``cpus_per_worker`` CPUs and ``memory_gb_per_worker`` GB of memory on one node.

    The placement unit is the larger of a worker and a tensor-parallel group: a unit never spans
    nodes, and a tensor-parallel group (tensor > 1) stays inside one NVLink domain. ``max_domain``
    is the widest topology level the gang may span (``rack`` keeps it inside one rack).
    ``true_duration`` is known only in simulation and read only by the oracle policies.
    """

    id: str
    tenant: str
    workers: int
    gpus_per_worker: int
    gpu_type: str
    cpus_per_worker: float
    memory_gb_per_worker: float
    priority: int
    submit_time: float
    duration_estimate: float | None
    checkpoint_interval: float | None
    parallelism: Parallelism
    max_domain: DomainLevel
    preemptible: bool
    true_duration: float | None
    min_workers: int | None
    #: The input shards the job reads and their bytes (``tenant/sha256`` keys, resolved at
    #: submit; the simulator's: a dataset name): what the data-locality term counts.
    data: tuple[tuple[str, int], ...]
    # Derived sizes, computed once: the scheduler reads them many times per cycle.
    total_gpus: int = field(init=False, repr=False, compare=False)
    unit_gpus: int = field(init=False, repr=False, compare=False)
    units: int = field(init=False, repr=False, compare=False)
    needs_nvlink: bool = field(init=False, repr=False, compare=False)
    unit_millicpus: int = field(init=False, repr=False, compare=False)
    unit_memory_mib: int = field(init=False, repr=False, compare=False)
    needs_host: bool = field(init=False, repr=False, compare=False)

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return rebuilt_by_init(self)  # (see core/init_args.py)

    # Written out (init=False) rather than generated: mypyc compiles a class's own __init__ (each
    # object.__setattr__ of a frozen class to a store, about thirty times faster, measured) but
    # leaves the one dataclasses generates interpreted; a replay makes one Job per trace job.
    def __init__(
        self,
        id: str,
        tenant: str,
        workers: int = 1,
        gpus_per_worker: int = 1,
        gpu_type: str = ANY_GPU_TYPE,
        cpus_per_worker: float = 0.0,
        memory_gb_per_worker: float = 0.0,
        priority: int = PRIORITY_CLASSES["normal"],
        submit_time: float = 0.0,
        duration_estimate: float | None = None,
        checkpoint_interval: float | None = None,
        parallelism: Parallelism = _DATA_PARALLEL,
        max_domain: DomainLevel = DomainLevel.CLUSTER,
        preemptible: bool = True,
        true_duration: float | None = None,
        min_workers: int | None = None,
        data: tuple[tuple[str, int], ...] = (),
    ) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "workers", workers)
        object.__setattr__(self, "gpus_per_worker", gpus_per_worker)
        object.__setattr__(self, "gpu_type", gpu_type)
        object.__setattr__(self, "cpus_per_worker", cpus_per_worker)
        object.__setattr__(self, "memory_gb_per_worker", memory_gb_per_worker)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "submit_time", submit_time)
        object.__setattr__(self, "duration_estimate", duration_estimate)
        object.__setattr__(self, "checkpoint_interval", checkpoint_interval)
        object.__setattr__(self, "parallelism", parallelism)
        object.__setattr__(self, "max_domain", max_domain)
        object.__setattr__(self, "preemptible", preemptible)
        object.__setattr__(self, "true_duration", true_duration)
        object.__setattr__(self, "min_workers", min_workers)
        object.__setattr__(self, "data", data)
        self.__post_init__()

    def __post_init__(self) -> None:
        tensor = self.parallelism.tensor
        total = self.workers * self.gpus_per_worker
        # GPUs that must sit on one node together (a worker, or a tensor-parallel group).
        unit = max(self.gpus_per_worker, tensor) if self.gpus_per_worker else 0
        object.__setattr__(self, "total_gpus", total)
        object.__setattr__(self, "unit_gpus", unit)
        object.__setattr__(self, "units", total // unit if unit else self.workers)
        # A tensor-parallel group must stay inside one NVLink domain.
        object.__setattr__(self, "needs_nvlink", tensor > 1)
        # CPUs and memory go with the unit's workers onto its node.
        per_unit = self.workers // self.units if self.units else 1
        cpus = millicpus(self.cpus_per_worker) * per_unit
        memory = memory_mib(self.memory_gb_per_worker) * per_unit
        object.__setattr__(self, "unit_millicpus", cpus)
        object.__setattr__(self, "unit_memory_mib", memory)
        object.__setattr__(self, "needs_host", bool(cpus or memory))
        if self.workers < 1:
            raise ValueError(f"job {self.id}: workers must be at least 1")
        if self.min_workers is not None and not 1 <= self.min_workers <= self.workers:
            raise ValueError(f"job {self.id}: min_workers must be between 1 and workers")
        if self.gpus_per_worker < 0:
            raise ValueError(f"job {self.id}: gpus_per_worker cannot be negative")
        if self.cpus_per_worker < 0 or self.memory_gb_per_worker < 0:
            raise ValueError(f"job {self.id}: CPUs and memory cannot be negative")
        if self.gpus_per_worker and tensor > 1:
            small, large = sorted((tensor, self.gpus_per_worker))
            if large % small:
                raise ValueError(
                    f"job {self.id}: tensor parallelism {tensor} and {self.gpus_per_worker} "
                    "GPUs per worker must divide one another"
                )
            if self.total_gpus % self.unit_gpus:
                raise ValueError(
                    f"job {self.id}: {self.total_gpus} GPUs do not split into tensor-parallel "
                    f"groups of {tensor}"
                )

    @property
    def total_millicpus(self) -> int:
        return self.unit_millicpus * self.units

    @property
    def total_memory_mib(self) -> int:
        return self.unit_memory_mib * self.units

    @property
    def workers_per_unit(self) -> int:
        return self.workers // self.units

    @property
    def elastic(self) -> bool:
        """Whether the job may run on fewer workers than it asks for (down to min_workers)."""
        return self.min_workers is not None and self.min_workers < self.workers

    def smaller_sizes(self) -> list[int]:
        """Worker counts it may shrink to, largest first: whole placement units only."""
        if not self.elastic or self.min_workers is None:
            return []
        step = self.workers_per_unit
        return [w for w in range(self.workers - 1, self.min_workers - 1, -1) if w % step == 0]

    def resized(self, workers: int) -> Job:
        """The same job on ``workers`` workers (data parallelism scaled with it)."""
        if workers == self.workers:
            return self
        p = self.parallelism
        data = max(1, p.data * workers // self.workers)
        return replace(self, workers=workers, parallelism=Parallelism(data, p.tensor, p.pipeline))

    def workers_for(self, slots: int) -> int:
        """Workers a placement of ``slots`` placement units holds."""
        return slots * self.workers_per_unit


class JobState(StrEnum):
    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    PREEMPTING = "PREEMPTING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def holds_resources(self) -> bool:
        return self in (
            JobState.STARTING,
            JobState.RUNNING,
            JobState.PREEMPTING,
            JobState.RESTARTING,
        )


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

_ENDINGS = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.STARTING, JobState.CANCELLED, JobState.FAILED}),
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.PENDING, JobState.RESTARTING, JobState.PREEMPTING} | _ENDINGS
    ),
    JobState.RUNNING: frozenset(
        {JobState.PREEMPTING, JobState.RESTARTING, JobState.PENDING} | _ENDINGS
    ),
    JobState.PREEMPTING: frozenset({JobState.PENDING} | _ENDINGS),
    JobState.RESTARTING: frozenset(
        {JobState.STARTING, JobState.RUNNING, JobState.PENDING, JobState.PREEMPTING} | _ENDINGS
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    """A job was asked to move between two states that are not connected."""


def check_transition(current: JobState, target: JobState) -> None:
    """Raise :class:`IllegalTransition` unless ``current → target`` is allowed."""
    if target not in _TRANSITIONS[current]:
        raise IllegalTransition(f"a {current.value} job cannot become {target.value}")
