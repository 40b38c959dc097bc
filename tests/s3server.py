"""A real S3-compatible server for tests: moto in server mode on a free local port, reached by
s3fs over HTTP exactly as a bucket is (endpoint, credentials, signed requests; nothing patched).

Example (in a test module)::

    from s3server import s3_fixture  # noqa: F401  (registers the fixture ``s3``)

    def test_x(s3):
        run = inspector.open_run(f"s3://{s3.bucket}/runs/a", storage_options=s3.options)
"""
from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass

import pytest


@dataclass
class S3:
    endpoint: str
    bucket: str
    options: dict

    def url(self, name: str) -> str:
        """A fresh prefix in the bucket for one test: ``s3://<bucket>/<name>-<random>``."""
        return f"s3://{self.bucket}/{name}-{uuid.uuid4().hex[:8]}"

    def filesystem(self, cls=None):
        """A new (uncached) s3fs filesystem on this server; ``cls``: a subclass, e.g. one that counts."""
        import s3fs
        return (cls or s3fs.S3FileSystem)(skip_instance_cache=True, **self.options)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session", name="s3")
def s3_fixture():
    """The server, started once per test session, with one bucket (moto, flask: requirements.txt)."""
    server_mod = pytest.importorskip("moto.server", reason="moto and flask (requirements.txt) run the S3 server")
    s3fs = pytest.importorskip("s3fs")
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
               "client_kwargs": {"region_name": "eu-west-1"}}
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    try:
        fs.mkdir("tf-inspector-test")
    except FileExistsError:  # moto's buckets live in the process: another module's server made it
        pass
    try:
        yield S3(endpoint, "tf-inspector-test", options)
    finally:
        server.stop()
