"""Measured power of a node: NVML for its NVIDIA GPUs (``nvidia-ml-py``), RAPL for its CPU
packages and memory (``/sys/class/powercap``, where readable), summed; nothing where neither is
(the control plane then shows the power model's figure, labelled modelled).

A :class:`PowerReporter` (a thread of each node's warm starter actor, :mod:`..warm.starter`) samples
every ``interval_s`` and rewrites ``<state_dir>/nodes/<node>/power.json`` (``{"watts", "sources",
"at"}``; ``sources`` empty where nothing is readable), the directory the nodes and the control
plane already share for cache inventories. The control plane reads it
(``control/views/powerview.py``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aicluster.runtime.rundir import write_json_atomic
from aicluster.runtime.workdir import node_cache

__all__ = [
    "NodeMeter",
    "NvmlMeter",
    "PowerReporter",
    "RaplMeter",
    "Reading",
    "power_report_path",
    "read_power_report",
    "write_power_report",
]

log = logging.getLogger(__name__)
RAPL_ROOT = Path("/sys/class/powercap")
REPORT_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class Reading:
    """Watts drawn, which meters measured them (``("nvml", "rapl")``; empty: none), and when."""

    watts: float
    sources: tuple[str, ...]
    at: float


class NvmlMeter:
    """The power draw of every NVIDIA GPU of this machine (NVML's ``nvmlDeviceGetPowerUsage``,
    milliwatts); unavailable where NVML cannot be loaded (no driver, no GPU)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = pynvml
        except Exception as error:  # NVMLError, ImportError, OSError: no NVIDIA driver here
            log.debug("no NVML: %s", error)

    @property
    def available(self) -> bool:
        return self._nvml is not None and bool(self._handles)

    def watts(self) -> float | None:
        if not self.available:
            return None
        try:
            milliwatts = sum(int(self._nvml.nvmlDeviceGetPowerUsage(h)) for h in self._handles)
            return milliwatts / 1000.0
        except Exception as error:  # a GPU fell off the bus: no figure this time
            log.warning("NVML power read failed: %s", error)
            return None


class RaplMeter:
    """CPU packages (and their memory) by RAPL's energy counters: watts are the energy used
    between two reads over the time between them, the counter's wrap-around allowed for. The
    first read gives None. Only top-level zones (``intel-rapl:0``, not ``intel-rapl:0:0``, which
    the package already counts)."""

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        self.zones = sorted(p for p in root.glob("*-rapl:*") if p.name.count(":") == 1)
        self._last: tuple[float, list[int]] | None = None

    @property
    def available(self) -> bool:
        return self._counters() is not None

    def watts(self, now: float) -> float | None:
        counters = self._counters()
        if counters is None:
            return None
        last, self._last = self._last, (now, counters)
        if last is None or now <= last[0]:
            return None
        joules = (
            sum(
                _delta(before, after, self._range(zone))
                for zone, before, after in zip(self.zones, last[1], counters, strict=True)
            )
            / 1e6
        )
        return joules / (now - last[0])

    def _counters(self) -> list[int] | None:
        if not self.zones:  # no RAPL here
            return None
        try:
            return [int((zone / "energy_uj").read_text()) for zone in self.zones]
        except (OSError, ValueError):  # not readable (unprivileged since CVE-2020-8694)
            return None

    @staticmethod
    def _range(zone: Path) -> int:
        try:
            return int((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            return 0


def _delta(before: int, after: int, wrap: int) -> int:
    return after - before if after >= before else after + wrap - before


class NodeMeter:
    """This machine's measured draw: NVML's GPUs plus RAPL's packages, whichever are readable."""

    def __init__(self, rapl_root: Path = RAPL_ROOT) -> None:
        self.nvml = NvmlMeter()
        self.rapl = RaplMeter(rapl_root)

    def read(self, now: float) -> Reading:
        measured = {"nvml": self.nvml.watts(), "rapl": self.rapl.watts(now)}
        found = {source: watts for source, watts in measured.items() if watts is not None}
        return Reading(round(sum(found.values(), 0.0), 1), tuple(found), now)


def power_report_path(state_dir: str | Path, node: str) -> Path:
    return node_cache(state_dir, node) / "power.json"


def write_power_report(path: Path, reading: Reading) -> None:
    data = {"watts": reading.watts, "sources": list(reading.sources), "at": reading.at}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data)


def read_power_report(path: Path) -> Reading | None:
    """A node's last report, or None (none yet, unreadable, or not what a reporter writes)."""
    try:
        data = json.loads(path.read_text())
        watts, at = float(data["watts"]), float(data["at"])
        sources = tuple(str(s) for s in data["sources"] if s in ("nvml", "rapl"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not 0 <= watts < 1e7:
        return None
    return Reading(watts, sources, at)


class PowerReporter:
    """Samples the node's meters every ``interval_s`` and rewrites its report, from a thread
    of the node's warm starter. Idempotent. The node's starter is one per Ray node, shared by
    every runtime on the cluster (each with its own state directory), so it writes the report
    to every path it was asked for (:meth:`add`)."""

    def __init__(self, path: str, interval_s: float = REPORT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.paths: list[Path] = [Path(path)]  # the first: the runtime that made the starter
        self._thread: threading.Thread | None = None

    def add(self, path: str) -> None:
        """Also write the report to ``path`` (another runtime's state directory)."""
        if Path(path) not in self.paths:
            self.paths = [*self.paths, Path(path)]  # replaced whole: the thread reads it

    def ensure(self) -> str:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="power-reporter", daemon=True)
            self._thread.start()
        return str(self.paths[0])

    def _run(self) -> None:
        meter = NodeMeter()
        while True:
            reading = meter.read(time.time())
            for path in self.paths:
                try:
                    write_power_report(path, reading)
                except OSError as error:
                    log.warning("cannot write the power report %s: %s", path, error)
            time.sleep(self.interval_s)
