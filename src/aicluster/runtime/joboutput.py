"""The one place where job output enters the control plane.

Everything a job writes (telemetry, exports, and whatever else lies under a run directory) is
input from an untrusted tenant: a rank runs as the tenant's uid and may plant links, FIFOs,
devices, giant or half-written files, and records of any shape. Every read of a run directory
goes through this module, which

- opens a path component by component below a trusted directory (the root-made run or data
  directory), each with ``O_NOFOLLOW``: a link anywhere below the trusted directory is refused;
- opens with ``O_NONBLOCK`` and refuses anything but a regular file (after ``fstat`` of the open
  descriptor, so a swap between check and open is caught), so a FIFO, device or socket never
  blocks the reader;
- caps what it reads (bytes per call, bytes per line, files and bytes per tree);
- validates each record against a typed schema (:class:`TelemetryLine`, :class:`ExitRecord`) and
  drops a bad one, counted by reason in a :class:`Rejects` that the caller turns into a job
  event and a metric.

Names found on disk are data: :func:`~aicluster.core.numbers.ascii_int` is the only way one
becomes a number.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from aicluster.core.numbers import ascii_int
from aicluster.train.telemetry import StepRecord

__all__ = [
    "ExitRecord",
    "LineReader",
    "Refused",
    "Rejects",
    "TelemetryLine",
    "ascii_int",
    "copy_tree",
    "open_regular",
    "parse_exit_record",
    "parse_telemetry_line",
    "read_bytes",
    "read_json",
]

#: Bytes one call reads at most (a log chunk, a JSON file).
MAX_READ_BYTES = 1 << 20
#: A telemetry line longer than this is dropped (real ones are a few hundred bytes).
MAX_LINE_BYTES = 64 << 10
#: Telemetry bytes one poll of one rank takes in; a reader that falls behind catches up later.
MAX_POLL_BYTES = 4 << 20
#: An export (model weights, code, metadata) copied out of a job's directory, at most.
MAX_TREE_BYTES = 20 << 30
MAX_TREE_FILES = 10_000
MAX_TREE_DEPTH = 32

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(OSError):
    """A path the reader will not read: a link, not a regular file, or over a cap."""


# -- opening --------------------------------------------------------------------------------------


def _parts(relative: str | os.PathLike[str]) -> list[str]:
    parts = [part for part in PurePosixPath(os.fspath(relative)).parts if part not in ("", ".")]
    if not parts or any(part in ("..", "/") for part in parts):
        raise Refused(errno.EINVAL, f"not a path below its directory: {os.fspath(relative)!r}")
    return parts


def _open_below(trusted: Path, parts: list[str], leaf_flags: int) -> int:
    """Open ``trusted/parts...`` with no link followed below ``trusted``; returns a descriptor."""
    fd = os.open(trusted, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, _OPEN_DIR, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        leaf = parts[-1]
        mode = os.stat(leaf, dir_fd=fd, follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            raise Refused(errno.ELOOP, f"{leaf}: a link, not read")
        if not (stat.S_ISREG(mode) or (leaf_flags & os.O_DIRECTORY and stat.S_ISDIR(mode))):
            raise Refused(errno.EINVAL, f"{leaf}: not a regular file")
        return os.open(leaf, leaf_flags, dir_fd=fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR) and not isinstance(error, Refused):
            raise Refused(error.errno, f"{'/'.join(parts)}: a link in the path, not read") from None
        raise
    finally:
        os.close(fd)


def open_regular(trusted: Path, relative: str | os.PathLike[str]) -> int:
    """A read-only descriptor of the regular file ``trusted/relative``.

    ``trusted`` is a directory root made (it may itself be reached through root's links);
    nothing below it may be a link. Raises :class:`Refused` for a link, a FIFO, a device, a
    socket or a directory, ``FileNotFoundError`` when it is missing. Never blocks."""
    fd = _open_below(trusted, _parts(relative), _OPEN_FILE)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between the check and the open
        os.close(fd)
        raise Refused(errno.EINVAL, f"{os.fspath(relative)}: not a regular file")
    return fd


def read_bytes(
    trusted: Path, relative: str | os.PathLike[str], offset: int = 0, limit: int = MAX_READ_BYTES
) -> bytes:
    """Up to ``limit`` bytes of a regular file from ``offset`` (``b""`` when it is missing)."""
    try:
        fd = open_regular(trusted, relative)
    except FileNotFoundError:
        return b""
    with os.fdopen(fd, "rb") as handle:
        handle.seek(max(0, offset))
        return handle.read(max(0, limit))


def file_size(trusted: Path, relative: str | os.PathLike[str]) -> int:
    """The size of a regular file (0 when missing); raises :class:`Refused` like the readers."""
    try:
        fd = open_regular(trusted, relative)
    except FileNotFoundError:
        return 0
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


# -- records --------------------------------------------------------------------------------------

Finite = Annotated[float, Field(allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=1 << 62)]
ShortText = Annotated[str, StringConstraints(max_length=256)]


class _Record(BaseModel):
    # Strict: no "1" for 1, no true for 1; unknown fields are ignored (newer writers).
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class TelemetryLine(_Record):
    """One line of ``rank-<r>.telemetry.jsonl`` (:class:`~aicluster.train.StepRecord`)."""

    kind: Annotated[str, StringConstraints(min_length=1, max_length=32)]
    time: Finite
    rank: Count | None = None
    step: Count | None = None
    loss: Finite | None = None
    step_time: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    samples: Count | None = None
    throughput: Finite | None = None
    node: ShortText | None = None
    attempt: Count | None = None
    metrics: Annotated[dict[ShortText, Finite], Field(max_length=64)] = Field(default_factory=dict)

    def to_step_record(self, rank: int) -> StepRecord:
        """The record as rank ``rank`` wrote it: the file's rank, not the one the line claims."""
        data = self.model_dump(exclude={"rank", "metrics"})
        return StepRecord(rank=rank, metrics=dict(self.metrics), **data)


class ExitRecord(_Record):
    """``rank-<r>.exit.json``: how a rank ended (written by the launcher, never by the job)."""

    rank: Count | None = None
    exit_code: Annotated[int, Field(ge=-(1 << 16), le=1 << 16)] | None = None
    stopped: bool = False
    lost: bool = False
    started_at: Finite | None = None  # when its process started (None: it never did)
    finished_at: Finite | None = None
    reason: Annotated[str, StringConstraints(max_length=4000)] | None = None
    pid: Count | None = None
    warm: bool = False  # forked from the node's warm process


@dataclass
class Rejects:
    """Records and files dropped, by reason ("telemetry: not an object", ...)."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, reason: str, count: int = 1) -> None:
        self.counts[reason[:200]] += count

    def take(self) -> Counter[str]:
        """The counts so far, and start again from zero."""
        counts, self.counts = self.counts, Counter()
        return counts

    def __bool__(self) -> bool:
        return bool(self.counts)


Model = TypeVar("Model", bound=BaseModel)


def _load_object(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """A JSON object from ``raw``, or None and why not."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "invalid UTF-8"
    except (ValueError, RecursionError):  # RecursionError: a line of ten thousand "["
        return None, "invalid JSON"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    return data, ""


def parse_record(raw: bytes, model: type[Model]) -> tuple[Model | None, str]:
    """``raw`` validated as ``model``, or None and a short reason."""
    data, why = _load_object(raw)
    if data is None:
        return None, why
    try:
        return model.model_validate(data), ""
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "record"
        return None, f"{where}: {first['msg']}"[:200]


def parse_telemetry_line(raw: bytes, rank: int) -> tuple[StepRecord | None, str]:
    line, why = parse_record(raw, TelemetryLine)
    return (line.to_step_record(rank), "") if line is not None else (None, why)


def parse_exit_record(raw: bytes) -> tuple[ExitRecord | None, str]:
    return parse_record(raw, ExitRecord)


def read_json(
    trusted: Path,
    relative: str | os.PathLike[str],
    model: type[Model],
    rejects: Rejects | None = None,
    limit: int = 64 << 10,
) -> Model | None:
    """The file validated as ``model``; None when missing, refused or invalid (counted)."""
    name = PurePosixPath(os.fspath(relative)).name
    try:
        raw = read_bytes(trusted, relative, 0, limit + 1)
    except OSError as error:
        if rejects is not None:
            rejects.add(f"{name}: {_why(error)}")
        return None
    if not raw:
        return None
    if len(raw) > limit:
        if rejects is not None:
            rejects.add(f"{name}: over {limit} bytes")
        return None
    record, why = parse_record(raw, model)
    if record is None and rejects is not None:
        rejects.add(f"{name}: {why}")
    return record


def _why(error: OSError) -> str:
    return error.strerror or type(error).__name__


# -- lines ----------------------------------------------------------------------------------------


@dataclass
class LineReader:
    """Reads whole lines of one append-only file from where it left off.

    A partial last line waits for its newline; a line over ``max_line`` bytes is dropped (counted)
    and skipped to its end, however long; a file that is refused or shrank is counted and
    read again from its start. Never raises for what the file holds or is."""

    trusted: Path
    relative: str
    max_line: int = MAX_LINE_BYTES
    max_poll: int = MAX_POLL_BYTES
    offset: int = 0
    skipping: bool = False  # inside a line over max_line: drop up to its newline

    def read(self, rejects: Rejects) -> list[bytes]:
        """The whole lines written since the last call (at most ``max_poll`` bytes of them)."""
        try:
            data = self._read_chunk(rejects)
        except OSError as error:
            rejects.add(f"{PurePosixPath(self.relative).name}: {_why(error)}")
            return []
        lines: list[bytes] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if self.skipping:
                self.skipping = False
            elif not data[start:end].strip():
                pass
            elif end - start > self.max_line:
                rejects.add(f"telemetry: a line over {self.max_line} bytes")
            else:
                lines.append(data[start:end])
            start = end + 1
        rest = len(data) - start
        if rest > self.max_line and not self.skipping:  # a giant line, not ended yet: drop it
            rejects.add(f"telemetry: a line over {self.max_line} bytes")
            self.skipping = True
        self.offset += start + (rest if self.skipping else 0)
        return lines

    def _read_chunk(self, rejects: Rejects) -> bytes:
        try:
            fd = open_regular(self.trusted, self.relative)
        except FileNotFoundError:
            return b""
        with os.fdopen(fd, "rb") as handle:
            if os.fstat(fd).st_size < self.offset:  # replaced or truncated: read it anew
                rejects.add(f"{PurePosixPath(self.relative).name}: the file shrank")
                self.offset, self.skipping = 0, False
            handle.seek(self.offset)
            return handle.read(self.max_poll)


def read_telemetry(reader: LineReader, rank: int, rejects: Rejects) -> list[StepRecord]:
    """The valid telemetry records since the last read of ``reader``; the bad ones counted."""
    records = []
    for raw in reader.read(rejects):
        record, why = parse_telemetry_line(raw, rank)
        if record is None:
            rejects.add(f"telemetry: {why}")
        else:
            records.append(record)
    return records


# -- trees ----------------------------------------------------------------------------------------


def copy_tree(
    trusted: Path,
    relative: str | os.PathLike[str],
    target: Path,
    *,
    max_bytes: int = MAX_TREE_BYTES,
    max_files: int = MAX_TREE_FILES,
) -> None:
    """Copy the directory ``trusted/relative`` to ``target`` (which must not exist): regular
    files and directories only, no link followed, within the caps. Raises :class:`Refused` (a
    link, a special file, over a cap) or ``FileNotFoundError``; ``target`` is then removed."""
    fd = _open_below(trusted, _parts(relative), _OPEN_DIR)
    budget = [max_bytes, max_files]
    try:
        target.mkdir(mode=0o700)
        _copy_dir(fd, target, budget, 0)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    finally:
        os.close(fd)


def _copy_dir(fd: int, target: Path, budget: list[int], depth: int) -> None:
    if depth > MAX_TREE_DEPTH:
        raise Refused(errno.EINVAL, f"deeper than {MAX_TREE_DEPTH} directories")
    for name in _names(fd):
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        budget[1] -= 1
        if budget[1] < 0:
            raise Refused(errno.EFBIG, "too many files")
        if stat.S_ISDIR(mode):
            child = os.open(name, _OPEN_DIR, dir_fd=fd)
            try:
                (target / name).mkdir(mode=0o700)
                _copy_dir(child, target / name, budget, depth + 1)
            finally:
                os.close(child)
        elif stat.S_ISREG(mode):
            _copy_file(fd, name, target / name, budget)
        else:
            raise Refused(errno.EINVAL, f"{name}: not a regular file or directory")


def _names(fd: int) -> list[str]:
    with os.scandir(fd) as entries:
        return sorted(entry.name for entry in entries)


def _copy_file(fd: int, name: str, target: Path, budget: list[int]) -> None:
    source = os.open(name, _OPEN_FILE, dir_fd=fd)
    with contextlib.ExitStack() as stack:
        reader = stack.enter_context(os.fdopen(source, "rb"))
        if not stat.S_ISREG(os.fstat(source).st_mode):
            raise Refused(errno.EINVAL, f"{name}: not a regular file")
        writer = stack.enter_context(open(target, "xb"))
        while chunk := reader.read(1 << 20):
            budget[0] -= len(chunk)
            if budget[0] < 0:
                raise Refused(errno.EFBIG, "over its size cap")
            writer.write(chunk)
