"""The stop flag in a world of one (SIGTERM itself: tests/integration/test_train_stop.py)."""

from __future__ import annotations

from aicluster import train
from aicluster.train import preemption


def test_request_stop_is_seen_by_should_stop_in_a_world_of_one() -> None:
    try:
        assert not train.should_stop() and not train.stop_requested()
        train.request_stop()
        assert train.stop_requested() and train.should_stop()
    finally:
        preemption.uninstall_handler()
    assert not train.stop_requested()
