"""Another tenant's job: sleeps (bounded) so that a neighbour can try to reach it."""

import os
import sys
import time
from pathlib import Path

import helper_mod

helper_mod.start_heartbeat()

run_dir = Path(os.environ["AICLUSTER_RUN_DIR"])
(run_dir / "victim-secret.txt").write_text("tenant b's data\n")
print(f"victim running as uid {os.getuid()}", flush=True)
deadline = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 120)
while time.monotonic() < deadline:
    time.sleep(0.2)
print("victim done", flush=True)
