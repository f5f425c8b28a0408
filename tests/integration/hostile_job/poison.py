"""A hostile job: poisons everything of its run the control plane reads, then exits.

``telemetry`` (2 ranks): rank 0 writes telemetry of every wrong shape among valid records,
makes folders named with non-ASCII digits, forges exit records and a stop file saying it
succeeded, then keeps deleting its telemetry file and writing it anew, poison included; rank 1
puts a FIFO where its telemetry goes. Rank 0 exits 3. ``export`` (1 rank): exports a FIFO as
model.json and a link to the server's admin token as code, exits 0. ``export-link``: model.json
is that link.
"""

import json
import os
import sys
import time
from pathlib import Path

mode, target = sys.argv[1], sys.argv[2]  # target: a server file to point links at
rank = int(os.environ["RANK"])
run_dir = Path(os.environ["AICLUSTER_RUN_DIR"])
telemetry = Path(os.environ["AICLUSTER_TELEMETRY_FILE"])
export = run_dir.parent / "export"


def step(number: int, **fields: object) -> bytes:
    record = {"kind": "step", "rank": rank, "time": time.time(), "step": number, "loss": 1.0}
    return (json.dumps({**record, **fields}) + "\n").encode()


def poison(with_8mb_line: bool) -> bytes:
    """Telemetry of every wrong shape, each bad line followed by a valid record."""
    bad = [
        step(1, time=None),
        b"[1]\n",
        b"null\n",
        b"\xff\xfe\xfd not UTF-8\n",
        b'{"kind": "step", "time": NaN}\n',
        b'{"kind": "step", "time": 1e999}\n',
        step(1, rank="0", step=True),
        step(1, metrics=[1, 2]),
        b"[" * 100_000 + b"\n",
    ]
    if with_8mb_line:
        bad.append(b"x" * (8 << 20) + b"\n")
    return b"".join(line + step(number) for number, line in enumerate(bad, start=1))


def poison_telemetry() -> None:
    with telemetry.open("ab") as out:
        out.write(poison(with_8mb_line=True))
    for folder in (run_dir / "²", run_dir / "١", run_dir.parent / "²", run_dir.parent / "٣"):
        folder.mkdir(exist_ok=True)
    (run_dir / "rank-².telemetry.jsonl").write_text("[1]\n")
    forged = {"rank": 0, "exit_code": 0, "stopped": False, "finished_at": time.time()}
    for name in ("rank-0.exit.json", "rank-1.exit.json"):
        (run_dir / name).write_text(json.dumps(forged))
    (run_dir / "stop.json").write_text(json.dumps({"time": time.time()}))
    for name in ("rank-0.log", "rank-0.err"):
        (run_dir / name).symlink_to(target)
    print("POISONED", flush=True)
    time.sleep(6)  # the control plane polls every second: it reads all of the above
    # Deleted while the control plane reads it, and written anew with the poison: on a loaded
    # machine a poll can come late, after the first deletion (the reader then starts over).
    for round_ in range(6):
        telemetry.unlink()
        telemetry.write_bytes(poison(with_8mb_line=False) + step(100 + round_))
        time.sleep(1.5)
    sys.exit(3)


def fifo_telemetry() -> None:
    telemetry.unlink(missing_ok=True)
    os.mkfifo(telemetry)
    time.sleep(9)


def poison_export(link_meta: bool) -> None:
    (export / "code").mkdir(parents=True, exist_ok=True)
    (export / "code" / "model.py").symlink_to(target)
    if link_meta:
        (export / "model.json").symlink_to(target)
    else:
        os.mkfifo(export / "model.json")
    print("POISONED", flush=True)
    time.sleep(3)


if mode == "telemetry":
    poison_telemetry() if rank == 0 else fifo_telemetry()
else:
    poison_export(link_meta=mode == "export-link")
