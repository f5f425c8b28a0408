"""What the control loop drives, as ports: the runtime of gangs and the gangs themselves.

The loop (:mod:`aicluster.control.loop.loop`, :mod:`aicluster.control.loop.lifecycle`) needs a
runtime that launches gangs, finds them again, warms nodes up and reads their telemetry; it does
not need Ray. :class:`aicluster.runtime.Runtime` is the real adapter (Ray on the nodes); the tests'
``tests/fakeruntime.py`` scripts gangs on an injected clock, so the loop's rules (restart and
back-off, requeue with progress, preemption with a grace checkpoint, hang detection, adoption)
run as unit tests in milliseconds. The data that crosses the port (a gang's spec, its status,
its telemetry records, a view of the nodes) is the runtime's plain data, no Ray object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # data types only: the port itself never reaches Ray
    from aicluster.runtime import ClusterView, GangSpec, GangStatus, LogChunk
    from aicluster.runtime.joboutput import Rejects
    from aicluster.runtime.rundir import Stream
    from aicluster.runtime.sandbox.bwrap import SandboxConfig
    from aicluster.train.telemetry import StepRecord

__all__ = ["Gang", "GangRuntime", "Telemetry"]


class Telemetry(Protocol):
    """A gang's telemetry as it is written: each :meth:`poll` returns the records since the
    last; :attr:`rejects` counts the records dropped (the caller reports them)."""

    @property
    def rejects(self) -> Rejects: ...

    def poll(self) -> list[StepRecord]: ...


class Gang(Protocol):
    """One attempt of a job's gang (``runtime.GangHandle`` for Ray)."""

    @property
    def job_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def nodes(self) -> Sequence[str]:
        """Each rank's node, as launched."""
        ...

    def ended(self) -> bool:
        """Whether the attempt was stopped or one of its rank processes exited (then there is
        nothing left to launch, only an end to settle)."""
        ...

    def status(self, timeout_s: float = ...) -> GangStatus:
        """Each rank's state and the gang's phase. Read-only."""
        ...

    def stop(self, grace_s: float = ...) -> GangStatus:
        """SIGTERM, ``grace_s`` to exit, then SIGKILL; frees the gang's resources. Idempotent."""
        ...

    def telemetry_cursor(self) -> Telemetry: ...


class GangRuntime(Protocol):
    """Gangs on a cluster (``runtime.Runtime`` for Ray). ``state_dir`` holds the run
    directories the control plane reads (logs, exit records, exports)."""

    @property
    def state_dir(self) -> str: ...

    @property
    def sandbox(self) -> SandboxConfig | None: ...

    def launch(self, spec: GangSpec) -> Gang:
        """Start the attempt; idempotent per (job, attempt). Raises on a bad placement or a
        launch that cannot start in time (the loop requeues the job)."""
        ...

    def gang(self, job_id: str, attempt: int | None = None) -> Gang | None:
        """The attempt's gang (the latest when None), or None if it never started."""
        ...

    def live_gangs(self) -> Sequence[Gang]:
        """The gangs the cluster still holds, for reconciliation after a restart."""
        ...

    def release_disks(self, active: Callable[[str], bool]) -> list[str]:
        """Give back the per-job disks (:mod:`aicluster.runtime.sandbox.jobdisk`) of the jobs that
        are not ``active`` any more; returns those jobs."""
        ...

    def warm_up(self, view: ClusterView) -> int:
        """Prepare the nodes of ``view`` for fast starts; returns at once."""
        ...

    def logs(
        self,
        job_id: str,
        rank: int = 0,
        *,
        attempt: int | None = None,
        stream: Stream = "stdout",
        offset: int = 0,
        max_bytes: int = ...,
    ) -> LogChunk: ...

    def telemetry(self, job_id: str, attempt: int | None = None) -> dict[int, list[StepRecord]]: ...
