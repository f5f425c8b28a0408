"""A state directory and its database are the control plane's alone: 0700 and 0600, made so
and narrowed so (a demo's state directory was 0755, its database 0644)."""

from __future__ import annotations

import stat
from pathlib import Path

from aicluster.artifacts.private import open_private, private_dir, write_private
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


def test_a_sqlite_url_database_file_is_private(tmp_path: Path) -> None:
    Store.open(f"sqlite:///{tmp_path / 'elsewhere.db'}").close()
    assert mode(tmp_path / "elsewhere.db") == 0o600


def test_logs_and_records_are_written_private(tmp_path: Path) -> None:
    """What ``up`` and the server write beside the database: ``server.log`` and Ray's log
    (appended to), ``server.json``, ``admin.token`` (replaced)."""
    state = private_dir(tmp_path / "home")
    private_dir(state / "logs")
    old_log = state / "server.log"
    old_log.write_text("from an older version\n")
    old_log.chmod(0o644)
    with open_private(old_log) as log, open_private(state / "logs" / "ray.log") as new:
        log.write(b"more\n")
        new.write(b"new\n")
    write_private(state / "server.json", "{}")
    write_private(state / "server.json", '{"pid": 1}')  # replaced, still private
    assert old_log.read_text() == "from an older version\nmore\n"
    assert (state / "server.json").read_text() == '{"pid": 1}'
    files = [old_log, state / "logs" / "ray.log", state / "server.json"]
    assert [mode(path) for path in files] == [0o600] * 3
    assert (mode(state), mode(state / "logs")) == (0o700, 0o700)
    assert sorted(p.name for p in state.iterdir()) == ["logs", "server.json", "server.log"]
