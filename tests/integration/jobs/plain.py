"""A script that knows nothing of aicluster nor of torch (a new user's first job): it prints,
sleeps ``--sleep`` seconds and exits 0, or raises ``--raise``'s message as a ValueError."""

import argparse
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=0)  # given to every test job; unused here
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--raise", dest="error", default="")
args = parser.parse_args()
print("a plain script", flush=True)
time.sleep(args.sleep)
if args.error:
    raise ValueError(args.error)
