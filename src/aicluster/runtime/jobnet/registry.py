"""What this node's launcher made: one JSON file per job namespace in a root-only directory.

An entry is written *before* its namespace and veth pair are made and removed only after they
are gone, so whatever a launcher that crashed in between left behind has an entry: ``sweep``
(:mod:`.node`) finds it there. An entry names its owner (pid and the process's start time, so a
reused pid is not taken for the owner). A lock file serializes the launchers of one registry:
the lowest free address index is chosen under it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from aicluster.runtime.jobnet.naming import JobNetKey, JobNetNames

__all__ = ["Entry", "Owner", "Registry"]


@dataclass(frozen=True)
class Owner:
    """A process, told apart from a later one with the same pid by its start time."""

    pid: int
    start: int  # clock ticks after boot (/proc/<pid>/stat, field 22)

    @classmethod
    def me(cls) -> Owner:
        return cls(os.getpid(), _start_time(os.getpid()) or 0)

    def alive(self) -> bool:
        return _start_time(self.pid) == self.start


def _start_time(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])  # field 22 of stat; [0] here is field 3


@dataclass(frozen=True)
class Entry:
    key: JobNetKey
    names: JobNetNames
    index: int  # the address offset in the node's subnet
    owner: Owner

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Entry:
        raw = json.loads(text)
        return cls(
            JobNetKey(**raw["key"]),
            JobNetNames(**raw["names"]),
            raw["index"],
            Owner(**raw["owner"]),
        )


class Registry:
    """The entries under ``root`` (made 0700; refused if another user owns it or others may
    write it: whoever writes entries chooses what ``sweep`` deletes)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = root.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise PermissionError(f"{root}: not a directory of uid {os.geteuid()}")
        if info.st_mode & 0o077:
            raise PermissionError(f"{root}: mode {info.st_mode & 0o777:o}, must be 0700")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def _path(self, names: JobNetNames) -> Path:
        return self.root / f"{names.netns}.json"

    def entries(self) -> list[Entry]:
        found = []
        for path in sorted(self.root.glob("*.json")):
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                found.append(Entry.from_json(path.read_text()))
        return found

    def find(self, key: JobNetKey) -> Entry | None:
        return next((e for e in self.entries() if e.key == key), None)

    def write(self, entry: Entry) -> None:
        path = self._path(entry.names)
        partial = path.with_suffix(".tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        # No fsync: a launcher's crash loses nothing written, and a machine's crash takes the
        # namespaces with it (they live in memory, as /run does).
        with os.fdopen(fd, "w") as out:
            out.write(entry.to_json())
        partial.replace(path)  # a reader sees the whole entry or none

    def remove(self, entry: Entry) -> None:
        self._path(entry.names).unlink(missing_ok=True)
