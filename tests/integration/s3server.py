"""A real S3-compatible HTTP server for the data-store tests, started by the test.

Debian ships no SeaweedFS package (``apt-cache policy seaweedfs seaweedfs-bin`` finds none), so
the server is moto's ``ThreadedMotoServer`` (a test dependency in pyproject.toml): a real HTTP
server on 127.0.0.1 at a port it picks, speaking the S3 protocol that ``obstore`` signs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import boto3
from moto.server import ThreadedMotoServer

from aicluster.artifacts.storage import StorageSettings

#: moto takes any credentials; these only need to be the same on both sides.
KEY_ID, SECRET = "testing", "testing-secret"


@contextmanager
def s3_server(bucket: str = "datasets") -> Iterator[StorageSettings]:
    """A running S3 server with ``bucket`` made, as the data store's settings."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=bucket)
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
        server.stop()
