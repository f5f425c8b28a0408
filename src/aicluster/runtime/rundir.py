"""The run directory of one attempt of a job: per-rank logs, exit records and telemetry.

Two parts. What the launcher writes, root's and outside the job's sandbox:
``<state_dir>/runs/<job_id>/<attempt>/`` holds ``gang.json`` (the spec), ``rank-<r>.log``
(stdout), ``rank-<r>.err`` (stderr), ``rank-<r>.exit.json`` and ``stop.json``. What the job
writes, owned by its tenant's uid (see :mod:`aicluster.runtime.sandbox.bwrap`), is the job's *data
directory* ``<state_dir>/tenants/<tenant>/jobs/<job_id>/``, reached from the run directory by the
link ``<state_dir>/runs/<job_id>/data``: ``<attempt>/`` (the rank's ``AICLUSTER_RUN_DIR``, with
``rank-<r>.telemetry.jsonl``), ``checkpoints/`` and ``export/`` shared by the job's attempts, and
``work/<attempt>-<node>/``, the fresh copy of the job's code each node runs in. A tenant's jobs lie
under one directory so that the tenant's warm process (one sandbox per tenant and node) sees them
all and nothing else. Files rather than Ray objects: they outlive actors, nodes and the control
plane, and a reader resumes at an offset. On several machines ``state_dir`` must be a shared
filesystem (as checkpoints need anyway).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aicluster.runtime import joboutput
from aicluster.runtime.joboutput import ExitRecord, LineReader, Rejects, ascii_int
from aicluster.train.telemetry import StepRecord

__all__ = ["LogChunk", "RunDir", "Stream", "make_owned_dir", "tenant_dir", "write_json_atomic"]

Stream = Literal["stdout", "stderr"]
#: Telemetry read of one rank for a whole view of a run (the API's, goodput's), at most.
MAX_TELEMETRY_BYTES = 256 << 20


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


def tenant_dir(state_dir: str | os.PathLike[str], tenant: str) -> Path:
    """The directory holding every job's data directory of ``tenant``: ``tenants/<tenant>``,
    the name encoded injectively (:func:`aicluster.core.names.tenant_folder`)."""
    from aicluster.core.names import tenant_folder

    if not tenant or "/" in tenant or tenant in (".", ".."):
        raise ValueError(f"not a tenant name: {tenant!r}")
    return tenant_folder(Path(state_dir) / "tenants", tenant)


def _make_root_dir(path: Path, mode: int, group: int | None) -> None:
    """Make ``path`` root's, with ``mode`` and, when given, the tenant's ``group``."""
    with contextlib.suppress(FileExistsError):
        path.mkdir()
    if path.is_symlink() or not path.is_dir():
        raise OSError(f"{path} is not a directory")
    if group is not None:
        os.chown(path, 0, group, follow_symlinks=False)
    os.chmod(path, mode)


def make_owned_dir(path: Path, owner: tuple[int, int] | None) -> None:
    """Make ``path`` (mode 0700) for ``owner`` (uid, gid); a link there is refused."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    if path.is_symlink() or not path.is_dir():
        raise OSError(f"{path} is not a directory")
    if owner is not None:
        os.chown(path, *owner, follow_symlinks=False)
        os.chmod(path, 0o700)  # not a link (checked above), in a directory only root changes


class RunDir:
    """Paths and readers for one attempt's run directory (creates nothing until written to)."""

    def __init__(self, state_dir: str | os.PathLike[str], job_id: str, attempt: int) -> None:
        self.state_dir = Path(state_dir)
        self.job_dir = self.state_dir / "runs" / job_id
        self.path = self.job_dir / str(attempt)
        self.job_id, self.attempt = job_id, attempt

    @property
    def data_link(self) -> Path:
        """The link to the job's data directory (made by :meth:`make_data_dir`)."""
        return self.job_dir / "data"

    def data_dir_for(self, tenant: str) -> Path:
        """Where the job's data directory lies (its real path, as a sandbox mounts it)."""
        return tenant_dir(self.state_dir, tenant) / "jobs" / self.job_id

    def make_data_dir(self, tenant: str, owner: tuple[int, int] | None) -> Path:
        """Make the job's data directory (idempotent) with this attempt's run directory and the
        checkpoint and export directories, owned by ``owner`` (uid, gid; mode 0700) when given;
        returns its real path.

        The directories above them stay root's, entered only by root and the tenant's group: the
        tenant's directory and ``jobs/`` (0710), and the data directory itself, where the job may
        add files (an export's temporary directory) but, sticky (1770), never rename or remove
        one of root's (``work/``, 0711). So the launcher makes the next directories without
        following a link the tenant planted, and other tenants' uids cannot even enter."""
        data = self.data_dir_for(tenant)
        data.parent.parent.parent.mkdir(parents=True, exist_ok=True)
        group = owner[1] if owner is not None else None
        _make_root_dir(data.parent.parent, 0o710 if group else 0o711, group)
        _make_root_dir(data.parent, 0o710 if group else 0o711, group)
        _make_root_dir(data, 0o1770 if group else 0o711, group)
        _make_root_dir(data / "work", 0o711, None)
        for name in (str(self.attempt), "checkpoints", "export"):
            make_owned_dir(data / name, owner)
        self.job_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.symlink(data, self.data_link)
        return data

    @property
    def job_run_dir(self) -> Path:
        """The attempt's directory the job writes (``AICLUSTER_RUN_DIR``): its telemetry."""
        return self.data_link / str(self.attempt)

    def work_dir(self, node: str) -> Path:
        """The fresh copy of the job's code that ``node`` runs this attempt in."""
        return self.data_link / "work" / f"{self.attempt}-{node}"

    @staticmethod
    def attempts(state_dir: str | os.PathLike[str], job_id: str) -> list[int]:
        """The attempts of ``job_id`` that have a run directory, in order."""
        job_dir = Path(state_dir) / "runs" / job_id
        if not job_dir.is_dir():
            return []
        numbers = (ascii_int(p.name) for p in job_dir.iterdir())
        return sorted(n for n in numbers if n is not None)

    @property
    def spec_file(self) -> Path:
        return self.path / "gang.json"

    @property
    def stop_file(self) -> Path:
        return self.path / "stop.json"

    @property
    def checkpoint_dir(self) -> Path:
        return self.data_link / "checkpoints"

    @property
    def export_dir(self) -> Path:
        return self.data_link / "export"

    def log_file(self, rank: int, stream: Stream = "stdout") -> Path:
        return self.path / f"rank-{rank}.{'log' if stream == 'stdout' else 'err'}"

    def exit_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.exit.json"

    def telemetry_file(self, rank: int) -> Path:
        return self.job_run_dir / f"rank-{rank}.telemetry.jsonl"

    # Every read below goes through :mod:`aicluster.runtime.joboutput`: no link followed, no
    # FIFO or device opened, sizes capped, records validated.

    def spec(self) -> dict[str, Any] | None:
        try:
            data = json.loads(joboutput.read_bytes(self.path, self.spec_file.name))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def stop_requested(self) -> bool:
        return self.stop_file.exists()

    def exit_record(self, rank: int) -> dict[str, Any] | None:
        record = joboutput.read_json(self.path, self.exit_file(rank).name, ExitRecord)
        return record.model_dump() if record is not None else None

    def read_log(
        self, rank: int, stream: Stream = "stdout", offset: int = 0, max_bytes: int = 1 << 20
    ) -> LogChunk:
        """Up to ``max_bytes`` of a rank's log from byte ``offset`` (empty if not written yet).
        Raises :class:`~aicluster.runtime.joboutput.Refused` for a log that is not a regular
        file (a link planted where the log goes)."""
        name = self.log_file(rank, stream).name
        data = joboutput.read_bytes(self.path, name, offset, min(max_bytes, 1 << 24))
        return LogChunk(data.decode("utf-8", errors="replace"), offset + len(data))

    def tail(self, rank: int, stream: Stream = "stderr", max_bytes: int = 2000) -> str:
        """The last ``max_bytes`` of a rank's log ("" when it cannot be read)."""
        try:
            size = joboutput.file_size(self.path, self.log_file(rank, stream).name)
            return self.read_log(rank, stream, max(0, size - max_bytes), max_bytes).text
        except OSError:
            return ""

    def telemetry_reader(self, rank: int) -> LineReader:
        """A reader of rank ``rank``'s telemetry file, from its start."""
        return LineReader(self.data_link, f"{self.attempt}/{self.telemetry_file(rank).name}")

    def telemetry(self, rank: int, rejects: Rejects | None = None) -> list[StepRecord]:
        """Every valid telemetry record of rank ``rank`` (up to ``MAX_TELEMETRY_BYTES``)."""
        reader, rejects = self.telemetry_reader(rank), rejects or Rejects()
        records: list[StepRecord] = []
        while reader.offset < MAX_TELEMETRY_BYTES:
            before = reader.offset
            records.extend(joboutput.read_telemetry(reader, rank, rejects))
            if reader.offset == before:
                break
        return records
