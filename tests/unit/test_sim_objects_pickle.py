"""The objects a replay makes by the million write their own ``__init__`` for mypyc
(``init=False``); they still build, compare, hash, copy and pickle as dataclasses do, in the pure
build and in the compiled one (tests/integration/test_compiled_build.py runs this file there)."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from aicluster.core import Admit, DomainLevel, Job, Parallelism, Placement, Slot
from aicluster.scheduler.entries import PendingEntry, Progress, RunningEntry
from aicluster.scheduler.policies.base import Candidate
from aicluster.sim import TraceJob

_JOB = Job("j1", "team-a", 2, 8, parallelism=Parallelism(2, 8), duration_estimate=60.0)
_PLACEMENT = Placement((Slot("n0", 8), Slot("n1", 8, 1, 4.0, 32.0)), DomainLevel.RACK, "r0")
_OBJECTS = [
    _JOB,
    Parallelism(4, 2, 1),
    Progress(10.0, 5.0, 2.0, 1),
    TraceJob("t1", 1.0, 2.0, 16, tenant="b", workers=2, dataset="d", data_gb=3.0),
    _PLACEMENT,
    Slot("n2", 4),
    Admit("j1", _PLACEMENT, "placed", borrowed=8, workers=1),
    PendingEntry(_JOB, 3, 7.0, restarts=2, key=(1.0, 2.0), lane=("a",)),
    RunningEntry(_JOB, _JOB, 3, _PLACEMENT, "any", 9.0, speed=0.5),
    Candidate("j1", 0, 4),
]


@pytest.mark.parametrize("obj", _OBJECTS, ids=lambda obj: type(obj).__name__)
def test_it_copies_and_pickles_to_an_equal_object(obj: object) -> None:
    for again in (pickle.loads(pickle.dumps(obj)), copy.copy(obj), copy.deepcopy(obj)):
        assert type(again) is type(obj)
        assert again == obj
        assert repr(again) == repr(obj)


def test_the_written_out_inits_keep_defaults_derived_fields_and_frozenness() -> None:
    job = Job("j2", "t")
    assert (job.workers, job.gpus_per_worker, job.total_gpus, job.units) == (1, 1, 1, 1)
    assert job.parallelism == Parallelism()
    assert dataclasses.replace(_JOB, workers=4).total_gpus == 32
    assert hash(_JOB) == hash(dataclasses.replace(_JOB))
    assert Placement((), DomainLevel.NODE, "n").score == {}
    assert TraceJob("t", 0.0, 1.0, 1).tenant == "default"
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.workers = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        _PLACEMENT.domain = "r1"  # type: ignore[misc]
    with pytest.raises(ValueError, match="workers must be at least 1"):
        Job("j3", "t", workers=0)
