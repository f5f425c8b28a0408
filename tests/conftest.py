"""Settings every test needs before anything imports Ray, and the test helpers' import path."""

import os
import sys
from pathlib import Path

# Ray binds 127.0.0.1 rather than the machine's external address (see DESIGN.md).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "integration"))
