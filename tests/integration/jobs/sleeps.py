"""A test job that only sleeps ``argv[1]`` seconds (no torch: it starts fast)."""

import sys
import time

time.sleep(float(sys.argv[1]))
