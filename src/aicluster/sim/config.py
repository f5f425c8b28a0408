"""Simulation settings: checkpointing, restarts, failures, cycle cadence and sampling."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GC_THRESHOLD", "LLAMA3_GPU_HOURS_PER_INTERRUPTION", "SimConfig"]

#: Llama 3 (Meta, 2024): 419 unexpected interruptions in 54 days of pre-training on 16,384 GPUs,
#: i.e. one interruption per ≈ 50,700 GPU-hours (≈ 6,300 hours, 264 days, per 8-GPU node).
LLAMA3_GPU_HOURS_PER_INTERRUPTION = 16_384 * 54 * 24 / 419

#: Allocations between collections of the youngest generation during a run with
#: ``fewer_collections`` (Python's default is 700).
GC_THRESHOLD = 200_000


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything the simulated control loop needs besides the cluster, trace and policy.

    - ``checkpoint_interval``: seconds between a running job's checkpoints; a stopped job keeps
      the progress of its last checkpoint (None: jobs never checkpoint, a stop loses the run).
    - ``checkpoint_on_preemption``: a preempted job saves a checkpoint in its grace period (as
      jobs that poll ``aicluster.train.should_stop`` do) and loses no work; otherwise it keeps
      only its last periodic checkpoint. Node failures always lose the work since that one.
    - ``restart_overhead``: seconds a resumed job spends restoring before it makes progress.
    - ``failures``: simulate node failures; ``gpu_hours_per_failure`` is the MTBF of one GPU
      (a node of ``g`` GPUs fails on average every ``gpu_hours_per_failure / g`` hours) and a
      failed node comes back after ``repair_seconds``.
    - ``cycle_interval``: 0 runs a scheduling cycle after every batch of simultaneous events;
      ``n > 0`` runs at most one cycle every ``n`` simulated seconds, like a periodic scheduler.
    - ``until``: stop the simulation at this simulated time (None: when every job is done).
    - ``sample_step``: initial step of the utilization/queue series; it doubles whenever the
      series would exceed ``max_samples`` points, so memory stays bounded on any horizon.
    - ``seed``: seeds the failure model (and nothing else: traces bring their own randomness).
    - ``comm_sensitivity``: the communication sensitivity of a job whose trace gives none, by
      size class: (least GPUs, sensitivity) pairs, increasing; a job takes the last class it
      reaches, 0 below all (:mod:`aicluster.sim.comm`; empty: the model is off for such jobs).
    - ``data_cache_bytes``: each node's dataset cache (:mod:`aicluster.sim.data`), as the real
      node cache's bound.
    - ``fewer_collections``: a speed-up that decides nothing: during a run Python's cyclic
      garbage collector looks at new objects every ``GC_THRESHOLD`` allocations instead of its
      default 700 (a replay allocates millions of short-lived objects and makes no cycles; a
      month at 220,000 GPUs spends about a twentieth of its time in the collector otherwise).
    """

    checkpoint_interval: float | None = 1800.0
    checkpoint_on_preemption: bool = False
    restart_overhead: float = 60.0
    failures: bool = True
    gpu_hours_per_failure: float = LLAMA3_GPU_HOURS_PER_INTERRUPTION
    repair_seconds: float = 4 * 3600.0
    cycle_interval: float = 0.0
    until: float | None = None
    sample_step: float = 60.0
    max_samples: int = 4096
    seed: int = 0
    comm_sensitivity: tuple[tuple[int, float], ...] = ()
    data_cache_bytes: int = 20_000_000_000  # 20 GB, as traces give data_gb
    fewer_collections: bool = True

    def __post_init__(self) -> None:
        if self.checkpoint_interval is not None and self.checkpoint_interval <= 0:
            raise ValueError("checkpoint_interval must be positive (or None for no checkpoints)")
        for name in ("restart_overhead", "repair_seconds", "cycle_interval"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} cannot be negative")
        if self.gpu_hours_per_failure <= 0:
            raise ValueError("gpu_hours_per_failure must be positive")
        if self.sample_step <= 0 or self.max_samples < 2:
            raise ValueError("sample_step must be positive and max_samples at least 2")
        sizes = [gpus for gpus, _ in self.comm_sensitivity]
        if sizes != sorted(set(sizes)) or any(gpus < 1 for gpus in sizes):
            raise ValueError("comm_sensitivity's GPU counts must be increasing, from 1")
        if self.data_cache_bytes < 0:
            raise ValueError("data_cache_bytes cannot be negative")
        if any(not 0 <= value <= 1 for _, value in self.comm_sensitivity):
            raise ValueError("a comm_sensitivity must lie between 0 and 1")
