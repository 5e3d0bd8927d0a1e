"""Test fixtures: a real DynamoDB Local (in memory) and an ephemeral Prefect server, each started once, for the
tests that ask for them.

A module asks for both with ``pytestmark = pytest.mark.servers``; a test asks for DynamoDB alone through ``tables``
(or ``dynamodb_endpoint``). Every other test is pure: it runs with neither, and a call it makes to either fails at
once (DynamoDB's endpoint is a closed port, Prefect has no API and starts none), so a pure test cannot lean on a
server another test started. Every test gets its own tables (unique names) and its own object-store folder, so
tests never see each other's records.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from deployments import dynamodb_keys, dynamodb_local

# the session's own random DynamoDB key, set before any boto3 client exists: the relay in front of the session's
# DynamoDB Local forwards only requests signed with it (an endpoint named in AWS_ENDPOINT_URL_DYNAMODB keeps the
# environment's key, that endpoint's)
if not (os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") and os.environ.get("AWS_ACCESS_KEY_ID")):
    dynamodb_keys.use_fresh_key()
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
# until a test asks for DynamoDB, its endpoint is a port nothing listens on: a pure test's call fails at once
NO_DYNAMODB = "http://127.0.0.1:9"
os.environ.setdefault("AWS_ENDPOINT_URL_DYNAMODB", NO_DYNAMODB)
os.environ["PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW"] = "ignore"
# the session's launch key (tasks/core/seal.py), before anything reads it: every process a test starts inherits it
os.environ.setdefault("PIPELINES_LAUNCH_KEY", secrets.token_hex(32))

# every property test draws the same examples on every run and has no deadline or speed check: CI is never red by
# the luck of a draw or a loaded machine (a module's own settings start from this profile)
settings.register_profile("repeatable", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("repeatable")

REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_OUTPUT = REPO_ROOT / "test-output"

# the shared helpers (tests/helpers/) get pytest's assertion messages, as the test modules do; the fixtures of
# these modules serve every test module
pytest.register_assert_rewrite("tests.helpers")
pytest_plugins = [
    "tests.helpers.etl",
    "tests.helpers.gpu",
    "tests.helpers.health",
    "tests.helpers.landing",
    "tests.helpers.moto_server",
    "tests.helpers.video",
]


def pytest_terminal_summary(terminalreporter):
    """How many crash points each pipeline's sweep exercised (issue: print them per pipeline)."""
    from tests.helpers.crashpoints import SUMMARY

    if SUMMARY:
        terminalreporter.section("crash points")
        for line in SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def _no_prefect_server_unless_asked():
    """No test starts a Prefect server by calling its API: only ``prefect_server`` does (ephemeral mode off)."""
    from prefect.settings import temporary_settings

    with temporary_settings(updates={"server.ephemeral.enabled": False}):
        yield


def pytest_collection_modifyitems(items):
    """Crash-point sweeps and slow deployment runs drive flows on the stack: they ask for the servers."""
    for item in items:
        if item.get_closest_marker("sweep") or item.get_closest_marker("crashpoints"):
            item.add_marker(pytest.mark.servers)


@pytest.fixture(scope="module", autouse=True)
def _servers_when_asked(request):
    """DynamoDB Local and the Prefect server for a module with a test marked ``servers``, before its own fixtures."""
    if not any(item.get_closest_marker("servers") for item in request.session.items if item.module is request.module):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        _point_at(patch, request.getfixturevalue("dynamodb_server"))
        request.getfixturevalue("prefect_server")
        yield


@pytest.fixture(scope="session")
def dynamodb_server():
    """DynamoDB Local on a free port, loopback only where the machine allows it (or the one in
    AWS_ENDPOINT_URL_DYNAMODB if it already answers): its endpoint, which a test's environment names only while it
    asks for it (``dynamodb_endpoint``, ``tables``, the ``servers`` mark)."""
    preset = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
    if preset and preset != NO_DYNAMODB:
        from urllib.parse import urlparse

        parsed = urlparse(preset)
        if dynamodb_local.port_open(parsed.hostname, parsed.port):
            yield preset
            return
    port = dynamodb_local.free_port()
    TEST_OUTPUT.mkdir(exist_ok=True)
    process = dynamodb_local.start_private(port, db_path=None, log_path=TEST_OUTPUT / "dynamodb-local.log")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        dynamodb_local.stop(process)


def _point_at(patch: pytest.MonkeyPatch, endpoint: str) -> None:
    """The code (and every process it starts) reaches DynamoDB at ``endpoint`` until ``patch`` is undone."""
    from tasks.core import state_store

    patch.setenv("AWS_ENDPOINT_URL_DYNAMODB", endpoint)
    state_store.reset_clients()


@pytest.fixture
def dynamodb_endpoint(dynamodb_server, monkeypatch) -> Iterator[str]:
    """The session's DynamoDB Local, named by AWS_ENDPOINT_URL_DYNAMODB for this test only."""
    from tasks.core import state_store

    _point_at(monkeypatch, dynamodb_server)
    yield dynamodb_server
    state_store.reset_clients()


@pytest.fixture(scope="session")
def prefect_server(dynamodb_server):
    """One ephemeral Prefect server (prefect_test_harness) for the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def _fresh_tables(monkeypatch) -> dict[str, str]:
    """Fresh tables (logical -> physical name), exposed to the code through TABLE_* variables."""
    from blocks.base import clear_cache
    from tasks.core import registry, state_store
    from tasks.core.tables import ensure_tables

    suffix = uuid.uuid4().hex[:8]
    names = {logical: f"{physical}-{suffix}" for logical, physical in registry.default_table_names("test").items()}
    for logical in names:
        monkeypatch.setenv(f"TABLE_{logical.upper()}", names[logical])
    clear_cache()
    state_store.reset_clients()
    ensure_tables(registry.table_specs(), names)
    return names


@pytest.fixture
def tables(dynamodb_endpoint, monkeypatch) -> dict[str, str]:
    """Fresh tables for this test (logical -> physical name), exposed to the code through TABLE_* variables."""
    return _fresh_tables(monkeypatch)


@pytest.fixture(scope="module")
def module_tables(dynamodb_server) -> Iterator[dict[str, str]]:
    """Fresh tables shared by one module's tests, each test using ids of its own (many small scenarios)."""
    with pytest.MonkeyPatch.context() as patch:
        _point_at(patch, dynamodb_server)
        yield _fresh_tables(patch)


@pytest.fixture
def record_alarms_only(monkeypatch):
    """pipeline-health with the record alarms only: the service alarms read every run on the shared test server
    (tests/health/test_health_service_alarms.py has them)."""
    from tests.helpers.health import only_record_alarms

    only_record_alarms(monkeypatch.setattr)


@pytest.fixture
def store_root(tmp_path, monkeypatch) -> Path:
    """This test's object-store folder, exposed as OBJECT_STORE_BASE_URL."""
    root = tmp_path / "objects"
    root.mkdir()
    monkeypatch.setenv("OBJECT_STORE_BASE_URL", root.as_uri())
    return root


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server on loopback (tests/helpers/s3.py), started once for the tests that need an S3 API."""
    from tests.helpers.s3 import moto_server

    with moto_server(TEST_OUTPUT / "moto-s3.log") as endpoint:
        yield endpoint


@pytest.fixture
def s3_base(s3_endpoint, monkeypatch) -> str:
    """This test's own bucket as the object store (OBJECT_STORE_BASE_URL=s3://bucket/pipelines, AWS_ENDPOINT_URL_S3) and
    its own Glue database on the same moto server (AWS_ENDPOINT_URL_GLUE, ETL_CATALOG_DATABASE)."""
    from tests.helpers.s3 import new_bucket

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    base = f"s3://{new_bucket(s3_endpoint)}/pipelines"
    monkeypatch.setenv("OBJECT_STORE_BASE_URL", base)
    # objects on S3 are catalogued in Glue: moto's, in a database of this test's own (the server is the session's)
    monkeypatch.setenv("AWS_ENDPOINT_URL_GLUE", s3_endpoint)
    monkeypatch.setenv("ETL_CATALOG_DATABASE", f"db_{uuid.uuid4().hex[:8]}")
    return base


class WebhookServer:
    """A webhook receiver on loopback: records every POST and answers it with ``status`` (200 unless set)."""

    def __init__(self):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.status = 200
        self.posts: list[dict] = []  # {"path", "status" answered, "body"}, failed deliveries included
        self.received: list[dict] = []  # the JSON body of every post, in order
        server = self

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                server.posts.append({"path": self.path, "status": server.status, "body": body})
                server.received.append(body)
                self.send_response(server.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        self.url = f"http://127.0.0.1:{self._http.server_port}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving and free the port."""
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def webhook_server():
    """A real webhook on loopback for notification blocks; set ``.status`` (e.g. 500) to simulate an outage."""
    server = WebhookServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def webhook(webhook_server):
    """A webhook receiver on loopback for notification blocks: ``(url, received JSON bodies)``."""
    yield f"{webhook_server.url}/hook", webhook_server.received
