"""A real S3-protocol server on 127.0.0.1 (moto's server mode) for the object storage tests.

:func:`s3_server` is a session-scoped fixture (import it into a test module to use it): it starts one server
per test process on a free port, points ``AWS_ENDPOINT_URL`` at it with dummy credentials (and keeps the
user's ``~/.aws`` and instance metadata out), and stops it at the end. Tests upload what the helpers wrote
locally with :meth:`S3Server.upload` and read it back through collapse-doctor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
    "AWS_CONFIG_FILE": "/nonexistent/config",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_MAX_ATTEMPTS": "1",
}
"""Dummy credentials and nothing from the machine: no profile, no instance role, one attempt per request."""


@dataclass
class S3Server:
    endpoint: str
    client: Any
    """A boto3 S3 client of the server."""

    def bucket(self, name: str) -> str:
        """Create bucket ``name`` (once) and return ``s3://name``."""
        with contextlib.suppress(self.client.exceptions.BucketAlreadyOwnedByYou):
            self.client.create_bucket(Bucket=name)
        return f"s3://{name}"

    def upload(self, local: Path, url: str) -> str:
        """Upload a file, or every file below a directory (keys keep their relative paths), under ``url``."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        files = sorted(p for p in local.rglob("*") if p.is_file()) if local.is_dir() else [local]
        for path in files:
            relative = path.relative_to(local).as_posix() if local.is_dir() else path.name
            key = f"{prefix.rstrip('/')}/{relative}" if prefix else relative
            self.client.upload_file(str(path), bucket, key)
        return url

    def require_signatures(self, enabled: bool) -> None:
        """Make the server check credentials (an unknown access key is refused) or accept any again."""
        data = b"0" if enabled else b"inf"
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth", data=data, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    import boto3
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as patch:
        for name, value in ENVIRONMENT.items():
            patch.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            patch.delenv(name, raising=False)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            patch.setenv("AWS_ENDPOINT_URL", endpoint)
            assert os.environ["AWS_ENDPOINT_URL"] == endpoint
            yield S3Server(endpoint=endpoint, client=boto3.client("s3", endpoint_url=endpoint))
        finally:
            server.stop()
