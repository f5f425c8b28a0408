"""Pure parts of the store: roles, principals, placements as JSON, URL resolution."""

from pathlib import Path

import pytest

from aicluster.core import DomainLevel, Placement, Slot
from aicluster.store import (
    DB_FILE,
    Principal,
    Role,
    TokenInfo,
    placement_from_json,
    placement_to_json,
    resolve_url,
)


def test_roles_are_ordered_and_cluster_admins_hold_every_tenant() -> None:
    assert Role.ADMIN.allows(Role.MEMBER) and Role.MEMBER.allows(Role.VIEWER)
    assert not Role.VIEWER.allows(Role.MEMBER)
    member = Principal("ann", {"team-a": Role.MEMBER})
    assert member.can("team-a", Role.VIEWER) and not member.can("team-a", Role.ADMIN)
    assert not member.can("team-b", Role.VIEWER)
    operator = Principal("ops", cluster_admin=True)
    assert operator.can("anything", Role.ADMIN)


def test_placement_round_trips_through_json() -> None:
    slots = (Slot("n1", 4, 1, 2.0, 8.0), Slot("n2", 4))
    placement = Placement(slots, DomainLevel.POD, "pod-0", {"a": 0.5})
    data = placement_to_json(placement)
    assert data["slots"] == [["n1", 4, 1, 2.0, 8.0], ["n2", 4, 0, 0.0, 0.0]]
    assert placement_from_json(data) == placement


def test_a_placement_stored_before_cpus_and_memory_were_placed_reads_as_holding_none() -> None:
    stored = {"level": "node", "domain": "n1", "slots": [["n1", 4, 0]]}
    assert placement_from_json(stored).slots == (Slot("n1", 4, 0, 0.0, 0.0),)


def test_token_activity_follows_revocation_and_expiry() -> None:
    token = TokenInfo("abc", "ann", created_at=0.0, expires_at=10.0)
    assert token.active(5.0) and not token.active(10.0)
    assert not TokenInfo("abc", "ann", created_at=0.0, revoked_at=1.0).active(0.5)


def test_state_dirs_and_urls(tmp_path: Path) -> None:
    url, state_dir = resolve_url(tmp_path / "state")
    assert state_dir == tmp_path / "state" and state_dir.is_dir()
    assert url.database == str(tmp_path / "state" / DB_FILE)
    pg, none = resolve_url("postgresql://u:secret@db:5432/aic")
    assert pg.drivername == "postgresql+psycopg" and none is None
    with pytest.raises(ValueError, match="unsupported"):
        resolve_url("oracle://x/y")
