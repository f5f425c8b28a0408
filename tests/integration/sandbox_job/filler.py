"""A job that writes more to its run directory than the cluster lets one job keep."""

import os
import time
from pathlib import Path

import helper_mod

helper_mod.start_heartbeat()
run_dir = Path(os.environ["AICLUSTER_RUN_DIR"])
for index in range(40):  # 400 MiB at most, 10 MiB a file, then a long wait to be stopped in
    (run_dir / f"fill-{index}.bin").write_bytes(os.urandom(10 << 20))
    time.sleep(0.1)
time.sleep(60)
print("never stopped", flush=True)
