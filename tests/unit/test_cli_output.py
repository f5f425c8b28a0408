"""The CLI's listings (``aicluster.cli.output``): at 80 columns and in pipes no id, name or state
is cut or folded, other columns fold or go (never a ``…``), ``-o wide`` adds its columns, and
``-o json`` / ``-o yaml`` print the records whole."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml
from rich.console import Console

from aicluster.cli.output import (
    UNBOUNDED,
    Column,
    Output,
    fit_table,
    print_data,
    print_records,
    print_table,
    stdout_console,
)

LONG_ID = "j-0192a3b4c5d6e7f8a9b"  # as the store makes them: 21 characters
REASON = (
    "waits for 32 H100 on one rack: tenant vision is at its quota of 64 and may "
    "borrow none; 3 jobs of higher priority are ahead of it"
)
RECORDS: list[dict[str, Any]] = [
    {"id": LONG_ID, "name": "llama-finetune", "tenant": "vision",
     "state": "SUCCEEDED", "gpus": 32, "note": REASON, "by": "alice@example.com"},
    {"id": "j-2", "name": "x", "tenant": "a", "state": "CANCELLED", "gpus": 1, "note": "",
     "by": "bob"},
    {"id": "j-3", "name": "ünïcode-名前", "tenant": "a", "state": "PENDING", "gpus": 8,
     "note": "line one\nline two", "by": "carol"},
]  # fmt: skip
COLUMNS = (
    Column("id", lambda r: r["id"], whole=True),
    Column("name", lambda r: r["name"], whole=True),
    Column("tenant", lambda r: r["tenant"], whole=True),
    Column("state", lambda r: r["state"], whole=True),
    Column("GPUs", lambda r: str(r["gpus"]), whole=True, priority=2, justify="right"),
    Column("submitted", lambda r: "12:34:56", whole=True, priority=3),
    Column("reason / exit", lambda r: r["note"], priority=1, floor=16),
    Column("by", lambda r: r["by"], whole=True, wide=True),
)
WHOLE = [LONG_ID, "llama-finetune", "vision", "SUCCEEDED", "CANCELLED",
         "ünïcode-名前", "PENDING"]  # fmt: skip


def render(width: int, *, wide: bool = False, records: list[dict[str, Any]] = RECORDS) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    print_table(fit_table(COLUMNS, records, width, wide=wide), console)
    return console.file.getvalue()  # type: ignore[attr-defined,no-any-return]


def test_at_80_columns_ids_names_and_states_are_whole_and_lines_fit() -> None:
    text = render(80)
    lines = text.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), text
    for word in WHOLE:  # each on one line, uncut
        assert any(word in line for line in lines), (word, text)
    assert "…" not in text and "..." not in text
    assert "reason" in lines[0]  # it folds before it goes
    folded = " ".join(" ".join(lines).split())
    assert "quota of 64 and may borrow none" in folded  # folded, not cut
    assert "line one line two" in folded  # a cell's line break as a space
    assert "submitted" not in text and "GPUs" in text  # the least important went first
    assert "by" not in lines[0].split()  # a wide column


def test_narrower_terminals_drop_columns_but_never_a_whole_one() -> None:
    for width in (60, 40, 20):
        text = render(width)
        for word in WHOLE:
            assert any(word in line for line in text.splitlines()), (width, word, text)
        assert "…" not in text
    assert "reason" not in render(60)  # too narrow to fold it into 16 columns: it goes
    # Narrower than the whole columns: printed wider (the terminal wraps it), nothing cut.
    assert render(40).splitlines()[1].split() == [LONG_ID, "llama-finetune", "vision", "SUCCEEDED"]
    assert fit_table(COLUMNS, RECORDS, 40)[1] == 21 + 14 + 6 + 9 + 3 * 2


def test_a_wide_terminal_shows_every_column_on_one_line_each() -> None:
    text = render(250)
    lines = text.splitlines()
    assert len(lines) == 1 + len(RECORDS)
    assert lines[0].split() == ["id", "name", "tenant", "state", "GPUs", "submitted", "reason",
                                "/", "exit"]  # fmt: skip
    assert REASON in lines[1]


def test_wide_adds_its_columns_and_drops_none() -> None:
    text = render(80, wide=True)
    for word in (*WHOLE, "GPUs", "submitted", "alice@example.com"):
        assert word in text, word
    assert "…" not in text
    # Wider than the terminal even folded: a row a line, as kubectl's -o wide.
    assert len(text.splitlines()) == 1 + len(RECORDS) and REASON in text
    folded = render(200, wide=True)  # fits when folded: folded
    assert all(len(line.rstrip()) <= 200 for line in folded.splitlines())
    assert "alice@example.com" in folded and REASON not in folded


def test_no_rows_still_print_the_header() -> None:
    assert render(80, records=[]).split() == ["id", "name", "tenant", "state", "GPUs",
                                              "submitted", "reason", "/", "exit"]  # fmt: skip


def test_markup_in_a_cell_is_text() -> None:
    records = [{**RECORDS[1], "note": "[bold red]not markup[/] [link=x]y[/link]"}]
    assert "[bold red]not markup[/] [link=x]y[/link]" in render(200, records=records)


def test_json_and_yaml_round_trip(capsys: pytest.CaptureFixture[str]) -> None:
    page = {"jobs": RECORDS, "next_cursor": None, "ratio": 0.25, "markup": "[bold]x[/]"}
    assert print_data(Output.json, page)
    assert json.loads(capsys.readouterr().out) == page
    assert print_data(Output.yaml, page)
    assert yaml.safe_load(capsys.readouterr().out) == page
    assert not print_data(Output.table, page) and not print_data(Output.wide, page)
    assert capsys.readouterr().out == ""


def test_print_records_in_a_pipe(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Captured stdout is a pipe: unbounded without COLUMNS (a row a line), COLUMNS else."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert stdout_console().width == UNBOUNDED
    print_records(Output.table, COLUMNS, RECORDS)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(RECORDS) and REASON in lines[1]
    monkeypatch.setenv("COLUMNS", "80")
    assert stdout_console().width == 80
    print_records(Output.table, COLUMNS, RECORDS)
    text = capsys.readouterr().out
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines()), text
    assert all(word in text for word in WHOLE)
    print_records(Output.json, COLUMNS, RECORDS, data={"jobs": RECORDS})
    assert json.loads(capsys.readouterr().out) == {"jobs": RECORDS}
    print_records(Output.table, COLUMNS, [], empty="no jobs")
    assert capsys.readouterr().out == "no jobs\n"
    print_records(Output.yaml, COLUMNS, [], empty="no jobs")
    assert yaml.safe_load(capsys.readouterr().out) == []


def test_an_error_at_80_columns_keeps_its_path_and_field_on_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aicluster.cli import common

    path = "/tmp/pytest-of-root/pytest-0/popen-gw1/test_the_cli_applies_and_shows0/bad.yaml:2"
    err = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=err, width=80))
    common.fail(f"{path}: health.straggler_factor: Input should be greater than 1", 2)
    assert f"{path}: health.straggler_factor" in err.getvalue()
