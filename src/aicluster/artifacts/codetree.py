"""A job's code as a deterministic ``tar.gz``: packed by ``aicluster submit``, unpacked on nodes.

The archive's SHA-256 names the code (``JobSpec.code``), so packing the same tree again must give
the same bytes: entries are sorted by path, every timestamp is 0, owners are 0 with no names,
modes are 0644 (0755 for directories and executables) and the gzip header carries no name or
time. What is shipped: every regular file and directory under the folder except ``.git`` and
what its ``.gitignore`` files (at any depth) and an ``.aiclusterignore`` at its root exclude;
the root ``.aiclusterignore`` is read last, so its patterns, ``!`` re-includes too, win. A
symlink whose target lies inside the folder is kept as a relative symlink (it is not followed);
one pointing outside, and sockets, FIFOs and devices, are refused.

Unpacking verifies the archive's hash before reading it as a tar, then extracts with tarfile's
``data`` filter and stricter checks of its own (no absolute or ``..`` names, no hard links) into
a temporary folder beside the destination, renamed into place only when all went well.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import posixpath
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from pathspec import GitIgnoreSpec

__all__ = [
    "IGNORE_FILE",
    "MAX_ARCHIVE_BYTES",
    "MAX_UNPACKED_BYTES",
    "CodeTreeError",
    "PackedTree",
    "check_archive",
    "pack_tree",
    "read_archive",
    "unpack_tree",
]

#: The default cap on a packed archive (the server's default upload cap).
MAX_ARCHIVE_BYTES = 100 * 10**6
#: The cap on the bytes of the files an archive holds (packing and unpacking): gzip turns a
#: small archive into a huge tree, and a node unpacks each job's code onto its disk.
MAX_UNPACKED_BYTES = 4 * 10**9
#: Patterns (gitignore syntax) of what not to ship, read at the shipped folder's root only.
IGNORE_FILE = ".aiclusterignore"
_CHUNK = 1 << 20


class CodeTreeError(ValueError):
    """A tree that cannot be shipped, or an archive that is not safe or not the one named."""


@dataclass(frozen=True)
class PackedTree:
    """A packed tree: the archive (a temporary file; :meth:`remove` it, or use ``with``), its
    SHA-256 and size, and the paths it holds (POSIX, relative, sorted; directories end in /)."""

    path: Path
    sha256: str
    size: int
    files: tuple[str, ...]

    def open(self) -> BinaryIO:
        return self.path.open("rb")

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> PackedTree:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.remove()


@dataclass(frozen=True)
class _Entry:
    name: str  # POSIX path relative to the folder
    path: Path
    info: os.stat_result
    link: str | None = None  # a symlink's target, relative to the link's own folder


# -- packing ---------------------------------------------------------------------------------


def pack_tree(
    folder: Path,
    *,
    max_bytes: int = MAX_ARCHIVE_BYTES,
    max_unpacked_bytes: int = MAX_UNPACKED_BYTES,
    leave_out: Collection[str] = (),
) -> PackedTree:
    """Pack ``folder`` (see the module's docstring for what is shipped). ``leave_out`` names
    files (paths relative to the folder, ``/``-separated) not to ship: a job spec that holds
    secrets.

    Raises :class:`CodeTreeError` for a symlink out of the folder, a socket, FIFO or device, a
    name that is not UTF-8, an archive over ``max_bytes`` or files over ``max_unpacked_bytes``
    (both checked as files are added), and ``OSError`` for what cannot be read.
    """
    root = folder.resolve()
    if not root.is_dir():
        raise CodeTreeError(f"{folder} is not a folder")
    entries = sorted(
        (entry for entry in _walk(root) if entry.name not in leave_out),
        key=lambda entry: entry.name,
    )
    _check_unpacked_size(entries, max_unpacked_bytes)
    descriptor, name = tempfile.mkstemp(prefix="aicluster-code-", suffix=".tar.gz")
    archive = Path(name)
    try:
        with os.fdopen(descriptor, "wb") as raw:
            _write(raw, entries, max_bytes)
        size = archive.stat().st_size
        _check_archive_size(size, max_bytes)
        with archive.open("rb") as packed:
            sha256 = hashlib.file_digest(packed, "sha256").hexdigest()
    except BaseException:
        archive.unlink(missing_ok=True)
        raise
    names = (entry.name + ("/" if stat.S_ISDIR(entry.info.st_mode) else "") for entry in entries)
    return PackedTree(archive, sha256, size, tuple(names))


def _write(raw: BinaryIO, entries: list[_Entry], max_bytes: int) -> None:
    # filename="" and mtime=0: the gzip header names no file and no time.
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for entry in entries:
            info = _tar_info(entry)
            if info.isreg():
                with entry.path.open("rb") as content:
                    tar.addfile(info, content)
            else:
                tar.addfile(info)
            _check_archive_size(raw.tell(), max_bytes)


def _tar_info(entry: _Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    mode = entry.info.st_mode
    if entry.link is not None:
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.link, 0o777
    elif stat.S_ISDIR(mode):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    else:
        info.size = entry.info.st_size
        info.mode = 0o755 if mode & 0o111 else 0o644
    return info


def _check_archive_size(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise CodeTreeError(f"the packed code is larger than the cap of {max_bytes} bytes")


def _check_unpacked_size(entries: list[_Entry], max_bytes: int) -> None:
    total = sum(entry.info.st_size for entry in entries if stat.S_ISREG(entry.info.st_mode))
    if total > max_bytes:
        raise CodeTreeError(f"the files to ship hold {total} bytes, over the cap of {max_bytes}")


def _walk(root: Path) -> Iterator[_Entry]:
    """Every entry to ship below ``root`` (a resolved folder), ignored ones left out."""
    ignores = _Ignores(root)
    for current, dirs, files in os.walk(root):
        here = Path(current)
        relative = here.relative_to(root).as_posix()
        prefix = "" if relative == "." else relative + "/"
        ignores.read(here, prefix)
        kept_dirs = []
        for name in sorted(dirs) + sorted(files):
            if name == ".git":
                continue
            entry = _entry(root, here / name, prefix + name)
            is_dir = entry.link is None and stat.S_ISDIR(entry.info.st_mode)
            if ignores.ignored(entry.name, is_dir):
                continue
            _refuse_special(entry)
            if is_dir:
                kept_dirs.append(name)
            yield entry
        dirs[:] = [name for name in dirs if name in kept_dirs]  # don't descend into ignored ones


def _entry(root: Path, path: Path, name: str) -> _Entry:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise CodeTreeError(f"{path}: the name is not UTF-8 text") from None
    info = path.lstat()
    if not stat.S_ISLNK(info.st_mode):
        return _Entry(name, path, info)
    try:
        target = path.resolve()
    except (OSError, RuntimeError) as error:  # RuntimeError: a symlink loop (Python 3.11)
        raise CodeTreeError(f"{path}: cannot follow the symlink: {error}") from None
    if not target.is_relative_to(root):
        raise CodeTreeError(
            f"{path} is a symlink to {os.readlink(path)}, outside {root}: "
            "copy what it points to into the folder, or ignore it (.aiclusterignore)"
        )
    return _Entry(name, path, info, link=os.path.relpath(target, path.parent))


def _refuse_special(entry: _Entry) -> None:
    mode = entry.info.st_mode
    if entry.link is None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise CodeTreeError(
            f"{entry.path} is not a regular file, folder or symlink (a socket, FIFO or device): "
            "ignore it (.aiclusterignore)"
        )


class _Ignores:
    """The ignore files met so far, each with the folder its patterns are relative to."""

    def __init__(self, root: Path) -> None:
        self.rules: list[tuple[str, GitIgnoreSpec]] = []
        top = root / IGNORE_FILE
        self.last = _read_patterns(top) if top.is_file() else None

    def read(self, folder: Path, prefix: str) -> None:
        gitignore = folder / ".gitignore"
        if gitignore.is_file():
            self.rules.append((prefix, _read_patterns(gitignore)))

    def ignored(self, name: str, is_dir: bool) -> bool:
        """Git's rule: the last pattern that matches decides, deeper files after shallower."""
        path = name + "/" if is_dir else name
        decision: bool | None = None
        rules = [*self.rules, *([("", self.last)] if self.last is not None else [])]
        for prefix, spec in rules:
            if path.startswith(prefix):
                include = spec.check_file(path[len(prefix) :]).include
                decision = include if include is not None else decision
        return bool(decision)


def _read_patterns(path: Path) -> GitIgnoreSpec:
    return GitIgnoreSpec.from_lines(path.read_text(errors="replace").splitlines())


# -- checking and unpacking ------------------------------------------------------------------


def check_archive(path: Path, *, max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> None:
    """Read the archive at ``path`` through without extracting it. Raises
    :class:`CodeTreeError` when it is not a ``tar.gz`` that :func:`unpack_tree` would accept."""
    with tempfile.TemporaryDirectory(prefix="aicluster-check-") as empty, read_archive(path) as tar:
        check = _member_filter(max_unpacked_bytes)
        for member in tar:
            check(member, empty)


def unpack_tree(
    archive: BinaryIO,
    dest: Path,
    expected_sha256: str,
    *,
    max_unpacked_bytes: int = MAX_UNPACKED_BYTES,
) -> None:
    """Unpack the code archive read from ``archive`` into the folder ``dest``, which must not
    exist yet (its parent is created if needed).

    The bytes are copied beside ``dest`` and hashed first: a SHA-256 other than
    ``expected_sha256`` raises :class:`CodeTreeError` before anything is extracted. So does an
    archive that is not a ``tar.gz``, a member with an absolute or ``..`` name, a hard link, a
    symlink leading out of ``dest``, a device or FIFO, or files over ``max_unpacked_bytes``.
    ``FileExistsError`` when ``dest`` exists (or appears meanwhile: another worker unpacked the
    same code). On any error nothing is left behind.
    """
    if dest.exists() or dest.is_symlink():
        raise FileExistsError(f"{dest} exists already")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.unpack-") as work:
        copy = Path(work) / "code.tar.gz"
        _copy_verified(archive, copy, expected_sha256)
        tree = Path(work) / "tree"
        tree.mkdir()
        with read_archive(copy) as tar:
            tar.extractall(tree, filter=_member_filter(max_unpacked_bytes))
        try:
            tree.rename(dest)
        except OSError as error:  # dest appeared meanwhile (a non-empty folder is not replaced)
            raise FileExistsError(f"{dest} exists already: {error}") from None


def _copy_verified(source: BinaryIO, target: Path, expected_sha256: str) -> None:
    digest = hashlib.sha256()
    with target.open("wb") as out:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != expected_sha256:
        raise CodeTreeError(
            f"the code archive's SHA-256 is {digest.hexdigest()}, not {expected_sha256}: "
            "it was changed or damaged"
        )


@contextmanager
def read_archive(source: Path | BinaryIO) -> Iterator[tarfile.TarFile]:
    """The archive (a file's path, or an open file) as a tar, its read errors (a broken or
    unsafe archive) as CodeTreeError."""
    name, fileobj = (source, None) if isinstance(source, Path) else (None, source)
    try:
        with tarfile.open(name, mode="r:gz", fileobj=fileobj) as tar:
            yield tar
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise CodeTreeError(f"not a valid code archive: {error}") from None


def _member_filter(max_bytes: int) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo]:
    """tarfile's ``data`` filter plus what a packed tree never holds, and a size budget."""
    total = 0

    def check(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        nonlocal total
        name = member.name
        if name.startswith("/") or ".." in name.split("/"):
            raise CodeTreeError(f"not a valid code archive: {name!r} leads out of the tree")
        if not (member.isreg() or member.isdir() or member.issym()):
            raise CodeTreeError(f"not a valid code archive: {name!r} is not a file or folder")
        if member.issym() and posixpath.isabs(member.linkname):
            raise CodeTreeError(f"not a valid code archive: {name!r} links to an absolute path")
        filtered = tarfile.data_filter(member, dest)  # links out of dest: a FilterError
        total += filtered.size
        if total > max_bytes:
            raise CodeTreeError(f"the code archive holds over {max_bytes} bytes of files")
        return filtered

    return check
