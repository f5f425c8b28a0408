"""Instructions instead of seconds: count a bench's timed sections under callgrind.

On a shared machine the same run's CPU time swings by half from one minute to the next (27 Nov
2026: this file's figure from ``bench/calibration.py`` went from 222 to 441 ms within a minute,
nothing else running in the VM), so medians of timed runs cannot tell a 5% change. The number of
instructions a section executes does not depend on the load. Each bench wraps its timed sections
in :func:`counted` with a label; under callgrind, started with collection off, only those
sections count, each written to a dump of its own, which this script sums by label:

    AICLUSTER_COUNT_INSTRUCTIONS=1 valgrind --tool=callgrind --instr-atstart=no \\
        --collect-atstart=no --callgrind-out-file=/tmp/cg/out python bench/control_tick.py
    python bench/instructions.py /tmp/cg/out*

Without ``AICLUSTER_COUNT_INSTRUCTIONS`` :func:`counted` does nothing. With it, a two-line C
shim around callgrind's client requests (``valgrind/callgrind.h``, from Debian's ``valgrind``
package) is compiled with the system's C compiler once into a temporary folder: Python cannot
issue valgrind's client requests by itself.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path

_SHIM = """#include <valgrind/callgrind.h>
void count_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_TOGGLE_COLLECT; }
void count_stop(const char *label) {
    CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS_AT(label); CALLGRIND_STOP_INSTRUMENTATION;
}
"""


@cache
def _shim() -> ctypes.CDLL | None:
    if not os.environ.get("AICLUSTER_COUNT_INSTRUCTIONS"):
        return None
    folder = Path(tempfile.mkdtemp(prefix="aicluster-count-"))
    (folder / "shim.c").write_text(_SHIM)
    library = folder / "shim.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-o", str(library), str(folder / "shim.c")], check=True
    )
    return ctypes.CDLL(str(library))


@contextmanager
def counted(label: str, collector_off: bool = False) -> Iterator[None]:
    """Count the instructions of the ``with`` block under ``label`` (only when asked, see the
    module's text). With ``collector_off``, as ``timeit`` does, Python's cyclic garbage collector
    runs before the block and not inside it: a full collection of the bench's own set-up (50,000
    jobs) falling inside one timed cycle is half a cycle's cost, in some runs and not others."""
    if collector_off:
        gc.collect()
        gc.disable()
    shim = _shim()
    if shim is not None:
        shim.count_start()
    try:
        yield
    finally:
        if shim is not None:
            shim.count_stop(label.encode())
        if collector_off:
            gc.enable()


def totals(dumps: Sequence[Path]) -> dict[str, list[int]]:
    """The instructions of each counted section, by label, in the order they ran."""
    found: dict[str, list[int]] = {}
    for dump in sorted(dumps, key=_dump_number):
        text = dump.read_text(errors="replace")
        label = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
        count = re.search(r"^totals: (\d+)", text, re.M)
        if label and count:
            found.setdefault(label.group(1), []).append(int(count.group(1)))
    return found


def _dump_number(path: Path) -> int:
    suffix = path.name.rsplit(".", 1)[-1]
    return int(suffix) if suffix.isdigit() else 0


def main() -> None:
    for label, counts in totals([Path(arg) for arg in sys.argv[1:]]).items():
        each = ", ".join(f"{count / 1e6:,.1f}" for count in counts)
        print(f"{label}: {sum(counts) / 1e6:,.1f} M instructions in {len(counts)} ({each})")


if __name__ == "__main__":
    main()
