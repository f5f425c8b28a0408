"""A rank that ignores SIGTERM, to check that stop() escalates to SIGKILL after the grace."""

import os
import signal
import time

signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
print(f"started pid {os.getpid()}", flush=True)
while True:
    time.sleep(0.1)
