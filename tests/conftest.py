"""Test-wide settings: Ray must bind 127.0.0.1 on this machine and in CI."""

import os
import sys
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, str(Path(__file__).parent))
