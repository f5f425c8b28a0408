"""An ordinary job of another tenant: a few steps of telemetry, then success."""

import json
import os
import time
from pathlib import Path

telemetry = Path(os.environ["AICLUSTER_TELEMETRY_FILE"])
for number in range(1, 4):
    record = {"kind": "step", "rank": 0, "time": time.time(), "step": number, "loss": 1.0 / number}
    with telemetry.open("a") as out:
        out.write(json.dumps(record) + "\n")
    time.sleep(0.5)
print("NORMAL DONE", flush=True)
