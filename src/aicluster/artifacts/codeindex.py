"""What a shipped code archive holds at a path (a job's ``entrypoint``), read without extracting.

The API asks it at submit: an entrypoint that is not a file of the job's code would only fail
when the job runs ("can't open file"), once per restart. The archive is read as unpacking reads
it (:func:`~aicluster.artifacts.codetree.read_archive`), member headers only, nothing written.
The work is bounded: past ``max_members`` members or ``max_read_bytes`` of the uncompressed
stream it stops, and the answer is ``unknown`` (a large tree is not refused for its size: its
upload was accepted). The path is resolved as the node's filesystem resolves it once the tree is
unpacked: through the tree's symlinks (at most 40, as Linux), with a folder implied by the
members below it.
"""

from __future__ import annotations

import posixpath
import tarfile
from dataclasses import dataclass
from typing import BinaryIO, Literal

from aicluster.artifacts.codetree import read_archive

__all__ = ["MAX_MEMBERS", "MAX_READ_BYTES", "PathInTree", "find_path"]

#: The members read at most (tarfile keeps each one's header, some 500 bytes, while it reads).
MAX_MEMBERS = 50_000
#: The uncompressed bytes read at most (a member's content is decompressed to skip it).
MAX_READ_BYTES = 10**9
#: The tree's files a :class:`PathInTree` names (a message's listing).
SHOWN_FILES = 10
#: Symlinks followed at most while resolving one path (Linux's ELOOP limit).
_MAX_LINKS = 40

Kind = Literal["file", "folder", "missing", "unknown"]


@dataclass(frozen=True)
class PathInTree:
    """What the tree holds at the path: a regular file (or a symlink to one), a folder, nothing
    (``missing``: a name no member has, a broken or looping symlink), or ``unknown`` (the tree is
    past the reading bounds). ``files`` are the tree's first regular files in the archive's order
    (sorted, for what ``aicluster submit`` packs), ``file_count`` all those read."""

    kind: Kind
    files: tuple[str, ...]
    file_count: int

    def refusal(self, path: str, where: str) -> str | None:
        """Why ``path`` cannot be the job's ``entrypoint`` in the tree ``where`` (its words: "the
        shipped code (sha256 ...)"), with the tree's first files; None for a file (or unknown)."""
        if self.kind in ("file", "unknown"):
            return None
        what = (
            f"is a folder of {where}, not a file" if self.kind == "folder" else f"is not in {where}"
        )
        return f"entrypoint: {path} {what}; {self.listing()}"

    def listing(self) -> str:
        """The tree's first files: "it holds 12 files: a.py, ... (and 2 more)"."""
        if self.file_count == 0:
            return "it holds no file"
        count = "1 file" if self.file_count == 1 else f"{self.file_count} files"
        more = self.file_count - len(self.files)
        return f"it holds {count}: {', '.join(self.files)}" + (
            f" (and {more} more)" if more else ""
        )


def find_path(
    archive: BinaryIO,
    path: str,
    *,
    max_members: int = MAX_MEMBERS,
    max_read_bytes: int = MAX_READ_BYTES,
) -> PathInTree:
    """What the code archive read from ``archive`` holds at ``path`` (relative, ``/``-separated).
    Raises :class:`~aicluster.artifacts.CodeTreeError` for an archive that is not a tar.gz."""
    tree = _Tree()
    with read_archive(archive) as tar:
        complete = _read(tar, tree, max_members, max_read_bytes)
    files = tuple(tree.files)
    kind: Kind = tree.kind_at(path)
    if kind != "file" and not complete:  # the rest of the tree might hold it
        kind = "unknown"
    return PathInTree(kind, files, tree.file_count)


def _read(tar: tarfile.TarFile, tree: _Tree, max_members: int, max_read_bytes: int) -> bool:
    """Add the archive's members to ``tree``; False when a bound stopped the reading first."""
    read, next_at = 0, 0
    while next_at <= max_read_bytes:  # reaching the next header decompresses what lies before
        member = tar.next()
        if member is None:
            return True
        if read == max_members:
            return False
        tree.add(member)
        read, next_at = read + 1, member.offset_data + member.size
    return False


class _Tree:
    """The members' kinds by normalized name; folders implied by deeper names too."""

    def __init__(self) -> None:
        self.kinds: dict[str, str] = {"": "folder"}
        self.links: dict[str, str] = {}
        self.files: list[str] = []
        self.file_count = 0

    def add(self, member: tarfile.TarInfo) -> None:
        name = posixpath.normpath(member.name)
        if name in (".", "") or name.startswith(("/", "..")):  # refused at upload anyway
            return
        parent = posixpath.dirname(name)
        while parent and parent not in self.kinds:  # extracting makes a member's folders
            self.kinds[parent] = "folder"
            parent = posixpath.dirname(parent)
        if member.issym():
            self.kinds[name], self.links[name] = "link", member.linkname
        elif member.isreg():
            self.kinds[name] = "file"
            self.file_count += 1
            if len(self.files) < SHOWN_FILES:
                self.files.append(name)
        else:  # a folder; a hard link or device never passes the upload's check
            self.kinds[name] = "folder" if member.isdir() else "other"

    def kind_at(self, path: str) -> Kind:
        kind = self._resolve(path)
        # "train.py/" (or "train.py/.") asks for a folder: a file there is not one.
        wants_folder = path.rsplit("/", 1)[-1] in ("", ".")
        if kind == "file" and not wants_folder:
            return "file"
        return "folder" if kind == "folder" else "missing"

    def _resolve(self, path: str) -> str | None:
        """The kind of the member ``path`` leads to (None: nothing there)."""
        pending = list(reversed(path.split("/")))
        here, links = "", 0  # the folder reached so far ("" is the tree's root)
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if self.kinds.get(here) != "folder":
                return None  # a file cannot hold a name (ENOTDIR)
            if part == "..":
                if not here:
                    return None  # above the tree: not the job's code
                here = posixpath.dirname(here)
                continue
            name = posixpath.join(here, part) if here else part
            kind = self.kinds.get(name)
            if kind == "link":
                links += 1
                target = self.links[name]
                if links > _MAX_LINKS or target.startswith("/"):
                    return None
                pending.extend(reversed(target.split("/")))  # relative to the link's folder
                continue
            if kind is None:
                return None
            here = name
        return self.kinds.get(here)
