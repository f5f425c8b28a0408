"""The free-capacity index's buckets keep their order through heavy churn: best fit takes a
bucket's first node, so the order decides placements, and the index compacts a bucket (drops the
slots its deleted keys left) once enough keys have left it."""

from __future__ import annotations

import random

import pytest

from aicluster.core import Slot, make_cluster
from aicluster.scheduler.index import FreeIndex


@pytest.mark.parametrize("seed", range(4))
def test_buckets_keep_the_order_nodes_entered_them(seed: int) -> None:
    rng = random.Random(seed)
    nodes = 400
    cluster = make_cluster(nodes=nodes, gpus_per_node=8)
    names = [node.name for node in cluster.nodes]
    index = FreeIndex(cluster)
    # The plain model: each bucket a list, a node appended when it enters, removed when it leaves.
    model: list[list[int]] = [[] for _ in range(9)]
    model[8] = list(range(nodes))
    for step in range(6_000):
        i = rng.randrange(nodes) if step % 3 else next(iter(index.buckets["H100"][8]), 0)
        free = index.free[i]
        delta = -rng.randint(1, free) if free and (free == 8 or rng.random() < 0.5) else 0
        if not delta and free < 8:
            delta = rng.randint(1, 8 - free)
        if not delta:
            continue
        slots = [Slot(names[i], abs(delta))]
        if delta < 0:
            index.allocate(slots)
        else:
            index.release(slots)
        model[free].remove(i)
        model[free + delta].append(i)
        if step % 50 == 0:
            assert [list(bucket) for bucket in index.buckets["H100"]] == model
    assert [list(bucket) for bucket in index.buckets["H100"]] == model
