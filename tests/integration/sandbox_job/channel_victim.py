"""The squatted tenant's job: says, by hash, which secret reached it, and how it was started."""

import hashlib
import os

value = os.environ.get("API_TOKEN", "")
print("secret sha", hashlib.sha256(value.encode()).hexdigest(), flush=True)
print(f"warm {os.environ.get('AICLUSTER_WARM_STARTED', '0')}", flush=True)
