"""Failover figures: how long two control planes on one PostgreSQL store take to replace a
frozen (SIGSTOP) or killed (SIGKILL) leader, in the middle of submissions and running jobs.

The rounds of ``tests/integration/test_control_fencing.py`` (see ``tests/integration/fencing.py``):
an embedded 4-node Ray cluster, two server processes (``python -m aicluster.server``),
``--submissions`` short jobs posted to the standby while the leader runs them; once some run, the
leader is frozen (then woken after the takeover) or killed (then started again as the standby).
Prints, per round, the seconds from the signal to the new holder's lease row (its
``acquired_at``) and to its ``/healthz`` saying it leads, and what the store shows went wrong
(nothing, or the problems). Run:

    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 .venv/bin/python bench/failover.py [--rounds 3]

PostgreSQL: ``--db`` or ``AICLUSTER_TEST_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``); each run works in a schema of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from fencing import pair_of_servers, problems, run_round
from sqlalchemy.engine import make_url

from aicluster.runtime import EmbeddedCluster, embedded_topology

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/test"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="of SIGSTOP and of SIGKILL each")
    parser.add_argument("--submissions", type=int, default=200, help="per round")
    parser.add_argument("--db", default=os.environ.get("AICLUSTER_TEST_PG_URL", DEFAULT_DB))
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    database = make_url(args.db).set(drivername="postgresql+psycopg")
    rows: list[dict[str, object]] = []
    with (
        tempfile.TemporaryDirectory() as work,
        EmbeddedCluster(embedded_topology(nodes=4, gpus_per_node=8)) as cluster,
    ):
        cluster.connect()
        url = database.render_as_string(hide_password=False)
        with pair_of_servers(cluster.address, url, Path(work)) as pair:
            for number in range(args.rounds):
                for how in ("SIGSTOP", "SIGKILL"):
                    prefix = f"{how.lower()}{number}"
                    result = run_round(pair, how, prefix, submissions=args.submissions)
                    found = problems(pair, result, args.submissions)
                    if how == "SIGKILL":
                        result.old.start()  # back as the standby for the next round
                    row = {
                        "signal": how,
                        "takeover_s": round(result.takeover_s, 2),
                        "healthz_s": round(result.leads_s, 2),
                        "epochs": [result.old_epoch, result.new_epoch],
                        "acknowledged": len(result.acked),
                        "ran_after": result.ran_after,
                        "problems": found,
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print(f"{'signal':<9}{'rounds':>7}{'takeover s (median, range)':>30}{'/healthz s':>12}")
    for how in ("SIGSTOP", "SIGKILL"):
        mine = [row for row in rows if row["signal"] == how]
        takeover = [float(str(row["takeover_s"])) for row in mine]
        healthz = [float(str(row["healthz_s"])) for row in mine]
        print(
            f"{how:<9}{len(mine):>7}"
            f"{statistics.median(takeover):>14.1f} ({min(takeover):.1f}-{max(takeover):.1f})"
            f"{statistics.median(healthz):>12.1f}"
        )
    bad = [row for row in rows if row["problems"]]
    print(f"rounds with problems: {len(bad)} of {len(rows)}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
