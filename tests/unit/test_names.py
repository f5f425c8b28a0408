"""Names across tenants: the system names made from tenants' and models' names are injective
(``aicluster.core.names``), whatever the spelling, and every place that makes one uses them."""

from __future__ import annotations

import hashlib
import re
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aicluster.artifacts import code_store, pack_tree
from aicluster.core import names
from aicluster.runtime.rundir import tenant_dir
from aicluster.runtime.warm.starter import socket_name
from aicluster.serve import app_name

#: Names that met before (``-``, ``_`` and ``.`` folded; case; the old ``--`` separator) and the
#: characters the encoding itself uses.
SPELLINGS = ["a-b", "a_b", "a.b", "A-b", "A_B", "a-B", "a--b", "a__b", "a~5fb", "a~2eb", "é", "e"]
#: Builds names likely to meet under a lossy scheme: few letters, every kind of separator, case,
#: the escape character and hex digits, non-ASCII (NFC and NFD "é"), NUL, "/", a lone surrogate.
PIECES = ["a", "b", "A", "B", "-", "_", ".", "~", "5f", "2e", "--", "v1", "é", "e\u0301", "\x00"]
PIECES += ["/", "\ud800"]
EXAMPLES = 2000


def confusable(max_pieces: int = 8) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(PIECES), max_size=max_pieces).map("".join)


#: Mostly confusable names, some arbitrary unicode (surrogates included), some long enough to be
#: shortened with a hash (over PART_LIMIT once encoded).
NAME = st.one_of(
    confusable(),
    st.text(st.characters(codec=None), max_size=40),
    st.builds(lambda head, n: head + "x" * n, confusable(4), st.integers(100, 300)),
)


def _old_app_name(tenant: str, name: str, version: int) -> str:
    """The lossy scheme this replaced, to show the spellings above did meet."""
    clean = [re.sub(r"[^A-Za-z0-9_.]", "_", p) for p in (tenant, name)]
    return f"aic-{clean[0]}--{clean[1]}-v{version}"


def test_the_spellings_that_met_now_stay_apart(tmp_path: Path) -> None:
    assert _old_app_name("a-b", "m", 1) == _old_app_name("a_b", "m", 1)  # the bug
    apps = {app_name(t, "m", 1) for t in SPELLINGS}
    dirs = {tenant_dir(tmp_path, t) for t in SPELLINGS}
    parts = {names.part(t) for t in SPELLINGS}
    assert len(apps) == len(dirs) == len(parts) == len(SPELLINGS)
    assert app_name("team-a", "tiny-gpt", 1) == "aic-team-a.tiny-gpt.v1"  # plain names read as is
    assert app_name("a_b", "m", 2) == "aic-a~5fb.m.v2"
    assert names.encode("A-b") == "~41-b" and names.encode("é") == "~c3~a9"
    assert names.encode("") == "~" and names.decode("~") == ""


@settings(max_examples=EXAMPLES, deadline=None)
@given(NAME)
def test_encoding_reads_back_and_uses_safe_characters(name: str) -> None:
    encoded = names.encode(name)
    assert names.decode(encoded) == name
    assert re.fullmatch(r"[a-z0-9~-]+", encoded) and "~~" not in encoded
    bounded = names.part(name)
    assert len(bounded) <= names.PART_LIMIT and re.fullmatch(r"[a-z0-9~-]+", bounded)
    assert (bounded == encoded) == (len(encoded) <= names.PART_LIMIT)
    if bounded != encoded:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        assert bounded.endswith("~~" + digest) and encoded.startswith(bounded[:-34])
        with pytest.raises(ValueError):
            names.decode(bounded)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(NAME, NAME, st.integers(1, 12)), min_size=2, max_size=24))
def test_distinct_tenant_names_never_share_a_system_name(
    entries: list[tuple[str, str, int]],
) -> None:
    """Every pair of distinct (tenant, name, version) in a batch: distinct Serve applications,
    distinct registry directories, distinct tenant folders and warm-process names."""
    distinct = set(entries)
    assert len({app_name(t, n, v) for t, n, v in distinct}) == len(distinct)
    pairs = {(t, n) for t, n, _ in distinct}
    assert len({names.join(t, n) for t, n in pairs}) == len(pairs)
    assert len({(names.part(t), names.part(n)) for t, n in pairs}) == len(pairs)
    tenants = {t for t, _, _ in distinct}
    assert len({names.part(t) for t in tenants}) == len(tenants)
    node = "f" * 56
    scopes = ("/srv/a/state/warm", "/srv/b/state/warm")
    sockets = {socket_name(node, t, scope) for t in tenants if t for scope in scopes}
    assert len(sockets) == 2 * len({t for t in tenants if t})
    assert all(len(s.encode()) <= 107 for s in sockets)


@settings(max_examples=EXAMPLES, deadline=None)
@given(NAME, NAME, st.integers(1, 9), st.integers(1, 9))
def test_an_application_name_splits_back_into_its_names(
    tenant: str, name: str, version: int, other: int
) -> None:
    app = app_name(tenant, name, version)
    assert app.startswith("aic-") and app.endswith(f".v{version}")
    first, second, tail = app.removeprefix("aic-").split(".")
    assert (first, second, tail) == (names.part(tenant), names.part(name), f"v{version}")
    assert (app == app_name(tenant, name, other)) == (version == other)


def test_a_shortened_part_keeps_whole_escapes_and_refuses_small_limits() -> None:
    for limit in range(names.HASHED_LENGTH, 60):
        shortened = names.part("é" * 40, limit)
        assert len(shortened) <= limit
        assert re.fullmatch(r"(~[0-9a-f]{2})*~~[0-9a-f]{32}", shortened), shortened
    with pytest.raises(ValueError):
        names.part("x" * 100, names.HASHED_LENGTH - 1)
    for bad in ("", "~61", "A", "a.b", "~5", "~~", "~zz", "~ff"):
        with pytest.raises(ValueError):
            names.decode(bad)


def test_legacy_folders_stay_their_tenants_own(tmp_path: Path) -> None:
    """Folders made under the raw names before the encoding keep being used by their tenant,
    and never by another one."""
    parent = tmp_path / "tenants"
    for legacy in ("a_b", "A.b", "plain-a"):
        (parent / legacy).mkdir(parents=True)
    (parent / "linked_b").symlink_to(parent / "a_b")
    assert names.tenant_folder(parent, "a_b") == parent / "a_b"
    assert names.tenant_folder(parent, "A.b") == parent / "A.b"
    assert names.tenant_folder(parent, "plain-a") == parent / "plain-a"
    assert names.tenant_folder(parent, "a.b") == parent / "a~2eb"  # no legacy folder: encoded
    assert names.tenant_folder(parent, "a-b") == parent / "a-b"
    assert names.tenant_folder(parent, "linked_b") == parent / "linked~5fb"  # a link: not kept
    tenants = {*SPELLINGS, "plain-a", "linked_b", "a_b_", "A.B", "a~2db"}
    folders = [names.tenant_folder(parent, t) for t in tenants]
    assert len(set(folders)) == len(tenants)


def test_the_code_store_keeps_confusable_tenants_apart(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    store = code_store(tmp_path / "state")
    with pack_tree(tmp_path / "code") as packed:
        archive = packed.path.read_bytes()
    stored = store.put("a-b", [archive], max_bytes=10**9, tenant_quota_bytes=10**9)
    for other in ("a_b", "a.b", "A-b"):
        assert not store.has(other, stored.sha256) and store.usage(other) == 0
    assert store.has("a-b", stored.sha256)
    root = tmp_path / "state" / "artifacts" / "code"
    assert sorted(p.name for p in root.iterdir()) == ["a-b"]


def test_a_long_tenant_name_still_makes_a_warm_socket() -> None:
    node = "0123456789abcdef" * 3 + "01234567"  # a Ray node id: 56 hex digits
    long_a, long_b = "t" * 62 + "a", "t" * 62 + "b"
    name_a, name_b = socket_name(node, long_a), socket_name(node, long_b)
    assert name_a != name_b
    assert f"/{node}/team-a." in socket_name(node, "team-a", "/state/warm")
    # The same tenant's warm processes of two state directories (two clusters on one Ray, as
    # the tests run them) are two processes: each mounts its own state directory's tenant.
    assert socket_name(node, "team-a", "/a/warm") != socket_name(node, "team-a", "/b/warm")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind("\0" + name_a)  # OSError when the name is too long
