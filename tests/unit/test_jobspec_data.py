"""``data:`` in the job spec: dataset references, each dataset named once, resolved in place."""

from __future__ import annotations

import pytest

from aicluster.core import JobSpecError, jobspec_from_mapping

BASE = {"name": "j", "entrypoint": "t.py"}


def test_references_and_their_resolution() -> None:
    spec = jobspec_from_mapping({**BASE, "data": ["corpus:latest", "labels:3"]})
    assert spec.data_refs() == [("corpus", None), ("labels", 3)]
    resolved = spec.with_data({"corpus": 7, "labels": 3})
    assert resolved.data == ["corpus:7", "labels:3"]
    assert resolved.spec_hash != spec.spec_hash  # the stored spec says what the job read
    assert "data" not in jobspec_from_mapping(BASE).canonical_dict()  # old specs hash the same


@pytest.mark.parametrize(
    "data",
    [["corpus"], ["corpus:0"], ["corpus:v1"], ["../x:1"], ["Corpus:1"], ["a:1", "a:2"], "a:1"],
)
def test_bad_references_are_refused(data: object) -> None:
    with pytest.raises(JobSpecError, match="data"):
        jobspec_from_mapping({**BASE, "data": data})
