"""Test fixtures: a real DynamoDB Local (in memory) and an ephemeral Prefect server for the whole session.

Every test gets its own tables (unique names) and its own object-store folder, so tests never see each
other's records.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from deployments import dynamodb_local

# credentials and region for DynamoDB Local; set before any boto3 client exists
os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW"] = "ignore"

REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_OUTPUT = REPO_ROOT / "test-output"


def pytest_terminal_summary(terminalreporter):
    """How many crash points each pipeline's sweep exercised (issue: print them per pipeline)."""
    from tests.crashpoints import SUMMARY

    if SUMMARY:
        terminalreporter.section("crash points")
        for line in SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def dynamodb_endpoint():
    """DynamoDB Local on a free port (or the one in AWS_ENDPOINT_URL_DYNAMODB if it already answers)."""
    preset = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
    if preset:
        from urllib.parse import urlparse

        parsed = urlparse(preset)
        if dynamodb_local.port_open(parsed.hostname, parsed.port):
            yield preset
            return
    port = dynamodb_local.free_port()
    TEST_OUTPUT.mkdir(exist_ok=True)
    process = dynamodb_local.start(port, db_path=None, log_path=TEST_OUTPUT / "dynamodb-local.log")
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = endpoint
    try:
        yield endpoint
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="session", autouse=True)
def prefect_server(dynamodb_endpoint):
    """One ephemeral Prefect server (prefect_test_harness) for the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def tables(monkeypatch) -> dict[str, str]:
    """Fresh tables for this test (logical -> physical name), exposed to the code through TABLE_* variables."""
    from blocks.base import clear_cache
    from tasks.core import state_store
    from tasks.core.tables import TABLE_SPECS, default_names, ensure_tables

    suffix = uuid.uuid4().hex[:8]
    names = {logical: f"{physical}-{suffix}" for logical, physical in default_names("test").items()}
    for logical in TABLE_SPECS:
        monkeypatch.setenv(f"TABLE_{logical.upper()}", names[logical])
    clear_cache()
    state_store.reset_clients()
    ensure_tables(names)
    return names


@pytest.fixture
def store_root(tmp_path, monkeypatch) -> Path:
    """This test's object-store folder, exposed as OBJECT_STORE_BASE_URL."""
    root = tmp_path / "objects"
    root.mkdir()
    monkeypatch.setenv("OBJECT_STORE_BASE_URL", root.as_uri())
    return root


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server on loopback (tests/s3.py), started once for the tests that need an S3 API."""
    from tests.s3 import moto_server

    with moto_server(TEST_OUTPUT / "moto-s3.log") as endpoint:
        yield endpoint


@pytest.fixture
def s3_base(s3_endpoint, monkeypatch) -> str:
    """This test's own bucket as the object store: OBJECT_STORE_BASE_URL=s3://bucket/pipelines, AWS_ENDPOINT_URL_S3."""
    from tests.s3 import new_bucket

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    base = f"s3://{new_bucket(s3_endpoint)}/pipelines"
    monkeypatch.setenv("OBJECT_STORE_BASE_URL", base)
    return base


@pytest.fixture
def webhook():
    """A webhook receiver on loopback for notification blocks: ``(url, received JSON bodies)``."""
    from tests.webhooks import webhook_receiver

    with webhook_receiver() as hook:
        yield hook

