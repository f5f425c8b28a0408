"""What the session's Ray cluster holds, for the tests that share it: what is still held
(:func:`held`), a picture of it for a timed-out wait's message (:func:`picture`), and the release of
what a finished module left (:func:`release_leftovers`).

A module's tests run on the cluster of their pytest worker, after other modules'. A gang an
earlier test stopped can hold its bundles a while, and one a failed test never stopped holds them
for ever; a later module's replica or gang then waits for resources its own scheduler believes
free, and its test times out with nothing in the server's log to say why."""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any


def _connected() -> bool:
    import ray

    return bool(ray.is_initialized())


def held() -> dict[str, Any]:
    """Placement groups not removed and resources not free (``{name: (free, total)}``), node
    markers, the object store and the placement groups' own bundle resources aside; empty when
    the cluster is idle."""
    import ray
    from ray.util.placement_group import placement_group_table

    groups = [
        str(entry.get("name") or entry.get("placement_group_id"))
        for entry in placement_group_table().values()
        if entry.get("state") != "REMOVED"
    ]
    total, free = ray.cluster_resources(), ray.available_resources()
    short = {
        name: (round(free.get(name, 0.0), 2), amount)
        for name, amount in total.items()
        if not name.startswith("node:") and name != "object_store_memory"
        if "_group_" not in name  # a placement group's own bundles: its name says it all
        if free.get(name, 0.0) < amount - 1e-9
    }
    return {"placement groups": groups, "busy (free, total)": short} if groups or short else {}


def _serve_status() -> str:
    """Each Serve application's and deployment's status, where Serve runs."""
    from ray import serve

    try:
        applications = serve.status().applications
    except Exception as error:  # a picture for a failure message, never a failure
        return f"serve: ({type(error).__name__})"
    lines = []
    for name, app in applications.items():
        for deployment, state in app.deployments.items():
            message = f": {state.message}" if state.message else ""
            lines.append(
                f"serve {name}/{deployment}: {state.status} {state.replica_states}{message}"
            )
    return "\n".join(lines) or "serve: no application"


def _machine() -> str:
    """The machine under the cluster: memory left, load and processes (a worker that cannot
    start for want of memory or a process slot shows here, not in Ray's resources)."""
    meminfo = dict(
        line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line
    )
    processes = sum(1 for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return (
        f"machine: MemAvailable {meminfo.get('MemAvailable', '?').strip()}, "
        f"load {os.getloadavg()}, {processes} processes"
    )


def _unstarted_actors() -> list[str]:
    """Actors neither alive nor dead (waiting for a node, a worker process or a restart), with
    their node: the replica or rank a timed-out wait was waiting for is among them. From the
    GCS's actor table: the embedded cluster runs no dashboard, which Ray's state API needs."""
    from ray._private.state import actors

    waiting = [a for a in actors().values() if a.get("State") not in ("ALIVE", "DEAD")]
    return [
        f"actor {a.get('ActorClassName')} {a.get('State')} "
        f"node {str((a.get('Address') or {}).get('NodeID') or '-')[:8]}"
        for a in waiting[:20]
    ]


#: A raylet log line at warning or error level: ``[2026-12-07 14:20:05,209 W 10807 10807] ...``.
_COMPLAINT = re.compile(r"^\[\S+ \S+ [WE] ")
#: Warnings every idle raylet writes here (no metrics agent; a client that went away).
_NOISE = re.compile(r"Failed to export metrics|Disconnecting client due to connection error")


def _raylet_complaints(lines_per_node: int = 6) -> list[str]:
    """The last warnings and errors of each raylet of this session (worker starts that failed
    or timed out are logged there, and nowhere a test reads)."""
    import ray

    session = Path(ray._private.worker._global_node.get_session_dir_path())
    found = []
    for log in sorted((session / "logs").glob("raylet*.out")):
        lines = log.read_text(errors="replace").splitlines()[-5000:]
        bad = [line[:300] for line in lines if _COMPLAINT.match(line) and not _NOISE.search(line)]
        found += [f"{log.name}: {line}" for line in bad[-lines_per_node:]]
    return found


def picture() -> str:
    """What the cluster holds and how Serve stands, for a timed-out wait's message: the usual
    cause of a replica or gang that never starts is a resource an earlier test still holds; the
    rest (actors not started, raylets' complaints, the machine) is for the other causes."""
    if not _connected():
        return ""
    try:
        parts = [f"cluster held: {held() or 'nothing'}"]
    except Exception as error:  # as above
        return f"\n--- cluster: unreadable ({type(error).__name__}: {error})"
    from ray.util import list_named_actors

    with contextlib.suppress(Exception):
        if any(e["name"] == "SERVE_CONTROLLER_ACTOR" for e in list_named_actors(True)):
            parts.append(_serve_status())
    for part in (_unstarted_actors, _raylet_complaints):
        try:
            parts += part()
        except Exception as error:  # as above
            parts.append(f"{part.__name__}: unreadable ({type(error).__name__}: {error})")
    parts.append(_machine())
    return "\n--- cluster (this test's Ray session)\n" + "\n".join(parts)


def release_leftovers(timeout_s: float = 30.0) -> dict[str, Any]:
    """Remove the placement groups a finished module left (its servers are stopped: no job of
    theirs runs any more) and, where there were any, wait up to ``timeout_s`` for Ray to free
    their resources. Returns what is still held then (printed by the caller: a teardown that
    fails would blame the wrong test)."""
    import ray
    from ray.util.placement_group import (
        PlacementGroup,
        placement_group_table,
        remove_placement_group,
    )

    # By id, not name: a server's gangs are named in its own Ray namespace.
    groups = [gid for gid, e in placement_group_table().items() if e.get("state") != "REMOVED"]
    for group_id in groups:
        with contextlib.suppress(Exception):
            remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(group_id)))
    if not groups:
        return held()
    deadline = time.monotonic() + timeout_s
    while (left := held()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left
