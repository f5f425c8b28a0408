"""The run directory of one attempt of a job: per-rank logs, exit records and telemetry.

``<state_dir>/runs/<job_id>/<attempt>/`` holds ``gang.json`` (the spec), ``rank-<r>.log``
(stdout), ``rank-<r>.err`` (stderr), ``rank-<r>.exit.json`` and ``rank-<r>.telemetry.jsonl``;
``<state_dir>/runs/<job_id>/checkpoints/`` is shared by the job's attempts. Files rather than
Ray objects: they outlive actors, nodes and the control plane, and a reader resumes at an offset.
On several machines ``state_dir`` must be a shared filesystem (as checkpoints need anyway).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aicluster.train.telemetry import StepRecord, read_records

__all__ = ["LogChunk", "RunDir", "Stream", "write_json_atomic"]

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Text read from a log, and the byte offset to pass next time to read on from there."""

    text: str
    offset: int


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class RunDir:
    """Paths and readers for one attempt's run directory (creates nothing until written to)."""

    def __init__(self, state_dir: str | os.PathLike[str], job_id: str, attempt: int) -> None:
        self.job_dir = Path(state_dir) / "runs" / job_id
        self.path = self.job_dir / str(attempt)
        self.job_id, self.attempt = job_id, attempt

    @staticmethod
    def attempts(state_dir: str | os.PathLike[str], job_id: str) -> list[int]:
        """The attempts of ``job_id`` that have a run directory, in order."""
        job_dir = Path(state_dir) / "runs" / job_id
        if not job_dir.is_dir():
            return []
        return sorted(int(p.name) for p in job_dir.iterdir() if p.name.isdigit())

    @property
    def spec_file(self) -> Path:
        return self.path / "gang.json"

    @property
    def stop_file(self) -> Path:
        return self.path / "stop.json"

    @property
    def checkpoint_dir(self) -> Path:
        return self.job_dir / "checkpoints"

    def log_file(self, rank: int, stream: Stream = "stdout") -> Path:
        return self.path / f"rank-{rank}.{'log' if stream == 'stdout' else 'err'}"

    def exit_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.exit.json"

    def telemetry_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.telemetry.jsonl"

    def spec(self) -> dict[str, Any] | None:
        data = _read_json(self.spec_file)
        return data if isinstance(data, dict) else None

    def stop_requested(self) -> bool:
        return self.stop_file.exists()

    def exit_record(self, rank: int) -> dict[str, Any] | None:
        data = _read_json(self.exit_file(rank))
        return data if isinstance(data, dict) else None

    def read_log(
        self, rank: int, stream: Stream = "stdout", offset: int = 0, max_bytes: int = 1 << 20
    ) -> LogChunk:
        """Up to ``max_bytes`` of a rank's log from byte ``offset`` (empty if not written yet)."""
        try:
            with open(self.log_file(rank, stream), "rb") as handle:
                handle.seek(offset)
                data = handle.read(max_bytes)
        except FileNotFoundError:
            return LogChunk("", offset)
        return LogChunk(data.decode("utf-8", errors="replace"), offset + len(data))

    def tail(self, rank: int, stream: Stream = "stderr", max_bytes: int = 2000) -> str:
        """The last ``max_bytes`` of a rank's log."""
        path = self.log_file(rank, stream)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return ""
        return self.read_log(rank, stream, max(0, size - max_bytes), max_bytes).text

    def telemetry(self, rank: int, offset: int = 0) -> tuple[list[StepRecord], int]:
        return read_records(self.telemetry_file(rank), offset)
