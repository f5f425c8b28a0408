"""A job spec whose code cannot run is refused at submit (422), not failed when it runs.

An ``entrypoint`` is a file of the job's shipped code (``python -u entrypoint`` in a copy of that
tree): a spec that ships no code (``code:``), or whose code holds no file there, would fail with
"can't open file" on every attempt. ``module:`` runs ``python -m``, which may name an installed
module, so a spec with a module and no code is not checked. The archive is read by
:func:`aicluster.artifacts.codeindex.find_path` (headers only, bounded; a tree past its bounds is
let through).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from fastapi import HTTPException, status

from aicluster.artifacts import CodeNotFound, CodeStore, CodeTreeError
from aicluster.artifacts.codeindex import PathInTree, find_path
from aicluster.core import JobSpec

__all__ = ["check_runnable"]

#: Answers kept (a sweep submits one archive many times, and reading it is the costly part).
_CACHED = 512
_FOUND: OrderedDict[tuple[str, str], PathInTree] = OrderedDict()
_LOCK = threading.Lock()


def check_runnable(code: CodeStore, tenant: str, spec: JobSpec) -> None:
    """422 when the spec's ``entrypoint`` is not a file of its ``code`` (``code`` must be the
    tenant's already), or when it has no code; the detail says how to ship it."""
    if spec.entrypoint is None:
        return  # module: may be an installed module
    entrypoint = spec.entrypoint
    if spec.code is None:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail=f"entrypoint: {entrypoint} is a file of the job's code, and this spec ships "
            f"no code (no code:); {_how_to_ship(tenant)}",
        )
    found = _path_in_code(code, tenant, spec.code, entrypoint)
    refusal = found.refusal(entrypoint, f"the shipped code (sha256 {spec.code[:12]})")
    if refusal is not None:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail=f"{refusal}; give the path of a file of that tree, relative to its root (the "
            "folder aicluster submit ships)",
        )


def _how_to_ship(tenant: str) -> str:
    return (
        "ship the code: `aicluster submit FILE` uploads the spec's folder; or name an archive "
        f"uploaded to POST /v1/tenants/{tenant}/code in code: (its SHA-256); or give module: "
        "instead of entrypoint: to run an installed module (python -m)"
    )


def _path_in_code(code: CodeStore, tenant: str, sha256: str, path: str) -> PathInTree:
    """What the tenant's archive holds at ``path``. Cached by hash and path: an archive is named
    by its SHA-256, so the answer is the same for every tenant that stores it, and never changes
    (the caller has checked that this tenant stores it)."""
    key = (sha256, path)
    with _LOCK:
        if key in _FOUND:
            _FOUND.move_to_end(key)
            return _FOUND[key]
    try:
        with code.open(tenant, sha256) as archive:
            found = find_path(archive, path)
    except CodeNotFound:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, detail=f"code: {sha256} is not stored for {tenant!r}"
        ) from None
    except CodeTreeError as error:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail=f"code: the stored archive {sha256[:12]} cannot be read ({error})",
        ) from None
    with _LOCK:  # submits run in the thread pool
        _FOUND[key] = found
        while len(_FOUND) > _CACHED:
            _FOUND.popitem(last=False)
    return found
