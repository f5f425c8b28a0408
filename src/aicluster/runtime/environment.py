"""The environment a job's process gets: an allow-list, never the launching shell's.

A rank gets the variables of :func:`aicluster.runtime.layout.rank_env` (torch's ``env://`` set,
``AICLUSTER_*`` paths and identity, the job's own ``env:``), the node name, and a small base:
``PATH`` (the job's Python first), ``HOME`` (its working directory), ``USER`` and ``LOGNAME``
(the tenant's name), ``TMPDIR``, ``LANG`` and, where Ray set it for the rank's actor,
``CUDA_VISIBLE_DEVICES`` (which the rank's variables replace with the GPU the launcher chose).
Nothing else of the node's environment reaches it: no token, database URL, Ray address or cloud
credential.
See ``docs/runtime.md``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["PASSED_FROM_NODE", "base_env", "job_environment"]

#: Variables copied from the launching actor's environment when set there (Ray sets them).
PASSED_FROM_NODE = ("CUDA_VISIBLE_DEVICES",)


def base_env(node_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every job process starts from (a warm process too)."""
    node_env = os.environ if node_env is None else node_env
    python_bin = os.path.dirname(sys.executable)
    made = {
        "PATH": f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
    }
    made.update({key: node_env[key] for key in PASSED_FROM_NODE if key in node_env})
    return made


def job_environment(
    rank_vars: Mapping[str, str], workdir: str, node_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The whole environment of one rank's process."""
    # getpass.getuser() (torch's caches ask) reads these before the passwd file, which has no
    # entry for a sandbox's uid.
    user = rank_vars.get("AICLUSTER_TENANT", "aicluster")
    return {**base_env(node_env), "HOME": workdir, "USER": user, "LOGNAME": user, **rank_vars}
