"""The pure parts of the per-job disks (runtime/sandbox/jobdisk.py): sizes, paths, the sweep's
choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from aicluster.runtime.sandbox import jobdisk


def test_an_image_is_whole_mebibytes_and_never_below_the_floor() -> None:
    assert jobdisk.image_bytes(1) == 1 << 30
    assert jobdisk.image_bytes(0.05) == 52 << 20  # 51.2 MiB, rounded up
    assert jobdisk.image_bytes(0.001) == jobdisk.MIN_IMAGE_BYTES
    with pytest.raises(ValueError):
        jobdisk.image_bytes(0)


def test_the_default_cap_is_a_share_of_the_free_space(tmp_path: Path) -> None:
    quarter = jobdisk.default_disk_gb(tmp_path)
    half = jobdisk.default_disk_gb(tmp_path, share=0.5)
    assert 0.001 <= quarter <= half
    assert round(quarter * 1000) == quarter * 1000  # to a thousandth, as --job-disk-gb takes


def test_images_lie_in_the_state_dir_by_job_id_and_refuse_a_path(tmp_path: Path) -> None:
    assert jobdisk.image_path(tmp_path, "job-1") == tmp_path / "jobdisks" / "job-1.img"
    for bad in ("", "../x", "a/b", ".probe"):
        with pytest.raises(ValueError):
            jobdisk.image_path(tmp_path, bad)


def test_the_sweep_takes_the_images_of_jobs_no_longer_active() -> None:
    names = ["done.img", "running.img", ".probe.img", ".x.img.new", "notes.txt", "gone.img"]
    active = {"running"}
    assert jobdisk.stale_jobs(names, active.__contains__) == ["done", "gone"]
    assert jobdisk.stale_jobs(names, lambda _: True) == []


def test_a_sweep_without_images_does_nothing(tmp_path: Path) -> None:
    assert jobdisk.sweep(tmp_path, lambda _: False, lambda _: None) == []
