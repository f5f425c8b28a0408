"""Security alarms raised on the nodes, carried to the control plane through the state directory.

The node side (a rank's launcher, a warm process's starter) sees an attack where it happens, in
a Ray actor with no connection to the store. It writes each alarm as one file into
``<state_dir>/alarms/`` (0700, root's: a job never sees the state directory), and the control
loop takes them each tick (:func:`take_alarms`) into the event log as ``security.alarm`` events,
which the metrics count (``aicluster_security_alarms``). A file, not a Ray call: the alarm must
survive the control plane being down or changing leader, as exit records do.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aicluster.runtime.rundir import write_json_atomic

__all__ = ["Alarm", "alarm_dir", "raise_alarm", "take_alarms"]

log = logging.getLogger(__name__)

#: Alarm files read in one tick, at most (a flood waits for the next ticks, and is seen).
MAX_PER_TAKE = 200


@dataclass(frozen=True, slots=True)
class Alarm:
    """What was seen (``kind``: ``launch_channel.wrong_peer``, ...), whose resources it aimed at
    (``tenant``), where (``node``: the Ray node id), when, and the particulars."""

    kind: str
    tenant: str | None
    node: str
    at: float
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "alarm": self.kind,
            "tenant": self.tenant,
            "node": self.node,
            "at": self.at,
            **self.details,
        }


def alarm_dir(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / "alarms"


def raise_alarm(
    state_dir: str | os.PathLike[str],
    kind: str,
    tenant: str | None,
    node: str,
    details: dict[str, Any] | None = None,
) -> None:
    """Record an alarm for the control plane (and the node's log). Never raises: an alarm that
    cannot be written is logged, and the caller goes on refusing what it refused."""
    log.warning("security alarm %s (tenant %s, node %s): %s", kind, tenant, node, details)
    folder = alarm_dir(state_dir)
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        record = Alarm(kind, tenant, node, time.time(), dict(details or {}))
        name = f"{time.time_ns():020d}-{secrets.token_hex(4)}.json"
        write_json_atomic(folder / name, record.to_dict())
    except OSError as error:
        log.error("could not record the alarm %s: %s", kind, error)


def take_alarms(state_dir: str | os.PathLike[str], record: Callable[[Alarm], None]) -> int:
    """Hand each alarm recorded since the last call to ``record``, oldest first, and remove its
    file once ``record`` returned (one that raises leaves its file for the next call). A file
    that is not an alarm is removed and logged (only root writes there). Returns how many were
    recorded."""
    folder = alarm_dir(state_dir)
    try:
        names = sorted(name for name in os.listdir(folder) if name.endswith(".json"))
    except FileNotFoundError:
        return 0
    recorded = 0
    for name in names[:MAX_PER_TAKE]:
        path = folder / name
        try:
            alarm = _read(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.error("dropping the unreadable alarm file %s: %s", path, error)
        else:
            record(alarm)
            recorded += 1
        path.unlink(missing_ok=True)
    return recorded


def _read(path: Path) -> Alarm:
    raw = json.loads(path.read_bytes())
    kind, tenant, node, at = raw["alarm"], raw.get("tenant"), raw["node"], raw["at"]
    details = {k: v for k, v in raw.items() if k not in ("alarm", "tenant", "node", "at")}
    return Alarm(str(kind), None if tenant is None else str(tenant), str(node), float(at), details)
