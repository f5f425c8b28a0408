"""Path and query parameters, and the patterns request bodies share with them.

Every identifier and piece of free text a request carries has a pattern and a length, so a
malformed value is a 422 before it reaches a database: PostgreSQL refuses NUL in text, and a
pydantic pattern also refuses lone surrogates (text no codec can encode). Lengths follow the
columns in :mod:`aicluster.store.schema`; well-formed identifiers that do not exist stay a 404.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

__all__ = [
    "ID_PATTERN",
    "NAME_PATTERN",
    "TEXT_PATTERN",
    "USER_PATTERN",
    "Cursor",
    "JobId",
    "ModelName",
    "ModelVersion",
    "NodeName",
    "Reason",
    "TenantFilter",
    "TenantName",
    "TokenId",
    "UnixTime",
]

#: Tenants and GPU types: JobSpec's names.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
#: The store's user names.
USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$"
#: Job and token ids.
ID_PATTERN = r"^[A-Za-z0-9_-]+$"
#: One line of free text: no control characters.
TEXT_PATTERN = r"^[^\x00-\x1f\x7f]*$"

JobId = Annotated[str, Path(max_length=32, pattern=ID_PATTERN)]
TokenId = Annotated[str, Path(max_length=32, pattern=ID_PATTERN)]
TenantName = Annotated[str, Path(max_length=63, pattern=NAME_PATTERN)]
ModelName = Annotated[str, Path(max_length=63, pattern=NAME_PATTERN)]
ModelVersion = Annotated[int, Path(ge=1, le=(1 << 31) - 1)]
#: Nodes are named by whoever registers them (Ray discovery, cluster files): any one line.
NodeName = Annotated[str, Path(max_length=253, pattern=r"^[^\x00-\x1f\x7f]+$")]
#: Unix seconds; NaN and infinities are refused (they would compare as nothing).
UnixTime = Annotated[
    float | None, Query(ge=0, le=1e11, allow_inf_nan=False, description="Unix seconds (UTC)")
]
TenantFilter = Annotated[str | None, Query(max_length=63, pattern=NAME_PATTERN)]
Cursor = Annotated[
    str | None, Query(max_length=32, pattern=ID_PATTERN, description="next_cursor of a page")
]
Reason = Annotated[str | None, Query(max_length=256, pattern=TEXT_PATTERN)]
