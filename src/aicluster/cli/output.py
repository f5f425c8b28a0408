"""What the listing commands print: ``-o table|wide|json|yaml``, as kubectl does.

``table`` (the default) fits the terminal: ids, names and states are shown whole (never cut,
never folded); other columns fold (no ``…`` anywhere), and when even that does not fit, the
less important ones go. ``wide`` adds the extra columns and drops none. ``json`` and ``yaml``
print the records the API returned, whole, machine-readable, without Rich markup.

The width is the terminal's (``COLUMNS`` overrides it, as Rich does). In a pipe it is
``COLUMNS`` when set, else unbounded: one line per row, for ``grep`` and ``awk``.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

import typer
import yaml
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = [
    "Column",
    "Output",
    "OutputOption",
    "fit_table",
    "print_data",
    "print_records",
    "print_table",
    "print_wrapped",
    "stdout_console",
]

#: A pipe's width when ``COLUMNS`` is not set: no row is wrapped.
UNBOUNDED = 100_000
#: Between two columns.
GAP = 2


class Output(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


OutputOption = Annotated[
    Output,
    typer.Option(
        "--output",
        "-o",
        case_sensitive=False,
        help="table (fits the terminal), wide (more columns), json or yaml (the API's records)",
    ),
]


@dataclass(frozen=True)
class Column:
    """One column of a listing: its header and how a record's cell reads.

    ``whole`` cells are never broken: ids, names, states, numbers, addresses. The others fold
    (at spaces, else anywhere) down to ``floor`` characters. ``priority`` 0 is never dropped;
    when the width is short, the highest priority goes first (the rightmost of equals).
    ``wide`` columns are shown only with ``-o wide``."""

    header: str
    cell: Callable[[Any], str]
    whole: bool = False
    priority: int = 0
    wide: bool = False
    justify: Literal["left", "right"] = "left"
    floor: int = 12


def stdout_console() -> Console:
    """A console on stdout, sized now (not when the module was imported): a terminal's width
    (``COLUMNS`` first); in a pipe ``COLUMNS`` if set, else unbounded."""
    console = Console()
    if console.is_terminal:
        return console
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else UNBOUNDED
    return Console(width=width)


def print_wrapped(
    text: str, indent: int | str = 2, hanging: int | None = None, console: Console | None = None
) -> None:
    """Print ``text`` as plain text (no markup) wrapped at spaces to the console's width, its
    first line after ``indent`` (spaces, or a prefix), the next ones indented ``hanging`` spaces
    (default: as far as the first): no line goes back to column 0. A word longer than a line
    (a path, a URL) is never broken: it takes a line of its own, which the terminal wraps."""
    console = console or stdout_console()
    first = indent if isinstance(indent, str) else " " * indent
    rest = " " * (len(first) if hanging is None else hanging)
    wrapper = textwrap.TextWrapper(
        width=max(console.width, len(rest) + 20),
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    )
    lines = wrapper.wrap(text) or [first.rstrip()]
    for line in lines:  # soft_wrap: Rich adds no line break (and cuts nothing) of its own
        console.print(line, soft_wrap=True, markup=False, highlight=False, emoji=False)


def print_data(output: Output, data: Any) -> bool:
    """Print ``data`` as JSON or YAML if ``output`` asks for it; whether it did."""
    if output is Output.json:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
    elif output is Output.yaml:
        typer.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), nl=False)
    else:
        return False
    return True


def print_records(
    output: Output,
    columns: Sequence[Column],
    records: Sequence[Any],
    *,
    data: Any = None,
    empty: str | None = None,
    title: str | None = None,
) -> None:
    """A listing: ``data`` (default: ``records``) as JSON or YAML, else ``records`` as a table
    of ``columns`` (``empty`` instead when there are none, if given)."""
    if print_data(output, records if data is None else data):
        return
    console = stdout_console()
    if not records and empty is not None:
        console.print(empty, highlight=False)
        return
    print_table(fit_table(columns, records, console.width, wide=output is Output.wide, title=title))


def print_table(fitted: tuple[Table, int], console: Console | None = None) -> None:
    """Print a table from :func:`fit_table`; wider than the console only when its whole
    columns alone are (the terminal then wraps its lines: nothing is cut)."""
    table, width = fitted
    console = console or stdout_console()
    if width > console.width:
        console = Console(
            file=console.file,
            width=width,
            force_terminal=console.is_terminal,
            color_system=console.color_system,  # type: ignore[arg-type]
        )
    console.print(table)


def fit_table(
    columns: Sequence[Column],
    records: Sequence[Any],
    width: int,
    *,
    wide: bool = False,
    title: str | None = None,
) -> tuple[Table, int]:
    """A table of ``records`` that fits ``width`` with no cell cut, and the width it takes:
    more than ``width`` only when the columns it may not drop (all of them with ``wide``) are
    wider even folded, and then nothing is folded (one line a row)."""
    shown = [column for column in columns if wide or not column.wide]
    rows = [[_clean(column.cell(record)) for column in shown] for record in records]
    least = [_least(column, [row[i] for row in rows]) for i, column in enumerate(shown)]
    widths = [
        max([cell_len(column.header), *(cell_len(row[i]) for row in rows)])
        for i, column in enumerate(shown)
    ]
    keep = list(range(len(shown)))

    def total(sizes: Sequence[int]) -> int:
        return sum(sizes[i] for i in keep) + GAP * (len(keep) - 1)

    while not wide and total(least) > width:
        droppable = [i for i in keep if shown[i].priority > 0]
        if not droppable:
            break
        keep.remove(max(droppable, key=lambda i: (shown[i].priority, i)))
    # Fold the widest foldable column by one, down to its least, until the table fits; a wide
    # table that cannot fit is printed unfolded (the terminal wraps its lines, as kubectl's).
    while total(widths) > width and total(least) <= width:
        foldable = [i for i in keep if widths[i] > least[i]]
        if not foldable:
            break
        widths[max(foldable, key=lambda i: (widths[i], i))] -= 1
    table = Table(
        box=None,
        pad_edge=False,
        padding=(0, GAP // 2),
        header_style="bold",
        title=title,
    )
    for i in keep:
        column = shown[i]
        table.add_column(
            column.header,
            justify=column.justify,
            no_wrap=column.whole,
            overflow="fold",
            width=widths[i],
        )
    for row in rows:
        table.add_row(*(Text(row[i]) for i in keep))
    return table, max(width, total(widths))


def _clean(text: str) -> str:
    """One line: a cell's line breaks and tabs as spaces."""
    return " ".join(text.split()) if any(c in text for c in "\n\r\t") else text


def _least(column: Column, cells: Sequence[str]) -> int:
    """The narrowest ``column`` may be: a whole column its widest cell (and its header); a
    folding one ``floor`` (or less if all fits in less), never below its longest header word."""
    header = max((cell_len(word) for word in column.header.split()), default=0)
    widest = max((cell_len(cell) for cell in cells), default=0)
    if column.whole:
        return max(widest, cell_len(column.header))
    return max(header, min(column.floor, max(widest, cell_len(column.header))))
