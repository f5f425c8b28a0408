"""A module of the job's own code, imported from the shipped tree: an answer, and a heartbeat of
step records so that the control plane sees the job making progress (it is not hung)."""

from __future__ import annotations

import os
import threading
import time

from aicluster.train.telemetry import TelemetryWriter


def answer() -> int:
    return 6 * 7


def start_heartbeat(period_s: float = 1.0) -> None:
    writer = TelemetryWriter(
        os.environ["AICLUSTER_TELEMETRY_FILE"],
        int(os.environ["RANK"]),
        os.environ.get("AICLUSTER_NODE"),
        int(os.environ["AICLUSTER_ATTEMPT"]),
    )
    writer.write("start")

    def beat() -> None:
        step = 0
        while True:
            step += 1
            writer.write("step", step=step)
            time.sleep(period_s)

    threading.Thread(target=beat, daemon=True).start()
