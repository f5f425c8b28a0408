"""Numbers read from text someone else wrote: file names, path segments, CLI arguments.

``str.isdigit`` is true of ``"²"`` and ``"١"``; ``int`` refuses the first and reads the second,
so ``int(text) if text.isdigit()`` raises or misreads on names a tenant chose. Use
:func:`ascii_int` wherever text becomes a number.
"""

from __future__ import annotations

__all__ = ["ascii_int"]

#: Digits at most: 18 fit a signed 64-bit integer (a database column, a file offset).
MAX_DIGITS = 18


def ascii_int(text: str) -> int | None:
    """``text`` as a non-negative integer when it is 1 to 18 ASCII digits, else None."""
    if 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None
