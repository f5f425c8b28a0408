"""Checkpoints under real kills: SIGKILL mid-write, kill-and-resume exactness, SIGTERM stops.

Real processes (no fakes): forked writers killed with SIGKILL at seeded random moments, and the
``ddp_mlp`` example run as a world of one and of two gloo ranks on 127.0.0.1, killed and resumed.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from checkpoint_child import (
    kill_all,
    launch_ddp_mlp,
    numbered_model,
    read_checkpoint,
    save_until_killed,
)

from aicluster.train import Checkpointer, ckptdir, read_records

pytestmark = pytest.mark.integration

KEEP_LAST = 2


#: Kill rounds per writer. Each ``process`` round starts a checkpoint process (an interpreter
#: importing torch: 8-10 s of CPU here, 190 s for 20 rounds in a suite run), and waits for a
#: commit before its kill, so its kills land mid-write more often than the thread's: 8 rounds
#: still put several of them inside a write.
ROUNDS = {"thread": 20, "process": 8}


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_sigkill_at_random_points_never_loses_the_latest_complete_checkpoint(
    tmp_path: Path, writer: str
) -> None:
    """``thread``: the default writer, a thread of the training process. ``process``: DCP's
    checkpoint process; the whole process group is killed, writer included."""
    rounds = ROUNDS[writer]
    # Forked from a server that has imported torch already: a kill round costs a fork, not an
    # interpreter start.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(
        ["torch", "torch._dynamo", "checkpoint_child", "aicluster.train.checkpoint"]
    )
    rng = random.Random(20240521)
    previous, partial_seen, newer_partial_seen = 0, 0, 0
    for _ in range(rounds):
        ready = context.Event()
        child = context.Process(
            target=save_until_killed, args=(str(tmp_path), KEEP_LAST, ready, writer)
        )
        child.start()
        assert ready.wait(120), "the writer did not start"
        # The first round commits once, so there is something to keep. A checkpoint process
        # starts (an interpreter importing torch) at each child's first save: a kill before
        # that would find no write under way, so with it every round waits for a new commit.
        if previous == 0 or writer == "process":
            _wait_for_commit_after(tmp_path, previous, child)
        time.sleep(rng.uniform(0.0, 0.6))
        assert child.pid is not None
        os.killpg(child.pid, signal.SIGKILL)  # the child leads its own session (os.setsid)
        child.join(30)
        assert child.exitcode == -signal.SIGKILL
        latest, partial = _check_directory(tmp_path)
        assert latest >= previous  # the newest complete checkpoint is never lost
        previous = latest
        partial_seen += bool(partial)
        newer_partial_seen += any(step > latest for step in partial)
    print(
        f"latest {previous}; kills leaving a partial checkpoint {partial_seen}/{rounds}, "
        f"a partial one newer than the latest {newer_partial_seen}/{rounds}"
    )
    assert partial_seen >= rounds // 4, "the kills should land while a checkpoint is written"


def _wait_for_commit_after(
    directory: Path, step: int, child: multiprocessing.process.BaseProcess
) -> None:
    deadline = time.monotonic() + 120
    while (ckptdir.latest_step(directory) or 0) <= step:
        assert child.is_alive(), "the writer died before committing"
        assert time.monotonic() < deadline, "no checkpoint committed within 120 s"
        time.sleep(0.01)


def _check_directory(directory: Path) -> tuple[int, list[int]]:
    """The latest step (which must load and hold its own step) and the partial steps present."""
    complete, partial = ckptdir.complete_steps(directory), []
    for entry in os.listdir(directory):
        if ".tmp-" in entry or ".deleting-" in entry:
            partial.append(int(entry.split(".")[0].removeprefix("step-")))
        else:  # anything named step-N was renamed into place complete
            assert ckptdir.read_manifest(directory / entry) is not None, entry
    assert complete and len(complete) <= KEEP_LAST + 1  # +1: killed between commit and prune
    model = numbered_model()
    resumed = Checkpointer(directory).load(model=model)
    assert resumed is not None and resumed.step == complete[-1]
    assert resumed.extra == {"step": resumed.step}
    assert all(torch.all(p == resumed.step) for p in model.parameters())
    return resumed.step, partial


def _run(world: int, args: list[str], logs: Path, timeout: float = 300) -> None:
    _wait(launch_ddp_mlp(world, args, logs), logs, timeout)


def _wait(procs: list[subprocess.Popen[bytes]], logs: Path, timeout: float = 300) -> None:
    """Until the ranks ``procs`` (logging into ``logs``) exit; each must exit 0."""
    try:
        codes = [proc.wait(timeout=timeout) for proc in procs]
    finally:
        kill_all(procs)
    assert codes == [0] * len(procs), (logs / "rank-0.log").read_text()[-3000:]


def _run_killed_after(world: int, args: list[str], logs: Path, directory: Path, step: int) -> int:
    """Start the ranks; SIGKILL them all once ``step`` is checkpointed; the latest step left."""
    procs = launch_ddp_mlp(world, args, logs)
    try:
        deadline = time.monotonic() + 300
        while (ckptdir.latest_step(directory) or 0) < step:
            assert all(proc.poll() is None for proc in procs), "a rank ended before the kill"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        kill_all(procs)
    return ckptdir.latest_step(directory) or 0


@pytest.mark.parametrize(("world", "writer"), [(1, "thread"), (2, "thread"), (2, "process")])
def test_kill_and_resume_is_bit_identical_to_an_uninterrupted_run(
    tmp_path: Path, world: int, writer: str
) -> None:
    steps = 60
    common = ["--steps", str(steps), "--checkpoint-every", "10", "--deterministic"]
    common += ["--checkpoint-writer", writer]
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    # The uninterrupted run and the one killed are independent (own folders, own rendezvous
    # ports): side by side.
    logs = tmp_path / "logs-straight"
    uninterrupted = launch_ddp_mlp(world, [*common, "--checkpoint-dir", str(straight)], logs)
    try:
        killed_at = _run_killed_after(
            world,
            [*common, "--checkpoint-dir", str(interrupted), "--step-sleep", "0.1"],
            tmp_path / "logs-killed",
            interrupted,
            step=20,
        )
    except BaseException:
        kill_all(uninterrupted)
        raise
    _wait(uninterrupted, logs)
    assert 20 <= killed_at < steps
    _run(world, [*common, "--checkpoint-dir", str(interrupted)], tmp_path / "logs-resumed")
    assert f"resumed from step {killed_at}" in (tmp_path / "logs-resumed/rank-0.log").read_text()

    expected = read_checkpoint(ckptdir.final_path(straight, steps))
    actual = read_checkpoint(ckptdir.final_path(interrupted, steps))
    assert expected.keys() == actual.keys()
    tensors = [key for key, value in expected.items() if isinstance(value, torch.Tensor)]
    assert any(key.startswith("model.") for key in tensors)
    assert any(key.startswith("optim.state.") for key in tensors)  # Adam's moments and step
    for key in tensors:
        assert torch.equal(actual[key], expected[key]), key
    for rank in range(world):  # the data position and the (seeded) torch generator
        want, got = (json.loads(blobs[f"ranks.{rank}"]) for blobs in (expected, actual))
        assert got["extra"] == want["extra"] and got["rng"]["torch"] == want["rng"]["torch"]


def test_sigterm_to_one_rank_checkpoints_and_stops_the_whole_gang(tmp_path: Path) -> None:
    directory, logs = tmp_path / "ckpt", tmp_path / "logs"
    telemetry = str(tmp_path / "rank-{rank}.telemetry.jsonl")
    args = ["--steps", "10000", "--checkpoint-every", "100000", "--step-sleep", "0.05"]
    procs = launch_ddp_mlp(
        2,
        [*args, "--checkpoint-dir", str(directory)],
        logs,
        env={"AICLUSTER_TELEMETRY_FILE": telemetry},
    )
    try:
        deadline = time.monotonic() + 300
        while "step 20 loss" not in _text(logs / "rank-0.log"):
            assert all(proc.poll() is None for proc in procs) and time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(procs[1].pid, signal.SIGTERM)  # as GangHandle.stop(), but to one rank only
        codes = [proc.wait(timeout=120) for proc in procs]
    finally:
        kill_all(procs)
    assert codes == [0, 0], _text(logs / "rank-0.log")[-3000:]
    stopped = ckptdir.latest_step(directory)
    assert stopped is not None and stopped >= 20
    assert f"stop requested: stopping after step {stopped}" in _text(logs / "rank-0.log")
    records, _ = read_records(telemetry.replace("{rank}", "0"))
    saved = [r for r in records if r.kind == "checkpoint"]
    assert [r.step for r in saved] == [stopped] and saved[0].metrics["seconds"] > 0
    manifest = ckptdir.read_manifest(ckptdir.final_path(directory, stopped))
    assert manifest is not None and manifest["world_size"] == 2
    assert manifest["extra"] == {"samples_seen": stopped * 64 * 2}
    for rank in (0, 1):
        steps = [
            r.step
            for r in read_records(telemetry.replace("{rank}", str(rank)))[0]
            if r.kind == "step"
        ]
        assert steps[-1] == stopped  # both ranks stopped after the same step


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
