"""moto's S3 server on loopback for the S3 end-to-end tests: a real HTTP S3 API that every process reaches.

The server is a child process (``python -m moto.server``), so flow runs, Prefect workers and Dask workers
started by a test reach it through ``AWS_ENDPOINT_URL_S3`` exactly as they would reach AWS without it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3

from deployments.dynamodb_local import free_port, port_open

HOST = "127.0.0.1"
SERVE = (
    "import sys\n"
    "from tests.helpers.moto_server import teach_cloudformation\n"
    "from moto.server import main\n"
    "teach_cloudformation()\n"
    "main(sys.argv[1:])\n"
)


@contextlib.contextmanager
def moto_server(log_path: Path) -> Iterator[str]:
    """Start moto's server on a free loopback port; yields its endpoint URL; stopped on exit."""
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(  # moto's server, taught what tests/helpers/moto_server.py bridges
            [sys.executable, "-c", SERVE, "-H", HOST, "-p", str(port)],
            cwd=Path(__file__).resolve().parents[2],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not port_open(HOST, port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start; see {log_path}")
            time.sleep(0.2)
        yield f"http://{HOST}:{port}"
    finally:
        process.kill()
        process.wait(timeout=10)


def s3_client(endpoint: str):
    """A plain boto3 S3 client of the moto server (to look at what the product wrote)."""
    return boto3.client("s3", endpoint_url=endpoint, region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))


def new_bucket(endpoint: str) -> str:
    """A fresh bucket with a unique name."""
    bucket = f"pipelines-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=bucket)
    return bucket


def object_keys(endpoint: str, bucket: str, prefix: str = "") -> list[str]:
    """Every key in the bucket under ``prefix``, as S3 lists them."""
    pages = s3_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))
