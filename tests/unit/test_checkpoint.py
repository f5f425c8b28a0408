"""Checkpointer in one process (a world of one): round trip, pruning, snapshot, async, safety."""

from __future__ import annotations

import json
import os
import pickle
import random
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from aicluster.train import Checkpointer, ckptdir
from aicluster.train.rng import capture_rng, restore_rng


def make_model(width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 1))


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def assert_same(model: nn.Module, expected: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[name], expected[name]) for name in expected)


def test_round_trip_restores_model_optimizer_rng_and_extra(tmp_path: Path) -> None:
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    train_steps(model, optimizer, 3)
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest() is None and ckpt.load(model=model) is None
        ckpt.save(3, model=model, optimizer=optimizer, extra={"epoch": 1, "pos": (4, 5)})
        ckpt.wait()
        saved, draws = snapshot(model), (torch.rand(3), random.random())
        train_steps(model, optimizer, 2)  # move on, and away from the saved RNG states

        fresh = make_model(16)
        fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.5)
        resumed = ckpt.load(model=fresh, optimizer=fresh_optimizer)
    assert resumed is not None and resumed.step == 3 and resumed.rng_restored
    assert resumed.extra == {"epoch": 1, "pos": [4, 5]}  # a JSON round trip
    assert_same(fresh, saved)
    assert fresh_optimizer.param_groups[0]["lr"] == 0.01
    assert fresh_optimizer.state_dict()["state"][0]["step"].item() == 3
    assert torch.equal(torch.rand(3), draws[0]) and random.random() == draws[1]


def test_keeps_the_last_n_and_latest_is_the_newest(tmp_path: Path) -> None:
    model = make_model()
    with Checkpointer(tmp_path, keep_last=2) as ckpt:
        for step in (10, 20, 30, 40):
            ckpt.save(step, model=model)
        ckpt.wait()
        assert ckpt.steps() == [30, 40] and ckpt.latest() == 40
        assert sorted(os.listdir(tmp_path)) == ["step-000000030", "step-000000040"]
        ckpt.save(5, model=model)  # older than the two kept: pruned as soon as committed
        ckpt.wait()
        assert ckpt.steps() == [30, 40]
        with pytest.raises(FileNotFoundError):
            ckpt.load(model=model, step=10)
        assert ckpt.load(model=model, step=30) is not None


def test_async_save_returns_before_the_write_and_saves_the_state_at_save_time(
    tmp_path: Path,
) -> None:
    model = nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(16)))  # 64 MiB
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, foreach=True)
    gradients = [torch.ones_like(parameter) for parameter in model.parameters()]

    def step() -> None:
        for parameter, gradient in zip(model.parameters(), gradients, strict=True):
            parameter.grad = gradient
        optimizer.step()

    step()
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, model=model, optimizer=optimizer)  # warms the staging buffers
        ckpt.wait()
        expected = snapshot(model)
        expected_moments = [m.clone() for s in optimizer.state.values() for m in s.values()]
        started = time.monotonic()
        ckpt.save(2, model=model, optimizer=optimizer)
        returned_wall, returned = time.time(), time.monotonic() - started
        # Asked before the step: on a busy machine (two test workers) the write may end during it.
        assert ckpt.pending  # the write is still going on in the background
        # Training goes on at once: Adam's first operation (foreach) rewrites every moment,
        # which a copy still under way would reach only after the weights.
        step()
        ckpt.wait()
        total = time.monotonic() - started
        assert not ckpt.pending
        manifest = ckptdir.read_manifest(tmp_path / "step-000000002")
        assert manifest is not None and manifest["created"] > returned_wall
        print(f"save() returned after {returned:.3f}s, committed after {total:.3f}s")
        restored = nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(16)))
        restored_optimizer = torch.optim.Adam(restored.parameters(), lr=0.1, foreach=True)
        ckpt.load(model=restored, optimizer=restored_optimizer)
    assert_same(restored, expected)
    moments = [m for s in restored_optimizer.state.values() for m in s.values()]
    assert all(torch.equal(a, b) for a, b in zip(moments, expected_moments, strict=True))


class _NormFirst(nn.Module):
    """Batch norm runs first in a forward but comes last in the state (a copy's last part)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(*(nn.Linear(512, 512) for _ in range(32)))
        self.norm = nn.BatchNorm1d(512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.norm(x))


def test_the_state_saved_is_the_state_before_the_next_forward(tmp_path: Path) -> None:
    # Batch norm updates its running statistics in a forward: the checkpoint has them as saved.
    torch.manual_seed(0)
    model = _NormFirst()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Checkpointer(tmp_path) as ckpt:
        expected = snapshot(model)
        ckpt.save(1, model=model, optimizer=optimizer)
        model(torch.randn(8, 512) * 100 + 50)  # at once: moves running_mean and running_var
        ckpt.wait()
        restored = _NormFirst()
        ckpt.load(model=restored)
    assert not torch.equal(model.norm.running_mean, expected["norm.running_mean"])
    assert_same(restored, expected)


def test_a_model_saved_without_optimizer_is_copied_before_save_returns(tmp_path: Path) -> None:
    model = nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(16)))
    with Checkpointer(tmp_path) as ckpt:
        expected = snapshot(model)
        ckpt.save(1, model=model)
        with torch.no_grad():  # changed by hand right away, the last copied first
            for parameter in reversed(list(model.parameters())):
                parameter.add_(1.0)
        ckpt.wait()
        restored = nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(16)))
        ckpt.load(model=restored)
    assert_same(restored, expected)


def test_sync_save_is_complete_when_it_returns(tmp_path: Path) -> None:
    model = make_model()
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(5, model=model, extra={"x": 1})
    assert not ckpt.pending and ckpt.latest() == 5
    ckpt.close()
    ckpt.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        ckpt.save(6, model=model)


def test_extra_must_be_json(tmp_path: Path) -> None:
    with Checkpointer(tmp_path) as ckpt, pytest.raises(TypeError, match="JSON"):
        ckpt.save(1, model=make_model(), extra={"bad": object()})


def test_a_step_saved_twice_keeps_the_first(tmp_path: Path) -> None:
    model = make_model()
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(7, model=model, extra={"v": 1})
        ckpt.save(7, model=model, extra={"v": 2})
        ckpt.wait()
        resumed = ckpt.load(model=model)
    assert resumed is not None and resumed.extra == {"v": 1}
    assert os.listdir(tmp_path) == ["step-000000007"]


def test_partial_and_damaged_checkpoints_are_never_chosen(tmp_path: Path) -> None:
    model = make_model()
    with Checkpointer(tmp_path, keep_last=5) as ckpt:
        ckpt.save(1, model=model)
        ckpt.save(2, model=model)
        ckpt.wait()
    # A newer directory still being written, one without its manifest, one with a short file.
    (tmp_path / "step-000000009.tmp-deadbeef0000").mkdir()
    os.rename(tmp_path / "step-000000002", tmp_path / "step-000000003")  # manifest says 2
    damaged = tmp_path / "step-000000004"
    damaged.mkdir()
    (damaged / "manifest.json").write_text("{not json")
    assert ckptdir.complete_steps(tmp_path) == [1]
    good = tmp_path / "step-000000001"
    data = next(p for p in good.iterdir() if p.suffix == ".distcp")
    with open(data, "r+b") as handle:
        handle.truncate(data.stat().st_size - 1)
    assert ckptdir.latest_step(tmp_path) is None


def test_a_new_writer_removes_what_dead_ones_left(tmp_path: Path) -> None:
    (tmp_path / "step-000000009.tmp-deadbeef0000").mkdir()
    (tmp_path / "step-000000003.deleting-abc").mkdir()
    (tmp_path / "unrelated").mkdir()
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, model=make_model())
    assert sorted(os.listdir(tmp_path)) == ["step-000000001", "unrelated"]


class _Boom:
    """Runs a command when unpickled (copying it in the job's own process does not)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch pwned",))

    def __deepcopy__(self, memo: object) -> _Boom:
        return self


def test_loading_never_runs_code_from_the_checkpoint(tmp_path: Path) -> None:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, model=model, optimizer=optimizer)
        ckpt.wait()
        metadata = tmp_path / "step-000000001" / ".metadata"
        original = metadata.read_bytes()
        metadata.write_bytes(pickle.dumps(_Boom()))
        _fix_manifest(tmp_path / "step-000000001")
        with pytest.raises(pickle.UnpicklingError, match="refusing"):
            ckpt.load(model=model)
        metadata.write_bytes(original)
        _fix_manifest(tmp_path / "step-000000001")
    # A non-tensor value (the learning rate) replaced by a pickled object that runs code.
    optimizer.param_groups[0]["lr"] = _Boom()  # type: ignore[assignment]
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(2, model=model, optimizer=optimizer)
        with pytest.raises(CheckpointException, match="Weights only load failed"):
            ckpt.load(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert not (Path.cwd() / "pwned").exists() and not (tmp_path / "pwned").exists()


def _fix_manifest(path: Path) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"] = {name: (path / name).stat().st_size for name in manifest["files"]}
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_rng_states_survive_json(tmp_path: Path) -> None:
    import numpy

    numpy.random.seed(3)
    random.seed(4)
    torch.manual_seed(5)
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    state = json.loads(json.dumps(capture_rng()))
    expected = (numpy.random.rand(), random.gauss(0, 1), torch.rand(1))
    restore_rng(state)
    assert (numpy.random.rand(), random.gauss(0, 1)) == expected[:2]
    assert torch.equal(torch.rand(1), expected[2])
    with pytest.raises(ValueError, match="malformed"):
        restore_rng({"python": {}})


def test_the_writer_is_a_thread_or_dcps_checkpoint_process(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path, async_save="thread").mode == "thread"
    # The default: DCP's checkpoint process on a GPU host (bench/checkpoint_stall.py on an H100),
    # the thread where there is no GPU (this host) or no torch.distributed to run it.
    assert Checkpointer(tmp_path).mode == "thread"
    assert Checkpointer(tmp_path, async_save=False).mode == "sync"
    with pytest.raises(ValueError, match="'thread' or 'process'"):
        Checkpointer(tmp_path, async_save="fork")
    # DCP's checkpoint process joins a process group of its own, set up over the job's
    with pytest.raises(ValueError, match=r"needs torch\.distributed"):
        Checkpointer(tmp_path, async_save="process")
