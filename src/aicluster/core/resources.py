"""Resource amounts: GPUs of a type, CPUs and memory."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ANY_GPU_TYPE", "Resources", "memory_mib", "millicpus"]

#: A request whose gpu_type is this string accepts any GPU type.
ANY_GPU_TYPE = "any"


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of resources held by one worker or offered by one node."""

    gpus: int = 0
    gpu_type: str = ANY_GPU_TYPE
    cpus: float = 0.0
    memory_gb: float = 0.0

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.cpus < 0 or self.memory_gb < 0:
            raise ValueError(f"resources cannot be negative: {self}")

    def scaled(self, factor: int) -> Resources:
        """The same resources, ``factor`` times over (a gang of identical workers)."""
        return Resources(
            self.gpus * factor, self.gpu_type, self.cpus * factor, self.memory_gb * factor
        )

    def accepts_gpu_type(self, gpu_type: str) -> bool:
        return self.gpu_type == ANY_GPU_TYPE or self.gpu_type == gpu_type


# The scheduler counts CPUs and memory in whole milli-CPUs and MiB: integer sums come back
# exactly when a job's share is taken and given back, where float sums drift.


def millicpus(cpus: float) -> int:
    """CPUs as whole milli-CPUs (what the free-capacity index counts)."""
    return round(cpus * 1000)


def memory_mib(memory_gb: float) -> int:
    """Memory in GB (GiB, as Ray counts it) as whole MiB."""
    return round(memory_gb * 1024)
