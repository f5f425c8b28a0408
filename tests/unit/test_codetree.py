"""Shipped code trees: deterministic packing, ignore files, refused links and special files,
unpacking that verifies the hash and refuses unsafe archives, leaving nothing behind, and what an
archive holds at a job's entrypoint, read without extracting (symlinks resolved as the unpacked
tree would resolve them, and bounds past which it cannot say)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from aicluster.artifacts import CodeTreeError, PackedTree, check_archive, pack_tree, unpack_tree
from aicluster.artifacts.codeindex import PathInTree, find_path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("WIDTH = 4\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return root


@pytest.fixture
def packed(tree: Path) -> Iterator[PackedTree]:
    with pack_tree(tree) as result:
        yield result


def _files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_the_same_tree_packs_to_the_same_bytes(tree: Path, tmp_path: Path) -> None:
    with pack_tree(tree) as first, pack_tree(tree) as second:
        assert first.sha256 == second.sha256
        assert first.path.read_bytes() == second.path.read_bytes()
        assert first.sha256 == hashlib.sha256(first.path.read_bytes()).hexdigest()
        assert first.size == first.path.stat().st_size
    # A copy elsewhere, with other times and a narrower mode, is the same code.
    copy = shutil.copytree(tree, tmp_path / "elsewhere" / "copy")
    os.utime(copy / "train.py", (1e9, 1e9))
    (copy / "train.py").chmod(0o600)
    with pack_tree(copy) as again:
        assert again.sha256 == first.sha256
    (copy / "train.py").write_text("print('changed')\n")
    with pack_tree(copy) as changed:
        assert changed.sha256 != first.sha256


def test_headers_are_normalised(packed: PackedTree) -> None:
    with tarfile.open(packed.path) as tar:
        members = {member.name: member for member in tar}
    assert list(members) == sorted(members)
    assert all(
        m.mtime == 0 and m.uid == m.gid == 0 and m.uname == m.gname == "" for m in members.values()
    )
    assert members["train.py"].mode == 0o644
    assert members["run.sh"].mode == 0o755 and members["pkg"].mode == 0o755
    assert packed.path.read_bytes()[4:8] == b"\0\0\0\0"  # gzip header mtime
    assert packed.files == ("pkg/", "pkg/__init__.py", "pkg/model.py", "run.sh", "train.py")


def test_ignored_files_and_git_are_not_shipped(tree: Path) -> None:
    (tree / ".gitignore").write_text("*.log\ndata/\n")
    (tree / "run.log").write_text("noise")
    (tree / "data").mkdir()
    (tree / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (tree / "pkg" / ".gitignore").write_text("secret.txt\n")
    (tree / "pkg" / "secret.txt").write_text("token")
    (tree / "secret.txt").write_text("not ignored here: the pattern is pkg's")
    (tree / ".aiclusterignore").write_text("notes.md\n!keep.log\n")
    (tree / "notes.md").write_text("draft")
    (tree / "keep.log").write_text("wanted")
    (tree / ".git").mkdir()
    (tree / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    with pack_tree(tree) as packed:
        shipped = set(packed.files)
    assert {"train.py", "secret.txt", "keep.log", ".gitignore", "pkg/.gitignore"} <= shipped
    for left_out in ("run.log", "data/", "data/big.bin", "pkg/secret.txt", "notes.md"):
        assert left_out not in shipped
    assert not any(name.startswith(".git/") or name == ".git/" for name in shipped)


def test_an_ignored_special_file_is_fine_and_a_shipped_one_is_refused(tree: Path) -> None:
    os.mkfifo(tree / "pipe")
    with pytest.raises(CodeTreeError, match="not a regular file"):
        pack_tree(tree)
    (tree / ".aiclusterignore").write_text("pipe\n")
    with pack_tree(tree) as packed:
        assert "pipe" not in packed.files


def test_a_symlink_out_of_the_tree_is_refused(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("private")
    (tree / "data.txt").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(CodeTreeError, match="outside"):
        pack_tree(tree)
    (tree / "data.txt").unlink()
    (tree / "pkg" / "up").symlink_to("../..")  # relative, and out as well
    with pytest.raises(CodeTreeError, match="outside"):
        pack_tree(tree)


def test_a_symlink_inside_travels_as_a_relative_link(tree: Path, tmp_path: Path) -> None:
    (tree / "main.py").symlink_to(tree / "train.py")  # absolute, but inside
    (tree / "lib").symlink_to("pkg")
    with pack_tree(tree) as packed:
        unpack_tree(packed.open(), tmp_path / "out", packed.sha256)
    out = tmp_path / "out"
    assert os.readlink(out / "main.py") == "train.py"
    assert os.readlink(out / "lib") == "pkg"
    assert (out / "lib" / "model.py").read_text() == "WIDTH = 4\n"


def test_the_size_caps_are_checked_while_packing(tree: Path) -> None:
    (tree / "weights.bin").write_bytes(os.urandom(200_000))
    with pytest.raises(CodeTreeError, match="cap of 100000"):
        pack_tree(tree, max_bytes=100_000)
    with pytest.raises(CodeTreeError, match="over the cap of 1000"):
        pack_tree(tree, max_unpacked_bytes=1000)


def test_unpack_restores_the_tree(tree: Path, packed: PackedTree, tmp_path: Path) -> None:
    dest = tmp_path / "nodes" / "job-1" / "code"
    unpack_tree(packed.open(), dest, packed.sha256)
    assert _files(dest) == _files(tree)
    assert os.access(dest / "run.sh", os.X_OK)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["code"]  # no temporary left
    with pytest.raises(FileExistsError):
        unpack_tree(packed.open(), dest, packed.sha256)


def test_unpack_refuses_a_tampered_archive(packed: PackedTree, tmp_path: Path) -> None:
    data = bytearray(packed.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    dest = tmp_path / "out" / "code"
    with pytest.raises(CodeTreeError, match="changed or damaged"):
        unpack_tree(io.BytesIO(bytes(data)), dest, packed.sha256)
    assert list((tmp_path / "out").iterdir()) == []


def _archive(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, content in members:
            info.size = len(content) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(content) if info.isreg() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


UNSAFE = {
    "dotdot": [(_member("ok.py"), b"x"), (_member("../evil.py"), b"x")],
    "inner dotdot": [(_member("pkg/../../evil.py"), b"x")],
    "absolute": [(_member("/tmp/evil.py"), b"x")],
    "symlink out": [(_member("link", tarfile.SYMTYPE, "../../etc/passwd"), b"")],
    "absolute symlink": [(_member("link", tarfile.SYMTYPE, "/etc/passwd"), b"")],
    "hard link": [(_member("a.py"), b"x"), (_member("b.py", tarfile.LNKTYPE, "a.py"), b"")],
    "device": [(_member("dev", tarfile.CHRTYPE), b"")],
    "fifo": [(_member("fifo", tarfile.FIFOTYPE), b"")],
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unpack_refuses_an_unsafe_archive_and_leaves_nothing(case: str, tmp_path: Path) -> None:
    data = _archive(*UNSAFE[case])
    sha256 = hashlib.sha256(data).hexdigest()
    parent = tmp_path / "work"
    with pytest.raises(CodeTreeError):
        unpack_tree(io.BytesIO(data), parent / "code", sha256)
    assert list(parent.iterdir()) == []
    assert not (tmp_path / "evil.py").exists()
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(data)
    with pytest.raises(CodeTreeError):
        check_archive(archive)


def test_unpack_refuses_what_is_not_a_tar_gz_and_too_many_bytes(tmp_path: Path) -> None:
    junk = b"not an archive"
    with pytest.raises(CodeTreeError, match="not a valid code archive"):
        unpack_tree(io.BytesIO(junk), tmp_path / "a", hashlib.sha256(junk).hexdigest())
    bomb = _archive((_member("zeros.bin"), b"\0" * 100_000))
    with pytest.raises(CodeTreeError, match="over 10000 bytes"):
        unpack_tree(
            io.BytesIO(bomb), tmp_path / "b", hashlib.sha256(bomb).hexdigest(),
            max_unpacked_bytes=10_000,
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


# -- what an archive holds at a path ---------------------------------------------------------


def _packed(root: Path) -> bytes:
    with pack_tree(root) as packed:
        return packed.path.read_bytes()


@pytest.fixture
def linked(tmp_path: Path) -> bytes:
    root = tmp_path / "code"
    (root / "pkg" / "deep").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg" / "model.py").write_text("")
    (root / "pkg" / "deep" / "run.py").write_text("")
    os.symlink("pkg/model.py", root / "alias.py")
    os.symlink("pkg/deep", root / "shortcut")
    os.symlink("missing.py", root / "dangling.py")
    return _packed(root)


def _find(data: bytes, path: str, **bounds: int) -> PathInTree:
    return find_path(io.BytesIO(data), path, **bounds)


@pytest.mark.parametrize(
    "path",
    [
        "train.py",
        "./train.py",
        "pkg//model.py",
        "pkg/deep/../model.py",
        "alias.py",
        "shortcut/run.py",
    ],
)
def test_a_file_of_the_tree_is_found_through_its_links(linked: bytes, path: str) -> None:
    assert _find(linked, path).kind == "file"


@pytest.mark.parametrize("path", ["pkg", "pkg/deep/", "shortcut", "."])
def test_a_folder_is_a_folder(linked: bytes, path: str) -> None:
    assert _find(linked, path).kind == "folder"


@pytest.mark.parametrize(
    "path",
    [
        "nope.py",
        "pkg/nope.py",
        "train.py/",  # a file named as a folder
        "train.py/x.py",  # a file cannot hold a name
        "dangling.py",
        "../train.py",  # above the tree
        "pkg/../../train.py",
    ],
)
def test_what_the_tree_does_not_hold_is_missing(linked: bytes, path: str) -> None:
    assert _find(linked, path).kind == "missing"


def test_the_answer_lists_the_first_files_and_counts_them(tmp_path: Path) -> None:
    root = tmp_path / "many"
    root.mkdir()
    for index in range(25):
        (root / f"f{index:02d}.py").write_text("")
    found = _find(_packed(root), "train.py")
    assert found.kind == "missing" and found.file_count == 25
    assert found.files == tuple(f"f{index:02d}.py" for index in range(10))


def test_folders_are_implied_by_the_members_below_them() -> None:
    data = _archive((_member("src/app/main.py"), b"print()\n"))
    assert _find(data, "src/app/main.py").kind == "file"
    assert _find(data, "src/app").kind == "folder"


def test_an_absolute_link_or_a_loop_leads_nowhere_in_the_tree() -> None:
    # pack_tree never makes either; an archive uploaded by hand might hold them.
    absolute = _archive((_member("train.py", tarfile.SYMTYPE, "/etc/passwd"), b""))
    assert _find(absolute, "train.py").kind == "missing"
    loop = _archive(
        (_member("a.py", tarfile.SYMTYPE, "b.py"), b""),
        (_member("b.py", tarfile.SYMTYPE, "a.py"), b""),
    )
    assert _find(loop, "a.py").kind == "missing"


def test_past_the_member_bound_a_missing_path_is_unknown() -> None:
    data = _archive(*((_member(f"f{index}.py"), b"") for index in range(30)))
    assert _find(data, "f3.py", max_members=10).kind == "file"  # found before the bound
    assert _find(data, "f29.py", max_members=10).kind == "unknown"
    assert _find(data, "f29.py", max_members=30).kind == "file"
    assert _find(data, "nope.py", max_members=30).kind == "missing"  # read to its end


def test_past_the_byte_bound_a_missing_path_is_unknown() -> None:
    data = _archive((_member("weights.bin"), b"\0" * 100_000), (_member("train.py"), b""))
    assert _find(data, "train.py", max_read_bytes=50_000).kind == "unknown"
    assert _find(data, "train.py", max_read_bytes=200_000).kind == "file"


def test_what_is_not_a_tar_gz_is_a_code_tree_error() -> None:
    with pytest.raises(CodeTreeError, match="not a valid code archive"):
        _find(b"not an archive", "train.py")


def test_a_refusal_names_the_path_the_tree_and_its_first_files(linked: bytes) -> None:
    where = "the shipped code (sha256 0123)"
    missing = _find(linked, "nope.py").refusal("nope.py", where)
    assert missing == (
        "entrypoint: nope.py is not in the shipped code (sha256 0123); it holds 3 files: "
        "pkg/deep/run.py, pkg/model.py, train.py"
    )
    folder = _find(linked, "pkg").refusal("pkg", where)
    assert folder is not None and folder.startswith("entrypoint: pkg is a folder of the shipped")
    assert _find(linked, "train.py").refusal("train.py", where) is None
    many = PathInTree("missing", tuple(f"f{index}.py" for index in range(10)), 25)
    assert many.listing().endswith("f9.py (and 15 more)") and "25 files" in many.listing()
    assert PathInTree("missing", (), 0).listing() == "it holds no file"
    assert PathInTree("unknown", (), 0).refusal("x.py", where) is None  # past the bounds
