"""A state directory and its database are the control plane's alone: 0700 and 0600, made so
and narrowed so (a demo's state directory was 0755, its database 0644)."""

from __future__ import annotations

import stat
from pathlib import Path

from aicluster.core import Tenant
from aicluster.store import Store
from aicluster.store.engine import DB_FILE


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_state_directory_and_its_database_are_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Store.open(state) as store:
        store.create_tenant(Tenant("a"), "test")  # a write: SQLite's journal files exist now
        journals = [p for p in state.iterdir() if p.name.startswith(DB_FILE)]
        assert (mode(state), mode(state / DB_FILE)) == (0o700, 0o600)
        assert len(journals) > 1 and all(mode(p) == 0o600 for p in journals), journals


def test_an_existing_open_state_directory_is_narrowed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    (state / DB_FILE).touch(mode=0o644)
    (state / DB_FILE).chmod(0o644)
    Store.open(state).close()
    assert (mode(state), mode(state / DB_FILE)) == (0o700, 0o600)
