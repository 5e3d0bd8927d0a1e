"""Shared benchmark setup: a private DynamoDB Local on a free port, and timing helpers."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@contextlib.contextmanager
def dynamodb_local():
    """Start an in-memory DynamoDB Local for this benchmark (unless AWS_ENDPOINT_URL_DYNAMODB is set)."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if os.environ.get("AWS_ENDPOINT_URL_DYNAMODB"):
        yield os.environ["AWS_ENDPOINT_URL_DYNAMODB"]
        return
    from deployments import dynamodb_local as ddb

    port = ddb.free_port()
    process = ddb.start(port, None)
    os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = f"http://127.0.0.1:{port}"
    try:
        yield os.environ["AWS_ENDPOINT_URL_DYNAMODB"]
    finally:
        process.kill()
        process.wait()


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def median(values) -> float:
    return statistics.median(values)
