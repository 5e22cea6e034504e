"""An S3-compatible endpoint on loopback for the cluster test: moto's server mode (PyPI `moto`,
extra `server`), an S3 API in one Python process, objects kept in its memory.

moto rather than MinIO or another server: it installs with pip into the test environment (no
binary download, no root), starts in a second or two, and is an S3 API that the S3A connector
talks to as to AWS (path-style requests to a custom endpoint). It accepts any access key; the
test's keys are random so that it can look for them where they must not appear.

    with s3_server(folder) as s3:
        s3.create_bucket("lake")
        s3.endpoint                    # http://127.0.0.1:<port>
        s3.keys("lake", "lake/")       # the object keys under a prefix
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.ports import free_port

START_SECONDS = 60.0
REGION = "us-east-1"


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]
    access_key: str = field(default_factory=lambda: "AK" + secrets.token_hex(8).upper())
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(30), repr=False)

    def client(self):  # noqa: ANN201 (boto3's client type is generated at run time)
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def hadoop_settings(self) -> dict[str, str]:
        """The S3A connector's settings for this endpoint, secrets excluded."""
        return {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.endpoint.region": REGION,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.aws.credentials.provider": (
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
            ),
        }

    def secret_settings(self) -> dict[str, str]:
        return {"fs.s3a.access.key": self.access_key, "fs.s3a.secret.key": self.secret_key}


def _up(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


@contextmanager
def s3_server(folder: Path) -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port, stopped on exit; its output in
    `folder`/moto.log."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = (folder / "moto.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_SECONDS
        # Polling the port: the server offers no readiness signal of its own.
        while not _up(endpoint):
            if process.poll() is not None:
                raise RuntimeError(f"moto's server exited: see {folder / 'moto.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto's server did not answer in {START_SECONDS:.0f}s")
            time.sleep(0.2)
        yield S3Server(endpoint, process)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()
