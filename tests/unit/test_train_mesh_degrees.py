"""How ``aicluster.train.mesh()`` splits the ranks: one table of named cases."""

import pytest

from aicluster.train.devicemesh import Degrees, degrees

SPLITS = {
    "all data parallel by default": (dict(world_size=8), Degrees(1, 8, 1)),
    "tensor given: data takes the rest": (dict(world_size=8, tensor=2), Degrees(1, 4, 2)),
    "pipeline and tensor given": (dict(world_size=8, pipeline=2, tensor=2), Degrees(2, 2, 2)),
    "the spec wins over the arguments": (
        dict(world_size=4, tensor=4, spec="data=2,tensor=2"),
        Degrees(1, 2, 2),
    ),
    "the spec's pipeline": (dict(world_size=4, spec="pipeline=2,data=2"), Degrees(2, 2, 1)),
}


@pytest.mark.parametrize(("given", "expected"), SPLITS.values(), ids=SPLITS.keys())
def test_degrees(given: dict, expected: Degrees) -> None:
    assert degrees(**given) == expected


REFUSED = {
    "tensor does not divide the world": (dict(world_size=6, tensor=4), "do not split"),
    "the spec's product is not the world": (
        dict(world_size=4, spec="data=3,tensor=2"),
        "but the job has 4 ranks",
    ),
    "a bad spec": (dict(world_size=4, spec="data=two"), "expected data=N"),
    "an unknown dimension": (dict(world_size=4, spec="expert=4"), "expected data=N"),
}


@pytest.mark.parametrize(("given", "says"), REFUSED.values(), ids=REFUSED.keys())
def test_refused(given: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        degrees(**given)
