"""Values of a list option given as comma lists, repeated, or both (``--state FAILED,RUNNING
--state PENDING``, ``?state=FAILED,RUNNING&state=PENDING``): one reading for the CLI's flags
and the API's query parameters, and one message for a value that is not allowed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["split_choices"]


def split_choices(given: Iterable[str], allowed: Sequence[str], what: str) -> list[str]:
    """The values ``given`` names, split at commas, matched to ``allowed`` without regard to
    case, each once, in the order first given. Raises ``ValueError`` naming the unknown values
    and the allowed ones (``what``: the option's name, e.g. ``state``)."""
    by_key = {choice.casefold(): choice for choice in allowed}
    chosen: dict[str, None] = {}
    unknown: list[str] = []
    for item in given:
        for part in item.split(","):
            value = part.strip()
            if not value:
                continue
            choice = by_key.get(value.casefold())
            if choice is None:
                unknown.append(value if len(value) <= 40 else value[:37] + "...")
            else:
                chosen[choice] = None
    if unknown:
        names = ", ".join(repr(value) for value in unknown[:5])
        plural = "s" if len(unknown) > 1 else ""
        raise ValueError(f"unknown {what}{plural} {names}: give one of {', '.join(allowed)}")
    return list(chosen)
