"""A tiny TCP prober the job-network tests run inside namespaces (``nsenter --net=... python
netprobe.py ...``); standard library only, so it starts in tens of milliseconds.

``serve PORT...``: listen on every address (IPv4 and IPv6, ``[::]`` dual-stack) at each port (0:
any), print the bound ports as a JSON list, answer each connection ``ok``; until killed.
``connect TIMEOUT HOST,PORT...``: try each target at once; print JSON ``{target: outcome}``,
outcome ``open`` (the server answered ``ok``), ``refused``, ``timeout`` or an error's name.
"""

from __future__ import annotations

import json
import socket
import sys
import threading


def serve(ports: list[int]) -> None:
    listeners = []
    for port in ports:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", port))
        sock.listen(16)
        listeners.append(sock)
    print(json.dumps([s.getsockname()[1] for s in listeners]), flush=True)

    def answer(sock: socket.socket) -> None:
        while True:
            conn, _ = sock.accept()
            with conn:
                conn.sendall(b"ok")

    threads = [threading.Thread(target=answer, args=(s,), daemon=True) for s in listeners]
    for thread in threads:
        thread.start()
    threading.Event().wait()


def _try(target: str, timeout: float, results: dict[str, str]) -> None:
    host, port = target.rsplit(",", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as conn:
            results[target] = "open" if conn.recv(2) == b"ok" else "silent"
    except ConnectionRefusedError:
        results[target] = "refused"
    except TimeoutError:
        results[target] = "timeout"
    except OSError as error:
        results[target] = type(error).__name__


def connect(timeout: float, targets: list[str]) -> None:
    results: dict[str, str] = {}
    threads = [threading.Thread(target=_try, args=(t, timeout, results)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve([int(p) for p in sys.argv[2:]])
    else:
        connect(float(sys.argv[2]), sys.argv[3:])
