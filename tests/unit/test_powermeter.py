"""Node power meters (runtime/cluster/powermeter.py). RAPL is read from a powercap tree made here:
the sysfs files are the one boundary faked (this machine exposes none); the arithmetic is real."""

import json
import time
from pathlib import Path

import pytest

from aicluster.runtime.cluster.powermeter import (
    NodeMeter,
    NvmlMeter,
    RaplMeter,
    Reading,
    read_power_report,
    write_power_report,
)


def _zone(root: Path, name: str, energy_uj: int, wrap_uj: int = 262_143_328_850) -> Path:
    zone = root / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{wrap_uj}\n")
    return zone


def test_rapl_watts_are_the_packages_energy_over_the_time_between_reads(tmp_path: Path) -> None:
    package0 = _zone(tmp_path, "intel-rapl:0", 1_000_000)
    package1 = _zone(tmp_path, "intel-rapl:1", 5_000_000)
    _zone(tmp_path, "intel-rapl:0:0", 0)  # a subzone (core): the package counts it already
    meter = RaplMeter(tmp_path)
    assert [zone.name for zone in meter.zones] == ["intel-rapl:0", "intel-rapl:1"]
    assert meter.available
    assert meter.watts(100.0) is None  # the first read only starts the count
    (package0 / "energy_uj").write_text("1500000")  # 0.5 J more
    (package1 / "energy_uj").write_text("6500000")  # 1.5 J more
    assert meter.watts(102.0) == pytest.approx(1.0)  # 2 J in 2 s


def test_rapl_allows_for_the_counter_wrapping_around(tmp_path: Path) -> None:
    zone = _zone(tmp_path, "intel-rapl:0", 900, wrap_uj=1000)
    meter = RaplMeter(tmp_path)
    meter.watts(0.0)
    (zone / "energy_uj").write_text("100")  # 900 -> 1000 (wrap) -> 100: 200 uJ
    assert meter.watts(1.0) == pytest.approx(200e-6)


def test_unreadable_meters_measure_nothing(tmp_path: Path) -> None:
    zone = _zone(tmp_path, "intel-rapl:0", 1)
    (zone / "energy_uj").write_text("not a number")
    assert RaplMeter(tmp_path).watts(1.0) is None
    absent = RaplMeter(tmp_path / "none")
    assert not absent.available
    assert absent.watts(1.0) is None and absent.watts(2.0) is None  # never a figure of 0 W
    assert NvmlMeter().available is False  # no NVIDIA driver on this machine
    reading = NodeMeter(tmp_path / "none").read(5.0)
    assert reading == Reading(0.0, (), 5.0)


def test_a_report_round_trips_and_garbage_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "nodes" / "n0" / "power.json"
    write_power_report(path, Reading(812.5, ("nvml", "rapl"), 1234.0))
    assert read_power_report(path) == Reading(812.5, ("nvml", "rapl"), 1234.0)
    for bad in (
        "{",
        '{"watts": "x", "at": 1, "sources": []}',
        '{"watts": -5, "at": 1, "sources": []}',
    ):
        path.write_text(bad)
        assert read_power_report(path) is None
    path.write_text(json.dumps({"watts": 10, "at": 1, "sources": ["nvml", "made-up"]}))
    assert read_power_report(path) == Reading(10.0, ("nvml",), 1.0)
    assert read_power_report(tmp_path / "missing.json") is None


def test_the_reporter_writes_every_runtimes_report(tmp_path: Path) -> None:
    """The node's starter is shared by every runtime on the cluster: each asks for its own path."""
    from aicluster.runtime.cluster.powermeter import PowerReporter, read_power_report

    first, second = tmp_path / "a" / "power.json", tmp_path / "b" / "power.json"
    reporter = PowerReporter(str(first), interval_s=0.05)
    reporter.add(str(second))
    reporter.add(str(second))
    assert reporter.paths == [first, second]
    reporter.ensure()
    deadline = time.monotonic() + 10
    while not (first.exists() and second.exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_power_report(first) is not None and read_power_report(second) is not None
