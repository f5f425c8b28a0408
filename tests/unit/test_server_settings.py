"""The server's settings refuse what they cannot run with."""

from __future__ import annotations

import pytest

from aicluster.control.settings import ServerSettings


def test_the_leader_lease_is_bounded() -> None:
    assert ServerSettings(lease_s=6.0).lease_s == 6.0
    assert ServerSettings().lease_s == 15.0
    for wrong in (0.5, 601.0):
        with pytest.raises(ValueError, match="lease_s"):
            ServerSettings(lease_s=wrong)
