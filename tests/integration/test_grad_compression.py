"""Gradient compression for DDP jobs: the runtime's shim registers PyTorch's PowerSGD or fp16
hook when the spec asks (``comm:``), and counts the bytes each rank hands to collectives.

Two real gloo ranks run the unmodified DDP example (examples/jobs/ddp_mlp.py) under the shim,
as the runtime starts them; figures in docs/benchmarks.md come from bench/grad_compression.py.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from ranks import DDP_MLP, final_loss, run_ranks, steps

pytestmark = pytest.mark.integration

STEPS = 200
#: PowerSGD's rank documented in docs/runtime.md ("Bytes sent and gradient compression") for this
#: example: 8x fewer bytes.
RANK = "2"


def train(tmp_path: Path, hook: str) -> tuple[float, float]:
    """(bytes per step per rank once compression is on, loss on the whole dataset at the end)."""
    env = {"AICLUSTER_COMM_HOOK": hook, "AICLUSTER_COMM_RANK": RANK}
    folder = tmp_path / (hook or "plain")
    folder.mkdir()
    ranks = run_ranks(DDP_MLP, ["--steps", str(STEPS), "--checkpoint-every", "0"], 2, folder, env)
    per_rank = [steps(records) for records in ranks]
    assert all(len(records) == STEPS for records in per_rank)
    sent = statistics.median(r["metrics"]["comm_bytes"] for r in per_rank[0][10:])
    loss = final_loss(folder)
    return sent, loss


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[float, float]:
    return train(tmp_path_factory.mktemp("plain"), "")


def test_powersgd_sends_a_quarter_or_less_and_learns_as_well(
    plain: tuple[float, float], tmp_path: Path
) -> None:
    sent, loss = train(tmp_path, "powersgd")
    plain_sent, plain_loss = plain
    assert plain_sent / sent >= 4, (plain_sent, sent)
    assert abs(loss - plain_loss) <= 0.10 * plain_loss, (loss, plain_loss)


def test_fp16_halves_the_bytes(plain: tuple[float, float], tmp_path: Path) -> None:
    sent, loss = train(tmp_path, "fp16")
    assert sent == pytest.approx(plain[0] / 2, rel=0.01)
    assert abs(loss - plain[1]) <= 0.01 * plain[1]
