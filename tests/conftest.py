"""Settings every test needs before anything imports Ray, and the test helpers' import path."""

import os
import sys
from pathlib import Path

# Ray binds 127.0.0.1 rather than the machine's external address (see DESIGN.md).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Ray's workers (Serve replicas, ranks, warm starters) run at the niceness of everything else the
# suite starts (servers, load generators, builds), not Ray's 15: on 2 cores a nice-0 process has
# 28 times a nice-15 one's share (weights 1024 and 36), and replicas starting beside another
# test file's busy processes were not scheduled in 120 s (CI, at a load of 20). A deployment
# keeps Ray's default; here the harness is the other tenant.
os.environ.setdefault("RAY_worker_niceness", "0")
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "integration"))

# pytest-xdist's workers run with COLUMNS=80; the CLI's output in a pipe is tested unbounded.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

pytest_plugins = ["filetimes"]  # time per test file, printed at the end (tests/filetimes.py)

# Ray's token authentication for every Ray cluster and driver of the session, as `aicluster up`
# turns it on (aicluster.runtime.cluster.rayauth, not imported here: it imports Ray, which reads
# these variables when first imported). The token's folder is this session's, root's only.
if "RAY_AUTH_MODE" not in os.environ:
    import atexit
    import secrets
    import shutil
    import tempfile

    _RAY_AUTH_DIR = Path(tempfile.mkdtemp(prefix="aicluster-test-ray-auth-"))
    atexit.register(shutil.rmtree, _RAY_AUTH_DIR, True)
    (_RAY_AUTH_DIR / "ray.token").write_text(secrets.token_hex(32))
    (_RAY_AUTH_DIR / "ray.token").chmod(0o600)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(_RAY_AUTH_DIR / "ray.token")
