"""The hybrid-parallel GPT example (examples/jobs/gpt_hybrid.py) on real gloo ranks, run as the
runtime runs them: FSDP2 over dp with tensor parallelism over tp, and with two pipeline stages;
a DCP checkpoint taken under one mesh resumes under others with the same state, exactly, and
the same losses as a run never interrupted."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from ranks import ROOT, run_ranks, steps

pytestmark = pytest.mark.integration

GPT_HYBRID = ROOT / "examples/jobs/gpt_hybrid.py"
STEPS, SAVED_AT = 8, 3


def train(folder: Path, layout: str, ranks: int, *args: str) -> tuple[dict[int, float], str]:
    """The losses by step (rank 0's reports) and rank 0's output."""
    folder.mkdir(parents=True)
    records = run_ranks(GPT_HYBRID, args, ranks, folder, {"AICLUSTER_PARALLELISM": layout})
    losses = {record["step"]: record["loss"] for record in steps(records[0])}
    return losses, (folder / "rank-0.log").read_text()


def digest(output: str, words: str) -> str:
    (line,) = [line for line in output.splitlines() if words in line]
    return line.rsplit(" ", 1)[1]


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, float], str]:
    """The losses and rank 0's output of a run under data=2 x tensor=2."""
    folder = tmp_path_factory.mktemp("gpt") / "uninterrupted"
    return train(folder, "data=2,tensor=2", 4, "--steps", str(STEPS), "--checkpoint-every", "0")


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run: tuple[dict[int, float], str]) -> dict[int, float]:
    return uninterrupted_run[0]


def test_the_model_is_sharded_over_data_and_tensor_ranks(
    uninterrupted_run: tuple[dict[int, float], str],
) -> None:
    """FSDP2 holds 1/dp of every parameter on a rank, and tensor parallelism halves the
    block's projections again: a rank holds between 1/4 and 1/2 of the model, and the query
    weight is a DTensor sharded on both mesh dimensions (1/4 of it here)."""
    (line,) = [x for x in uninterrupted_run[1].splitlines() if x.startswith("sharding:")]
    held, whole = (int(n) for n in re.findall(r"holds (\d+) of (\d+)", line)[0])
    assert whole / 4 <= held < whole / 2
    # (FSDP2 shards a tensor-parallel parameter on dp in strides: _StridedShard)
    laid = r"query weight \((_Strided)?Shard\(dim=0[^)]*\), Shard\(dim=0\)\) on \('dp', 'tp'\)"
    assert re.search(laid, line), line


def test_data_and_tensor_parallel_training_lowers_the_loss(uninterrupted: dict[int, float]) -> None:
    assert sorted(uninterrupted) == list(range(1, STEPS + 1))
    assert uninterrupted[STEPS] < uninterrupted[1] - 0.5


def test_two_pipeline_stages_train_the_same_model(
    uninterrupted: dict[int, float], tmp_path: Path
) -> None:
    losses, output = train(tmp_path / "pp", "pipeline=2,data=2", 4, "--steps", str(STEPS))
    assert "'dp': 2, 'pp': 2, 'tp': 1" in output
    assert losses == pytest.approx(uninterrupted, rel=1e-4)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A checkpoint of step 3 under data=2 x tensor=2, and its state digest."""
    folder = tmp_path_factory.mktemp("saved")
    checkpoints = folder / "checkpoints"
    _, output = train(
        folder / "first",
        "data=2,tensor=2",
        4,
        *("--steps", str(SAVED_AT), "--checkpoint-every", str(SAVED_AT)),
        *("--checkpoint-dir", str(checkpoints), "--state-digest"),
    )
    return checkpoints, digest(output, f"saved step {SAVED_AT}")


@pytest.mark.parametrize(("layout", "ranks"), [("data=4", 4), ("data=1,tensor=2", 2)])
def test_a_checkpoint_resumes_under_another_mesh_with_the_same_state_and_losses(
    uninterrupted: dict[int, float],
    saved: tuple[Path, str],
    tmp_path: Path,
    layout: str,
    ranks: int,
) -> None:
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(saved[0], checkpoints)
    losses, output = train(
        tmp_path / "resumed",
        layout,
        ranks,
        *("--steps", str(STEPS), "--checkpoint-every", "100"),
        *("--checkpoint-dir", str(checkpoints), "--state-digest"),
    )
    assert f"resumed from step {SAVED_AT}" in output
    # Parameters and optimizer state as saved, to the bit, on the other mesh.
    assert digest(output, "resumed from step") == saved[1]
    assert sorted(losses) == list(range(SAVED_AT + 1, STEPS + 1))
    expected = {step: uninterrupted[step] for step in losses}
    assert losses == pytest.approx(expected, rel=1e-4)
