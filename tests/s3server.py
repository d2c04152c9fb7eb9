"""An S3-compatible test server (moto's server mode) on a free port of 127.0.0.1.

Shared by the object-storage tests and ``bench/chaos.py``.  :func:`s3_environment` also
points the ``AWS_*`` variables at the server for its duration and clears fsspec's cached S3
clients on the way in and out (a client cached for one server must never talk to the next).
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Iterator

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


class S3Server:
    def __init__(self, *buckets: str) -> None:
        from moto.server import ThreadedMotoServer

        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.url = f"http://127.0.0.1:{port}"
        for bucket in buckets:
            self.create_bucket(bucket)

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The ``AWS_*`` variables for this server (or for ``endpoint``, a proxy in front of it)."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint or self.url}

    def create_bucket(self, name: str) -> None:
        import boto3

        creds = self.env()
        boto3.client(
            "s3", endpoint_url=self.url, region_name=creds["AWS_DEFAULT_REGION"],
            aws_access_key_id=creds["AWS_ACCESS_KEY_ID"], aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
        ).create_bucket(Bucket=name)

    def stop(self) -> None:
        self.server.stop()


def clear_s3_clients() -> None:
    import fsspec

    fsspec.filesystem("s3").clear_instance_cache()


@contextlib.contextmanager
def s3_environment(*buckets: str) -> Iterator[S3Server]:
    """A server holding ``buckets``, with ``AWS_*`` pointing at it until the block ends."""
    server = S3Server(*buckets)
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    clear_s3_clients()
    try:
        yield server
    finally:
        clear_s3_clients()
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
