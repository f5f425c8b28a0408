"""A child process for the store's crash and leader tests (run as a script).

store_worker.py submit URL COUNT   submit jobs with keys k0, k1, ...; print each key after
                                   its submit returned (= committed), then exit
store_worker.py lead URL           take the leader lease, print "leader", sleep until killed
store_worker.py open URL           open (and migrate) the store, print "opened"
"""

from __future__ import annotations

import sys
import threading
import time

from aicluster.core import jobspec_from_mapping
from aicluster.store import Store, leader_lock

SPEC = jobspec_from_mapping({"name": "crash", "entrypoint": "t.py", "workers": 2})


def submit(store: Store, count: int, threads: int = 4) -> None:
    lock = threading.Lock()

    def work(first: int) -> None:
        for n in range(first, count, threads):
            store.submit_job("team-a", SPEC, "user:crash", idempotency_key=f"k{n}")
            with lock:
                print(f"k{n}", flush=True)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def main() -> None:
    command, url = sys.argv[1], sys.argv[2]
    store = Store.open(url)
    if command == "submit":
        submit(store, int(sys.argv[3]))
    elif command == "lead":
        lease = leader_lock(store)
        print("leader" if lease.try_acquire() else "standby", flush=True)
        time.sleep(600)
    elif command == "open":
        print("opened", flush=True)
    store.close()


if __name__ == "__main__":
    main()
