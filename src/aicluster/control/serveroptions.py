"""The server's command-line options, made from :class:`ServerSettings` alone.

Each settings field with an ``option`` (``control/settings.py``) is one option: the server
process's flag (:func:`add_arguments`, :func:`settings_from`), ``aicluster up``'s option of the
same name (the CLI builds it from :func:`server_options`), and the argv ``up`` starts the server
with (:func:`to_argv`). So a setting is written once, with its default, type and help, and the
three cannot drift apart (``tests/unit/test_server_settings.py`` round-trips them).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aicluster.control.settings import ServerSettings

__all__ = ["ServerOption", "add_arguments", "server_options", "settings_from", "to_argv"]


@dataclass(frozen=True)
class ServerOption:
    """One option: its ``ServerSettings`` field, flag, help, value type and default."""

    name: str  # the field
    flag: str
    help: str
    kind: type  # str, int, float, Path or bool
    default: Any
    negates: bool = False  # a flag that turns the (true) field off
    pair: str | None = None  # the positive form of a negating flag, for ``up``
    minimum: float | None = None

    @property
    def dest(self) -> str:
        """The parameter's name on a command line parser: the flag's (``--no-auth``: no_auth)."""
        return self.flag.lstrip("-").replace("-", "_")

    def value(self, given: Any) -> Any:
        """The field's value for what the command line gave (a negating flag's bool)."""
        return (not given) if self.negates else given


def _value_type(hint: Any) -> type:
    """``int`` of ``int``, ``Path`` of ``Path | None``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (kind,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return typing.cast(type, kind)
    return typing.cast(type, hint)


def server_options() -> tuple[ServerOption, ...]:
    """Every option, in the fields' order."""
    hints = typing.get_type_hints(ServerSettings)
    options = []
    for spec in dataclasses.fields(ServerSettings):
        if "flag" not in spec.metadata:
            continue
        meta = spec.metadata
        options.append(
            ServerOption(
                spec.name,
                meta["flag"],
                meta["help"],
                _value_type(hints[spec.name]),
                spec.default,
                meta["negates"],
                meta["pair"],
                meta["minimum"],
            )
        )
    return tuple(options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options as flags of the server process."""
    for option in server_options():
        if option.kind is bool:
            parser.add_argument(option.flag, action="store_true", help=option.help)
        else:
            parser.add_argument(
                option.flag, type=option.kind, default=option.default, help=option.help
            )


def settings_from(given: Mapping[str, Any], **others: Any) -> ServerSettings:
    """The settings of options parsed by a command line (``given``: by :attr:`dest`, as
    argparse names them, or a paired flag by its field, as ``up`` does) and ``others`` (fields
    that are not options: the state directory). Paths are made absolute; ``ValueError`` as
    ``ServerSettings`` raises it."""
    values: dict[str, Any] = {}
    for option in server_options():
        # argparse names a flag by itself (no_auth); up names a pair by its field (auth)
        value = option.value(given[option.dest]) if option.dest in given else given[option.name]
        if isinstance(value, Path):
            value = value.expanduser().resolve()
        values[option.name] = value
    return ServerSettings(**values, **others)


def to_argv(settings: ServerSettings) -> list[str]:
    """The server process's flags for ``settings`` (its options that differ from the
    defaults)."""
    argv: list[str] = []
    for option in server_options():
        value = getattr(settings, option.name)
        if value == option.default:
            continue
        if option.kind is bool:
            argv.append(option.flag)  # only a negating flag changes a default
        else:
            argv += [option.flag, str(value)]
    return argv
