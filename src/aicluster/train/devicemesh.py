"""The job's device mesh: ``mesh = train.mesh()`` lays the ranks out as ``dp × pp × tp``.

The degrees come from the job's spec (``parallelism: {data, tensor, pipeline}``, which the
runtime passes as ``AICLUSTER_PARALLELISM``), else from the arguments, else all ranks are data
parallel. Tensor parallelism is the innermost dimension: consecutive ranks form a tensor-parallel
group. The runtime starts a rank per GPU and numbers them so that consecutive ranks share an
NVLink domain, then a node, and a tensor-parallel group is one placement slot's ranks, inside one
NVLink domain (``aicluster.runtime.layout.rank_layout``). Then pipeline stages: one pipeline is
``pipeline × tensor`` consecutive ranks, which the scheduler keeps inside one rack where it can
(ranks are numbered rack by rack). Data parallelism is outermost, across pipelines and racks.
User code writes
``fully_shard(model, mesh=mesh["dp"])`` and ``parallelize_module(block, mesh["tp"], plan)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aicluster.train import env

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["DIMENSIONS", "Degrees", "degrees", "mesh"]

#: The mesh's dimension names, outermost first.
DIMENSIONS = ("dp", "pp", "tp")


@dataclass(frozen=True)
class Degrees:
    """How many ranks each dimension spans; their product is the world size."""

    pipeline: int = 1
    data: int = 1
    tensor: int = 1

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data, self.pipeline, self.tensor)


def degrees(
    world_size: int,
    *,
    pipeline: int | None = None,
    data: int | None = None,
    tensor: int | None = None,
    spec: str | None = None,
) -> Degrees:
    """The degrees for ``world_size`` ranks: the spec's (``"data=2,tensor=2,pipeline=1"``, the
    runtime's ``AICLUSTER_PARALLELISM``) where given, then the arguments; data parallelism takes
    what is left. Raises ``ValueError`` when they do not multiply to the world size."""
    given = _parse(spec) if spec else {}
    pipeline = given.get("pipeline", pipeline or 1)
    tensor = given.get("tensor", tensor or 1)
    if "data" in given:
        data = given["data"]
    elif data is None:
        data, rest = divmod(world_size, pipeline * tensor)
        if rest or data < 1:
            raise ValueError(
                f"{world_size} ranks do not split into pipeline {pipeline} x tensor {tensor}"
            )
    made = Degrees(pipeline, data, tensor)
    if pipeline * data * tensor != world_size:
        raise ValueError(
            f"pipeline {pipeline} x data {data} x tensor {tensor} = {pipeline * data * tensor}, "
            f"but the job has {world_size} ranks"
        )
    return made


def _parse(spec: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for part in spec.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in ("pipeline", "data", "tensor") or not value.strip().isdigit():
            raise ValueError(f"bad {env.PARALLELISM} {spec!r}: expected data=N,tensor=N,pipeline=N")
        found[name] = int(value)
    return found


def mesh(
    *, pipeline: int | None = None, data: int | None = None, tensor: int | None = None
) -> DeviceMesh:
    """A ``DeviceMesh`` over every rank with dimensions ``pp``, ``dp`` and ``tp`` (a dimension
    of size 1 is kept, so ``mesh["tp"]`` always exists). Call after :func:`aicluster.train.init`."""
    from torch.distributed.device_mesh import init_device_mesh

    from aicluster.train.session import context

    ctx = context()
    shape = degrees(
        ctx.world_size,
        pipeline=pipeline,
        data=data,
        tensor=tensor,
        spec=os.environ.get(env.PARALLELISM) or None,
    ).shape
    return init_device_mesh(ctx.device.type, shape, mesh_dim_names=DIMENSIONS)
