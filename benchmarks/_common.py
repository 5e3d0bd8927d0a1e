"""Shared benchmark setup: a private DynamoDB Local on a free port, and timing helpers."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


_created_tables: list[str] = []


def ensure_table(name: str, spec) -> str:
    """``tasks.core.tables.ensure_table`` for a benchmark's own table, removed again when ``dynamodb_local`` ends."""
    from tasks.core.tables import ensure_table as ensure

    state = ensure(name, spec)
    if state == "created":
        _created_tables.append(name)
    return state


def drop_created_tables() -> list[str]:
    """Delete the tables this benchmark created (in the stack's DynamoDB they would otherwise stay); their names."""
    from tasks.core import state_store

    dropped = []
    while _created_tables:
        name = _created_tables.pop()
        try:
            state_store.client().delete_table(TableName=name)
            dropped.append(name)
        except Exception as error:  # noqa: BLE001 - report, keep removing the others
            print(f"could not delete benchmark table {name}: {error}", file=sys.stderr)
    return dropped


@contextlib.contextmanager
def dynamodb_local():
    """Start an in-memory DynamoDB Local for this benchmark (unless AWS_ENDPOINT_URL_DYNAMODB is set).

    Tables made through ``ensure_table`` are deleted at the end, also when the endpoint is the stack's. A launch key
    of its own seals what the benchmark launches (unless PIPELINES_LAUNCH_KEY is set: the stack's)."""
    import secrets

    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("PIPELINES_LAUNCH_KEY", secrets.token_hex(32))
    if os.environ.get("AWS_ENDPOINT_URL_DYNAMODB"):
        try:
            yield os.environ["AWS_ENDPOINT_URL_DYNAMODB"]
        finally:
            dropped = drop_created_tables()
            if dropped:
                print(f"(deleted benchmark tables: {', '.join(dropped)})")
        return
    from deployments import dynamodb_keys
    from deployments import dynamodb_local as ddb

    dynamodb_keys.use_fresh_key()  # its own DynamoDB Local's key
    port, logs = ddb.free_port(), Path(tempfile.mkdtemp(prefix="bench-dynamodb-"))
    process = ddb.start_private(port, None, logs / "dynamodb.log")
    os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = f"http://127.0.0.1:{port}"
    try:
        yield os.environ["AWS_ENDPOINT_URL_DYNAMODB"]
    finally:
        drop_created_tables()
        ddb.stop(process)
        shutil.rmtree(logs, ignore_errors=True)


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def median(values) -> float:
    return statistics.median(values)
