"""A rank of a worker whose ranks share its memory: holds the MiB its rank is given (argv[1],
one number per rank, comma-separated), 50 MiB at a time, touching every page, for argv[2]
seconds, then ends. Imports nothing of aicluster."""

import os
import sys
import time

mib = int(sys.argv[1].split(",")[int(os.environ["RANK"])])
held = [b"x" * (min(50, mib - done) << 20) for done in range(0, mib, 50)]
print(f"rank {os.environ['RANK']} holds {mib} MiB", flush=True)
time.sleep(float(sys.argv[2]))
print("done", flush=True)
