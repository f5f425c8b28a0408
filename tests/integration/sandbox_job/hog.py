"""A job that takes more memory than its spec asked for, 64 MiB at a time, touching every page."""

import time

import helper_mod

helper_mod.start_heartbeat()
held = []
for _ in range(64):  # 4 GiB at most: far over any limit the test sets
    held.append(bytearray(64 << 20))
    time.sleep(0.05)
print("never limited", flush=True)
