"""Shipping a folder as a job's code, as ``aicluster submit`` does, straight into the code store
of a state directory (for tests that submit through the store rather than the API)."""

from __future__ import annotations

from pathlib import Path

from aicluster.artifacts import MAX_TENANT_BYTES, MAX_UPLOAD_BYTES, code_store, pack_tree

REPO = Path(__file__).resolve().parents[2]
JOBS = Path(__file__).parent / "jobs"
EXAMPLES = REPO / "examples" / "jobs"


def ship(state_dir: str | Path, tenant: str, folder: str | Path) -> str:
    """Pack ``folder``, store it as ``tenant``'s code; returns its hash (the spec's ``code``)."""
    with pack_tree(Path(folder)) as packed, packed.open() as archive:
        stored = code_store(Path(state_dir)).put(
            tenant,
            iter(lambda: archive.read(1 << 16), b""),
            max_bytes=MAX_UPLOAD_BYTES,
            tenant_quota_bytes=MAX_TENANT_BYTES,
        )
    return stored.sha256
