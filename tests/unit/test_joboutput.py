"""The reader of job output (aicluster.runtime.joboutput) against what a hostile job can plant:
links, FIFOs, devices, sockets, giant lines, records of every wrong shape. Real files, real
FIFOs and sockets; Hypothesis fuzzes each parser (500 examples in the suite, 2,000 under
``make fuzz``: ``tests/fuzzing.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import string
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aicluster.core.numbers import ascii_int
from aicluster.runtime import RunDir
from aicluster.runtime.joboutput import (
    ExitRecord,
    LineReader,
    Refused,
    Rejects,
    copy_tree,
    parse_exit_record,
    parse_telemetry_line,
    read_bytes,
    read_json,
    read_telemetry,
)
from aicluster.train.export import check_artifact
from fuzzing import examples

FUZZ = settings(max_examples=examples(500), deadline=None, suppress_health_check=list(HealthCheck))


def _step(**fields: object) -> bytes:
    record = {"kind": "step", "rank": 0, "time": 1.0, "step": 1, **fields}
    return json.dumps(record).encode()


# -- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["²", "١", "0x1", "-1", "", " 1", "1" * 19, "१२"])
def test_names_that_are_not_ascii_digits_are_no_number(text: str) -> None:
    assert ascii_int(text) is None


def test_attempt_folders_with_unicode_digits_are_skipped(tmp_path: Path) -> None:
    job = tmp_path / "runs" / "j1"
    for name in ("1", "²", "١", "0002", "x"):
        (job / name).mkdir(parents=True)
    assert RunDir.attempts(tmp_path, "j1") == [1, 2]


# -- opening --------------------------------------------------------------------------------------


def test_a_regular_file_is_read_within_its_cap(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 100)
    assert read_bytes(tmp_path, "a", 10, 20) == b"x" * 20
    assert read_bytes(tmp_path, "missing") == b""


def test_a_link_is_refused_anywhere_below_the_trusted_directory(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("the admin token")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rank-0.log").symlink_to(secret)
    with pytest.raises(Refused):
        read_bytes(tmp_path / "run", "rank-0.log")
    (tmp_path / "run" / "sub").symlink_to(tmp_path)
    with pytest.raises(Refused):
        read_bytes(tmp_path / "run", "sub/secret")


def test_the_trusted_directory_itself_may_be_roots_link(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f").write_text("ok")
    (tmp_path / "link").symlink_to(tmp_path / "data")
    assert read_bytes(tmp_path / "link", "f") == b"ok"


def test_a_path_out_of_the_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Refused):
        read_bytes(tmp_path, "../etc/passwd")
    with pytest.raises(Refused):
        read_bytes(tmp_path, "/etc/passwd")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    done = threading.Event()

    def read() -> None:
        with pytest.raises(Refused):
            read_bytes(tmp_path, "fifo")
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5), "reading a FIFO blocked"


def test_a_socket_a_device_and_a_directory_are_refused(tmp_path: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    (tmp_path / "dir").mkdir()
    try:
        for name in ("sock", "dir"):
            with pytest.raises(Refused):
                read_bytes(tmp_path, name)
    finally:
        server.close()
    with pytest.raises(Refused):
        read_bytes(Path("/dev"), "zero")


def test_a_file_deleted_while_read_is_read_to_its_end(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(_step() + b"\n" + _step(step=2) + b"\n")
    reader = LineReader(tmp_path, "t.jsonl")
    rejects = Rejects()
    assert len(read_telemetry(reader, 0, rejects)) == 2
    path.unlink()
    assert read_telemetry(reader, 0, rejects) == []
    assert not rejects
    path.write_bytes(_step(step=3) + b"\n")  # a new, shorter file: read from its start
    assert [r.step for r in read_telemetry(reader, 0, rejects)] == [3]
    assert rejects.counts == {"t.jsonl: the file shrank": 1}


# -- records --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"[1]", "not a JSON object"),
        (b"null", "not a JSON object"),
        (b"\xff\xfe{}", "invalid UTF-8"),
        (b"{", "invalid JSON"),
        (b"[" * 100_000, "invalid JSON"),
        (_step(time=None), "time"),
        (_step(time="1"), "time"),
        (_step(step=True), "step"),
        (_step(step=-1), "step"),
        (_step(step=10**40), "step"),
        (_step(loss=float("nan")), "loss"),
        (_step(metrics=[1]), "metrics"),
        (_step(metrics={"a": "b"}), "metrics"),
        (_step(kind=""), "kind"),
    ],
)
def test_bad_telemetry_records_are_dropped_with_a_reason(line: bytes, why: str) -> None:
    record, reason = parse_telemetry_line(line, 0)
    assert record is None
    assert why in reason


def test_a_record_keeps_the_rank_of_its_file_not_the_one_it_claims() -> None:
    record, _ = parse_telemetry_line(_step(rank=7, metrics={"compute_time": 0.5}), 2)
    assert record is not None and record.rank == 2 and record.metrics == {"compute_time": 0.5}


def test_every_bad_line_is_counted_and_the_reader_moves_past_it(tmp_path: Path) -> None:
    lines = [b"[1]", _step(time=None), b"\xff", _step(step=2), b"x" * 70_000, _step(step=3)]
    (tmp_path / "t.jsonl").write_bytes(b"\n".join(lines) + b"\n" + _step(step=4)[:10])
    reader, rejects = LineReader(tmp_path, "t.jsonl"), Rejects()
    records = read_telemetry(reader, 0, rejects)
    assert [r.step for r in records] == [2, 3]
    assert sum(rejects.counts.values()) == 4
    assert read_telemetry(reader, 0, rejects) == []  # the partial last line waits


def test_a_giant_line_without_end_is_skipped_in_bounded_reads(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"y" * (3 * 65536))
    reader, rejects = LineReader(tmp_path, "t.jsonl", max_poll=65536 * 2), Rejects()
    assert read_telemetry(reader, 0, rejects) == []
    with path.open("ab") as handle:
        handle.write(b"y" * 1000 + b"\n" + _step(step=9) + b"\n")
    records = []
    for _ in range(4):
        records += read_telemetry(reader, 0, rejects)
    assert [r.step for r in records] == [9]
    assert sum(rejects.counts.values()) == 1


def test_exit_records_are_validated(tmp_path: Path) -> None:
    (tmp_path / "ok.json").write_text(json.dumps({"rank": 0, "exit_code": 3, "stopped": False}))
    (tmp_path / "bad.json").write_text(json.dumps({"exit_code": "0"}))
    (tmp_path / "list.json").write_text("[0]")
    rejects = Rejects()
    record = read_json(tmp_path, "ok.json", ExitRecord, rejects)
    assert record is not None and record.exit_code == 3
    assert read_json(tmp_path, "bad.json", ExitRecord, rejects) is None
    assert read_json(tmp_path, "list.json", ExitRecord, rejects) is None
    assert sum(rejects.counts.values()) == 2


# -- trees ----------------------------------------------------------------------------------------


def test_a_tree_is_copied_and_a_planted_link_or_fifo_refuses_it(tmp_path: Path) -> None:
    export = tmp_path / "data" / "export"
    (export / "code").mkdir(parents=True)
    (export / "model.json").write_text("{}")
    (export / "code" / "m.py").write_text("pass")
    copy_tree(tmp_path / "data", "export", tmp_path / "copy")
    assert (tmp_path / "copy" / "code" / "m.py").read_text() == "pass"
    (export / "code" / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(Refused):
        copy_tree(tmp_path / "data", "export", tmp_path / "copy2")
    assert not (tmp_path / "copy2").exists()
    (export / "code" / "passwd").unlink()
    os.mkfifo(export / "fifo")
    with pytest.raises(Refused):
        copy_tree(tmp_path / "data", "export", tmp_path / "copy3")


def test_a_tree_over_its_caps_is_refused(tmp_path: Path) -> None:
    (tmp_path / "export").mkdir()
    for index in range(5):
        (tmp_path / "export" / f"f{index}").write_bytes(b"z" * 100)
    with pytest.raises(Refused):
        copy_tree(tmp_path, "export", tmp_path / "a", max_files=3)
    with pytest.raises(Refused):
        copy_tree(tmp_path, "export", tmp_path / "b", max_bytes=250)


# -- fuzzing --------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
FIELDS = "kind rank time step loss step_time samples throughput node attempt metrics exit_code"
field_names = st.sampled_from([*FIELDS.split(), "stopped", "lost", "finished_at", "reason"])
records = st.dictionaries(field_names, json_values, max_size=8)
raw_lines = st.one_of(
    st.binary(max_size=200),
    records.map(lambda r: json.dumps(r).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
)


@FUZZ
@given(raw_lines, st.integers(min_value=0, max_value=64))
def test_fuzz_telemetry_lines_never_raise(raw: bytes, rank: int) -> None:
    record, why = parse_telemetry_line(raw, rank)
    assert (record is None) == bool(why)
    if record is not None:
        assert record.rank == rank and isinstance(record.time, float)


@FUZZ
@given(raw_lines)
def test_fuzz_exit_records_never_raise(raw: bytes) -> None:
    record, why = parse_exit_record(raw)
    assert (record is None) == bool(why)
    if record is not None:
        assert record.exit_code is None or isinstance(record.exit_code, int)


@FUZZ
@given(st.lists(raw_lines, max_size=8), st.integers(min_value=1, max_value=300))
def test_fuzz_a_telemetry_file_gives_one_count_per_bad_line(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], max_line: int
) -> None:
    folder = tmp_path_factory.mktemp("t")
    lines = [line.replace(b"\n", b" ") for line in lines]
    (folder / "t.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    reader, rejects = LineReader(folder, "t.jsonl", max_line=max_line), Rejects()
    records = read_telemetry(reader, 0, rejects)
    nonblank = sum(1 for line in lines if line.strip())
    assert len(records) + sum(rejects.counts.values()) == nonblank
    assert reader.offset == (folder / "t.jsonl").stat().st_size


@FUZZ
@given(st.text(alphabet=string.digits + "²١٣ -x", max_size=20))
def test_fuzz_ascii_int(text: str) -> None:
    number = ascii_int(text)
    assert number is None or (str(number) == text.lstrip("0") or number == 0)


entries = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d/e", "d/f", "g/h/i"]),
        st.sampled_from(["file", "dir", "link", "fifo", "deeplink"]),
        st.binary(max_size=64),
    ),
    max_size=6,
)


@FUZZ
@given(entries)
def test_fuzz_an_export_tree_is_copied_exactly_or_refused(
    tmp_path_factory: pytest.TempPathFactory, planted: list[tuple[str, str, bytes]]
) -> None:
    root = tmp_path_factory.mktemp("tree")
    export = root / "export"
    export.mkdir()
    for name, kind, data in planted:
        path = export / name
        if path.exists() or path.is_symlink():
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            continue
        if kind == "file":
            path.write_bytes(data)
        elif kind == "dir":
            path.mkdir()
        elif kind == "link":
            path.symlink_to("/etc/passwd")
        elif kind == "deeplink":
            path.symlink_to(root)
        else:
            os.mkfifo(path)
    target = root / "copy"
    try:
        copy_tree(root, "export", target)
    except Refused:
        assert not target.exists()
        return
    copied = sorted(p.relative_to(target) for p in target.rglob("*"))
    assert copied == sorted(p.relative_to(export) for p in export.rglob("*"))
    for path in target.rglob("*"):
        if path.is_file():
            assert path.read_bytes() == (export / path.relative_to(target)).read_bytes()


@FUZZ
@given(st.one_of(json_values, records).map(json.dumps) | st.binary(max_size=100))
def test_fuzz_an_exported_model_json_is_valid_or_a_value_error(
    tmp_path_factory: pytest.TempPathFactory, meta: str | bytes
) -> None:
    folder = tmp_path_factory.mktemp("model")
    target = folder / "model.json"
    target.write_bytes(meta if isinstance(meta, bytes) else meta.encode())
    with contextlib.suppress(ValueError):  # the only error a bad model.json may raise
        check_artifact(folder)
