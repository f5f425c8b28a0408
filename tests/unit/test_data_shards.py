"""Cutting a folder into shards, and the manifest checks a server runs on what a client sends."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from aicluster.artifacts.shards import (
    DatasetError,
    check_dataset_name,
    check_manifest,
    manifest_hash,
    plan_folder,
    shard_chunks,
)


def _folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    return root


def _rebuild(plan: Any) -> dict[str, bytes]:
    """The files back from the shards, as the node cache assembles them."""
    shards = [b"".join(shard_chunks(plan, i)) for i in range(len(plan.members))]
    for index, shard in enumerate(plan.shards):
        assert hashlib.sha256(shards[index]).hexdigest() == shard["sha256"]
    return {
        f["path"]: b"".join(shards[s][o : o + n] for s, o, n in f["pieces"]) for f in plan.files
    }


def test_small_files_are_grouped_and_large_ones_split(tmp_path: Path) -> None:
    files = {
        "a.txt": b"a" * 10,
        "b/c.txt": b"c" * 20,
        "big.bin": os.urandom(250),
        "empty": b"",
        "z.txt": b"z" * 90,
    }
    plan = plan_folder(_folder(tmp_path / "d", files), shard_bytes=100)
    assert [f["path"] for f in plan.files] == sorted(files)
    sizes = [s["size"] for s in plan.shards]
    assert sizes == [30, 100, 100, 50, 90]  # a+c grouped; big split in three; z alone
    assert _rebuild(plan) == files
    assert check_manifest(plan.manifest()) == plan.manifest()


def test_the_same_folder_gives_the_same_manifest(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "d", {"x": b"1", "y/z": b"22"})
    first, second = plan_folder(folder), plan_folder(folder)
    assert manifest_hash(first.manifest()) == manifest_hash(second.manifest())


def test_a_symlink_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"other tenant's")
    folder = _folder(tmp_path / "d", {"ok": b"1"})
    (folder / "inside").symlink_to(folder / "ok")
    assert [f["path"] for f in plan_folder(folder).files] == ["inside", "ok"]
    (folder / "out").symlink_to(tmp_path / "secret")
    with pytest.raises(DatasetError, match="out of the folder"):
        plan_folder(folder)


@pytest.mark.parametrize("name", ["", "A", "../x", "a/b", "-a", "a" * 64, "a b"])
def test_bad_dataset_names(name: str) -> None:
    with pytest.raises(DatasetError):
        check_dataset_name(name)


def _manifest(path: Any = "f", pieces: Any = None, size: int = 4) -> dict[str, Any]:
    shard = {"sha256": "0" * 64, "size": 4}
    file = {"path": path, "size": size, "pieces": [[0, 0, 4]] if pieces is None else pieces}
    return {"format": 1, "files": [file], "shards": [shard]}


@pytest.mark.parametrize(
    "manifest",
    [
        _manifest(path="../etc/passwd"),
        _manifest(path="/abs"),
        _manifest(path="a/../../b"),
        _manifest(path="a//b"),
        _manifest(path="nul\x00"),
        _manifest(pieces=[[0, 2, 4]]),  # past the shard's end
        _manifest(pieces=[[1, 0, 4]]),  # no such shard
        _manifest(pieces=[[0, 0, 2]]),  # does not add up to the size
        _manifest(pieces=[[0, -1, 4]]),
        {"format": 1, "files": [], "shards": [{"sha256": "x", "size": 1}]},
        {"format": 2, "files": [], "shards": []},
        [],
    ],
)
def test_manifests_a_server_refuses(manifest: Any) -> None:
    with pytest.raises(DatasetError):
        check_manifest(manifest)


def test_a_path_that_is_both_file_and_folder_is_refused() -> None:
    manifest = _manifest(path="a")
    manifest["files"].append({"path": "a/b", "size": 0, "pieces": []})
    with pytest.raises(DatasetError, match="both a file and a folder"):
        check_manifest(manifest)
