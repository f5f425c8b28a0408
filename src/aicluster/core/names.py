"""System names made from the names tenants choose: injective, and namespaced by tenant.

Tenants choose their own names and their models' names; from them the system makes Ray Serve
application names, directories under the state directory (job data, the model registry, the
code store, nodes' code caches) and the names of the tenants' warm processes. Two different
choices must never make the same system name, however they are spelled (``a-b``, ``a_b``,
``a.b``, ``A-b``, unicode, very long names). The API's patterns keep names short and tidy, but
nothing here relies on them: every string has an encoding.

**One name** (:func:`encode`): ``a``-``z``, ``0``-``9`` and ``-`` stand for themselves; any other
character becomes ``~xx`` for each byte of its UTF-8 encoding (two lower-case hex digits), so
``a_b`` → ``a~5fb``, ``a.b`` → ``a~2eb``, ``A-b`` → ``~41-b``, ``é`` → ``~c3~a9``; the empty name
is ``~``. It is injective: ``~`` never stands for itself, so an encoding reads back in one way only
(:func:`decode`). The result holds only ``a-z0-9-~``: no ``/``, no ``.`` (so never ``.`` or
``..``), no upper case (nothing a case-insensitive filesystem folds), nothing Ray reserves (``#``).

**Bounded length** (:func:`part`): an encoding longer than its limit (:data:`PART_LIMIT` unless
given) becomes its first characters (never half an escape), ``~~`` and the first 32 hex digits
(128 bits) of the SHA-256 of the name's UTF-8 bytes; it is never truncated alone. An unbounded
encoding never holds ``~~`` (a ``~`` there is followed by two hex digits), so a bounded name never
equals an unbounded one, and two bounded names are equal only if their names' SHA-256 agree.

**Several names** (:func:`join`): their bounded encodings joined by ``.``, which no encoding holds,
so the parts are read back by splitting on it. A Serve application is
``aic-<tenant>.<model>.v<version>`` (:func:`aicluster.serve.app_name`). Directories keep one part
per level: ``<state_dir>/tenants/<tenant>/``, ``<state_dir>/models/<tenant>/<model>/<version>/``,
``<state_dir>/artifacts/code/<tenant>/``, ``<state_dir>/nodes/<node>/code/<tenant>/``.

**Names made before this encoding** were the raw names (the API's ``[A-Za-z0-9._-]``, at most 63).
A name of ``a-z0-9-`` only encodes to itself, so its directories stay where they were; any other
encoding holds a ``~``, which no raw name did, so an encoded name never meets a directory that
another tenant's raw name made. :func:`tenant_folder` keeps using such a raw directory where one
exists (running jobs and stored code outlive an upgrade); model versions keep the path their row
records. Serve applications were ``aic-<tenant>--<model>-v<version>`` with every character but
``A-Za-z0-9_.`` turned into ``_`` (so ``a-b`` and ``a_b`` met): the new names end in ``.v<n>``
where the old ones ended in ``-v<n>``, so the two never meet either; the leader's deployer
removes the old applications as no longer wanted and deploys the new ones.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

__all__ = [
    "HASHED_LENGTH",
    "PART_LIMIT",
    "SEPARATOR",
    "decode",
    "encode",
    "join",
    "part",
    "tenant_folder",
]

#: The characters that stand for themselves.
PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
#: Starts an escape (``~xx``); alone, the empty name; doubled, a hash follows.
ESCAPE = "~"
#: Between the parts of a joined name: no encoding holds it.
SEPARATOR = "."
#: The longest a part may be before it is shortened with a hash: a directory entry (255 bytes on
#: Linux) with room to spare.
PART_LIMIT = 128
#: Hex digits of the SHA-256 in a shortened part (128 bits).
_DIGEST_HEX = 32
#: The length of ``~~`` and the digest: a limit below it is refused.
HASHED_LENGTH = 2 + _DIGEST_HEX
#: What a raw name of the code before this encoding looked like (see :func:`tenant_folder`).
_LEGACY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_HEX = frozenset("0123456789abcdef")


def _bytes(name: str) -> bytes:
    # surrogatepass: a lone surrogate (which no codec encodes strictly) still has bytes of its own
    return name.encode("utf-8", "surrogatepass")


def encode(name: str) -> str:
    """The injective encoding of one name (see the module docstring), unbounded in length."""
    if not name:
        return ESCAPE
    out: list[str] = []
    for char in name:
        if char in PLAIN:
            out.append(char)
        else:
            out.extend(f"{ESCAPE}{byte:02x}" for byte in _bytes(char))
    return "".join(out)


def decode(encoded: str) -> str:
    """The name whose :func:`encode` is ``encoded``; ``ValueError`` for anything else (a bounded
    part included: its hash cannot be read back)."""
    if encoded == ESCAPE:
        return ""
    data = bytearray()
    index = 0
    while index < len(encoded):
        char, digits = encoded[index], encoded[index + 1 : index + 3]
        if char in PLAIN:
            data.append(ord(char))
            index += 1
        elif char == ESCAPE and len(digits) == 2 and set(digits) <= _HEX:
            data.append(int(digits, 16))
            index += 3
        else:
            raise ValueError(f"not an encoded name: {encoded!r}")
    try:
        name = bytes(data).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise ValueError(f"not an encoded name: {encoded!r}") from None
    if not name or encode(name) != encoded:  # e.g. "~61" for "a": only one spelling is valid
        raise ValueError(f"not an encoded name: {encoded!r}")
    return name


def part(name: str, limit: int = PART_LIMIT) -> str:
    """:func:`encode` of ``name`` in at most ``limit`` characters: a longer one is shortened
    with a hash of the whole name (see the module docstring). ``limit`` is at least
    :data:`HASHED_LENGTH`."""
    if limit < HASHED_LENGTH:
        raise ValueError(f"a part's limit must be at least {HASHED_LENGTH}, not {limit}")
    full = encode(name)
    if len(full) <= limit:
        return full
    head = full[: limit - HASHED_LENGTH]
    cut = head.rfind(ESCAPE)
    if cut >= 0 and cut > len(head) - 3:  # never keep half an escape
        head = head[:cut]
    digest = hashlib.sha256(_bytes(name)).hexdigest()[:_DIGEST_HEX]
    return f"{head}{ESCAPE}{ESCAPE}{digest}"


def join(*names: str) -> str:
    """The names' parts (:func:`part`) joined by :data:`SEPARATOR`: distinct tuples of names
    give distinct results."""
    return SEPARATOR.join(part(name) for name in names)


def tenant_folder(parent: str | os.PathLike[str], tenant: str) -> Path:
    """``parent/<part of tenant>``, the tenant's folder in ``parent``; except that where the code
    before this encoding made ``parent/<tenant>`` (a raw name that encodes to something else)
    and that directory is there, it is kept. Such a raw name never equals another tenant's
    encoding (see the module docstring), so no two tenants share a folder either way. The one
    function here that looks at the disk (a directory, not a link)."""
    encoded = part(tenant)
    if encoded != tenant and _LEGACY.fullmatch(tenant):
        legacy = os.path.join(parent, tenant)
        if os.path.isdir(legacy) and not os.path.islink(legacy):
            return Path(legacy)
    return Path(parent) / encoded
