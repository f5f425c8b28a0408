"""Files and directories that are the control plane's alone: 0700 directories, 0600 files.

A state directory holds the database, the tokens, the logs and every tenant's jobs; a state
directory left somewhere readable (a demo's ``.demo/`` in a checkout) gave them away. So each
one is made private where it is created, and an existing one of this user is narrowed. No
process-wide umask: the same processes create what a tenant's uid must read (job data
directories, the data cache), and a umask is inherited by every child (Ray's workers).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO

__all__ = ["open_private", "private_dir", "private_file", "write_private"]


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) a directory only its owner may enter (0700); an
    existing one of this user is narrowed to 0700."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.stat()
    if info.st_uid == os.geteuid() and info.st_mode & 0o077:
        path.chmod(0o700)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty and 0600 unless it exists; narrow an existing one of this user to
    0600. (SQLite gives its ``-wal`` and ``-shm`` files the database file's mode.)"""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        info = path.lstat()
        if info.st_uid == os.geteuid() and info.st_mode & 0o077 and path.is_file():
            path.chmod(0o600)
    return path


def open_private(path: Path) -> BinaryIO:
    """``path`` opened to append (a log), created 0600 or narrowed to it."""
    return open(private_file(path), "ab")


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` at once, as a 0600 file (``mkstemp`` makes it so)."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
