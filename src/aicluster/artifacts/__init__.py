"""Artifacts that travel with jobs: a team's shipped code (packed, stored per tenant, unpacked)."""

from aicluster.artifacts.codestore import (
    MAX_TENANT_BYTES,
    MAX_UPLOAD_BYTES,
    BlobCodeStore,
    CodeNotFound,
    CodeQuotaExceeded,
    CodeStore,
    CodeTooLarge,
    LocalCodeStore,
    StoredCode,
    code_store,
)
from aicluster.artifacts.codetree import (
    IGNORE_FILE,
    MAX_ARCHIVE_BYTES,
    MAX_UNPACKED_BYTES,
    CodeTreeError,
    PackedTree,
    check_archive,
    pack_tree,
    unpack_tree,
)

__all__ = [
    "IGNORE_FILE",
    "MAX_ARCHIVE_BYTES",
    "MAX_TENANT_BYTES",
    "MAX_UNPACKED_BYTES",
    "MAX_UPLOAD_BYTES",
    "BlobCodeStore",
    "CodeNotFound",
    "CodeQuotaExceeded",
    "CodeStore",
    "CodeTooLarge",
    "CodeTreeError",
    "LocalCodeStore",
    "PackedTree",
    "StoredCode",
    "check_archive",
    "code_store",
    "pack_tree",
    "unpack_tree",
]
