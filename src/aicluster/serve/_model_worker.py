"""A served model's code, in its tenant's sandbox: loads the artifact, answers over a socket.

Run as ``python _model_worker.py FD ARTIFACT_DIR`` by :class:`aicluster.serve.sandboxed.
SandboxedPredictor` (the Serve replica, which holds Ray's credentials, stays outside). ``FD`` is
a connected Unix socket; each message either way is a 4-byte big-endian length and JSON::

    -> {"op": "predict", "inputs": {...}}
    <- {"outputs": ...} | {"invalid": "..."} | {"error": "..."}
    -> {"op": "health"}
    <- {"ok": true} | {"error": "..."}

``invalid`` is a ``ValueError`` of the model (bad input: the gateway answers 422); ``error`` any
other exception. The first message it sends is ``{"ready": true}`` once the artifact is loaded,
or ``{"error": ...}`` if it cannot be.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
from pathlib import Path
from typing import Any

_LENGTH = struct.Struct(">I")


def send(conn: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    conn.sendall(_LENGTH.pack(len(data)) + data)


def receive(conn: socket.socket) -> dict[str, Any] | None:
    """The next message, or None once the other side closed."""
    head = _exactly(conn, _LENGTH.size)
    if head is None:
        return None
    body = _exactly(conn, _LENGTH.unpack(head)[0])
    if body is None:
        return None
    message = json.loads(body)
    return message if isinstance(message, dict) else {}


def _exactly(conn: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def answer(predictor: Any, message: dict[str, Any]) -> dict[str, Any]:
    try:
        if message.get("op") == "health":
            hook = getattr(predictor, "check_health", None)
            if hook is not None:
                hook()
            return {"ok": True}
        return {"outputs": predictor.predict(message.get("inputs"))}
    except ValueError as error:
        return {"invalid": str(error) or "invalid input"}
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}


def main() -> None:
    conn = socket.socket(fileno=int(sys.argv[1]))
    try:
        import torch

        torch.set_num_threads(1)  # replicas share few cores
        from aicluster.train.export import load_predictor

        predictor = load_predictor(Path(sys.argv[2]))
    except Exception as error:
        send(conn, {"error": f"cannot load the model: {type(error).__name__}: {error}"})
        return
    send(conn, {"ready": True})
    while (message := receive(conn)) is not None:
        send(conn, answer(predictor, message))


if __name__ == "__main__":
    main()
