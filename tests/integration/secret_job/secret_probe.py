"""Says, by hash only, whether a secret reached this job's process and a child of it; optionally
looks for a value of that hash in every process it can see, tries to read given paths, and holds
on (sending heartbeats) until stopped. Never prints a secret."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

from aicluster.train.telemetry import TelemetryWriter

CHILD = (
    "import hashlib, os, sys\n"
    "value = os.environ.get(sys.argv[1])\n"
    "print('missing' if value is None else hashlib.sha256(value.encode()).hexdigest())\n"
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verdict(value: str | None, expected: str) -> str:
    if value is None:
        return "missing"
    return "match" if sha(value.encode()) == expected else "mismatch"


def verdict_of_hash(digest: str, expected: str) -> str:
    return "match" if digest == expected else "mismatch"


def scan(expected: str) -> dict[str, int]:
    """Every NUL-separated entry (and the value of every NAME=VALUE) of every process's
    environment and command line this process can read, compared by hash."""
    seen = readable = found = 0
    for pid in os.listdir("/proc"):
        if not pid.isascii() or not pid.isdigit():
            continue
        seen += 1
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            readable += 1
            for entry in data.split(b"\0"):
                candidates = [entry, entry.partition(b"=")[2]]
                found += any(sha(item) == expected for item in candidates)
    return {"processes": seen, "readable": readable, "found": found}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--sha256", required=True)
    parser.add_argument("--scan", action="store_true")
    parser.add_argument("--read", action="append", default=[])
    parser.add_argument("--hold", type=float, default=0.0)
    args = parser.parse_args()
    print("SECRET", verdict(os.environ.get(args.name), args.sha256), flush=True)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, args.name], capture_output=True, text=True, check=True
    )
    answer = child.stdout.strip()
    print("CHILD", "missing" if answer == "missing" else verdict_of_hash(answer, args.sha256))
    print("WARM", os.environ.get("AICLUSTER_WARM_STARTED", "0"))
    print("UID", os.getuid(), flush=True)
    for path in args.read:
        try:
            with open(path, "rb") as handle:
                handle.read(1)
            print("READ", path, "ALLOWED", flush=True)
        except OSError as error:
            print("READ", path, "denied", type(error).__name__, flush=True)
    if args.scan:
        print("SCAN", json.dumps(scan(args.sha256)), flush=True)
    hold(args.hold)


def hold(seconds: float) -> None:
    """Heartbeats (the control plane sees progress) until ``seconds`` pass or a SIGTERM."""
    if seconds <= 0:
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    writer = TelemetryWriter(
        os.environ["AICLUSTER_TELEMETRY_FILE"],
        int(os.environ["RANK"]),
        os.environ.get("AICLUSTER_NODE"),
        int(os.environ["AICLUSTER_ATTEMPT"]),
    )
    writer.write("start")
    print("HOLDING", flush=True)
    deadline, step = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        step += 1
        writer.write("step", step=step)
        time.sleep(1.0)


if __name__ == "__main__":
    main()
