"""Durations read from text: ``20s``, ``90m``, ``2h``, ``1.5d``, ``500ms``, or a plain number
of seconds. One parser for the job spec's durations and the CLI's duration flags, so every
place that takes a duration takes the same forms and names them the same way when refused."""

from __future__ import annotations

import math
import re

__all__ = ["DURATION_FORMS", "UNITS", "parse_duration"]

#: Seconds per unit.
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
#: The accepted forms, as error messages list them.
DURATION_FORMS = "seconds (90, 1.5) or a number with a unit: 500ms, 20s, 90m, 2h, 1d, 1w"
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration(text: str | float) -> float:
    """Seconds from ``text`` (a number is seconds already). Raises ``ValueError`` naming the
    accepted forms for anything else, negative numbers included."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration: give {DURATION_FORMS}")
    if isinstance(text, int | float):
        if math.isfinite(text) and text >= 0:
            return float(text)
        raise ValueError(f"{text!r} is not a duration: give {DURATION_FORMS}")
    match = _DURATION.match(text) if len(text) <= 64 else None
    if match is None:
        shown = repr(text) if len(text) <= 40 else repr(text[:37]) + "..."
        raise ValueError(f"{shown} is not a duration: give {DURATION_FORMS}")
    return float(match.group(1)) * UNITS[match.group(2) or "s"]
