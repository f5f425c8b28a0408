"""Shared CLI plumbing: the API client from options, readable errors, Rich output."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import typer
from rich.console import Console

from aicluster.artifacts.codetree import CodeTreeError
from aicluster.cli.client import ApiError, Client, default_home, resolve_target
from aicluster.cli.output import stdout_console
from aicluster.core import ConfigError

__all__ = [
    "CaOption",
    "Client",
    "HomeOption",
    "TokenOption",
    "UrlOption",
    "api_command",
    "client_for",
    "console",
    "estimated",
    "fail",
    "readable",
    "when",
]


class _Stdout:
    """``console.print(...)`` on a console sized as it prints (:func:`stdout_console`): the
    width a terminal has then, or a pipe's; not the one ``COLUMNS`` had at import."""

    def __getattr__(self, name: str) -> Any:
        return getattr(stdout_console(), name)


console = cast(Console, _Stdout())
err_console = Console(stderr=True)

HomeOption = Annotated[
    Path,
    typer.Option("--home", envvar="AICLUSTER_HOME", help="state directory of `aicluster up`"),
]
UrlOption = Annotated[str | None, typer.Option("--url", help="API server URL")]
TokenOption = Annotated[str | None, typer.Option("--token", help="bearer token")]
CaOption = Annotated[
    Path | None,
    typer.Option(
        "--ca",
        envvar="AICLUSTER_CA",
        help="PEM file of the CA that signed the server's HTTPS certificate "
        "(default: the one `aicluster up --ca` recorded, else the system's CAs)",
    ),
]

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 1) -> typer.Exit:
    # soft_wrap: the terminal wraps a long error, Rich inserts no newline into a path or a field.
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def readable() -> Iterator[None]:
    """Turn expected errors into one line on stderr and a non-zero exit, never a traceback."""
    try:
        yield
    except ApiError as error:
        raise fail(str(error)) from None
    except ConfigError as error:
        raise fail(str(error), 2) from None
    except CodeTreeError as error:
        raise fail(str(error)) from None
    except OSError as error:
        raise fail(str(error)) from None


def client_for(
    home: Path | None, url: str | None, token: str | None, ca: Path | None = None
) -> Client:
    target = resolve_target(home or default_home(), url, token, str(ca) if ca else None)
    return Client(target)


def api_command(command: F) -> F:
    """A command that talks to the API: Typer sees ``--home``, ``--url``, ``--token`` and
    ``--ca`` added to its options, and the command gets the client they name as its ``client``
    argument.

    Typer has no dependency injection (a parameter computed from other options), so this
    rewrites the signature Typer reads: the options are declared once here instead of in each
    of the two dozen commands."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "client"]
    keyword = inspect.Parameter.KEYWORD_ONLY
    options = [
        inspect.Parameter("home", keyword, default=Path("~/.aicluster"), annotation=HomeOption),
        inspect.Parameter("url", keyword, default=None, annotation=UrlOption),
        inspect.Parameter("token", keyword, default=None, annotation=TokenOption),
        inspect.Parameter("ca", keyword, default=None, annotation=CaOption),
    ]

    @functools.wraps(command)
    def connected(
        *args: Any, home: Path, url: str | None, token: str | None, ca: Path | None, **kw: Any
    ) -> Any:
        with readable():
            client = client_for(home.expanduser(), url, token, ca)
        return command(*args, client=client, **kw)

    connected.__signature__ = signature.replace(parameters=[*own, *options])  # type: ignore[attr-defined]
    return connected  # type: ignore[return-value]


def when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp).strftime("%H:%M:%S")


def estimated(timestamp: float | None) -> str:
    """An estimated start in local time: the time of day within a day from now, else with
    its date; "-" for none."""
    if timestamp is None:
        return "-"
    if timestamp - time.time() < 86_400:
        return when(timestamp)
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M")
