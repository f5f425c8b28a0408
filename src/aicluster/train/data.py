"""The datasets a job reads (``data:`` in its spec), as local directories on the rank's node.

The runtime assembles each dataset version once per node from the node's shard cache, read-only,
and tells the ranks where (:data:`DATASETS`); :func:`dataset` returns that directory, holding the
dataset's files under the names they were pushed with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["DATASETS", "INPUTS", "dataset"]

#: What the control plane asks the rank's node to prepare (JSON: name, version, manifest hash).
INPUTS = "AICLUSTER_DATA_INPUTS"
#: What the node prepared for the rank (JSON: dataset name -> its directory).
DATASETS = "AICLUSTER_DATASETS"


def dataset(name: str) -> Path:
    """The local, read-only directory of the job's dataset ``name`` (the version its spec
    named, resolved at submit). Raises ``KeyError`` when the job's spec does not name it."""
    found = json.loads(os.environ.get(DATASETS) or "{}")
    if name not in found:
        named = ", ".join(sorted(found)) or "none"
        raise KeyError(f"this job reads no dataset {name!r} (its spec's data: names {named})")
    return Path(found[name])
