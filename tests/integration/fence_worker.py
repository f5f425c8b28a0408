"""A child process for the fencing test (run as a script): a leader that writes without pause.

fence_worker.py URL   take the leader lease (print "leader EPOCH"), then append events through
                      the store fenced by its epoch, one transaction each, never checking its own
                      lease deadline; print "refused N" and exit once a write is refused
"""

from __future__ import annotations

import sys

from sqlalchemy.exc import DBAPIError

from aicluster.store import LeaseLost, Store, leader_lock


def main() -> int:
    store = Store.open(sys.argv[1])
    lease = leader_lock(store, holder="fence-worker")
    if not lease.acquire(timeout=30, poll=0.2) or lease.fence is None:
        print("standby", flush=True)
        return 1
    fenced = store.fenced(lease.fence)
    print(f"leader {lease.epoch}", flush=True)
    written = 0
    while True:
        try:
            with fenced._write() as connection:
                fenced._log(connection, actor="fence-worker", kind="test.write", details={})
            written += 1
        except LeaseLost:
            print(f"refused {written}", flush=True)
            return 0
        except DBAPIError as error:  # e.g. the server ended our session while we were frozen
            print(f"error {type(error.orig).__name__}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
