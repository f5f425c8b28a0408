"""Says who it runs as and how it was started, and whether it can read a path it is given."""

import os
import sys

import helper_mod

helper_mod.start_heartbeat()
print(f"uid {os.getuid()} gid {os.getgid()}", flush=True)
print(f"warm {os.environ.get('AICLUSTER_WARM_STARTED', '0')}", flush=True)
for path in sys.argv[1:]:
    try:
        with open(path) as handle:
            print(f"read {path}: ALLOWED {handle.read(20)!r}", flush=True)
    except OSError as error:
        print(f"read {path}: denied {type(error).__name__}", flush=True)
