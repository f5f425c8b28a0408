"""``aicluster.train.mesh()``: the spec's parallelism as a ``dp × pp × tp`` DeviceMesh over the
ranks (four real gloo ranks on 127.0.0.1, run as the runtime runs them), with FSDP2 over ``dp``
and tensor parallelism over ``tp`` really sharding the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ranks import run_ranks, steps

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("mesh_child.py")


def test_tensor_groups_are_consecutive_ranks_and_each_rank_holds_a_quarter(
    tmp_path: Path,
) -> None:
    ranks = run_ranks(CHILD, [], 4, tmp_path, {"AICLUSTER_PARALLELISM": "data=2,tensor=2"})
    meshes = [json.loads((tmp_path / f"mesh-{rank}.json").read_text()) for rank in range(4)]
    for rank, layout in enumerate(meshes):
        assert layout["names"] == ["dp", "pp", "tp"]
        assert layout["shape"] == [2, 1, 2]
        assert layout["coordinate"] == [rank // 2, 0, rank % 2]
        assert layout["tp"] == [rank - rank % 2, rank - rank % 2 + 1]  # consecutive ranks
        assert layout["dp"] == [rank % 2, rank % 2 + 2]
    for records in ranks:
        trained = steps(records)
        assert len(trained) == 3
        held, whole = trained[-1]["metrics"]["held"], trained[-1]["metrics"]["whole"]
        # Each rank holds about a quarter: the row-parallel layer's bias is not split by tp.
        assert whole / 4 <= held <= whole / 4 + 8, (held, whole)
    losses = {round(records[-1]["loss"], 6) for records in map(steps, ranks)}
    assert len(losses) == 1  # one model: every rank computes the same loss


def test_a_spec_that_does_not_multiply_to_the_world_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="but the job has 4 ranks"):
        run_ranks(CHILD, [], 4, tmp_path, {"AICLUSTER_PARALLELISM": "data=3,tensor=2"})
