"""Settings every test needs before anything imports Ray."""

import os

# Ray binds 127.0.0.1 rather than the machine's external address (see DESIGN.md).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
