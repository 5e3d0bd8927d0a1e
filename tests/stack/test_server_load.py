"""The Prefect server under load on PostgreSQL (issue 15.6): `make up` with ``PREFECT_SERVER_DB=postgres`` in a
stack of its own, then a bounded number of concurrent runs of every pipeline (the demo's samples) plus what
they start and the schedules; the server logs no error and every submitted run completes.

The same measurement on SQLite and the comparison are ``benchmarks/server_load.py`` (SQLite reports "database is
locked" under such load; that is why PostgreSQL is offered). This test is also that benchmark's quick run in the sweep:
where PostgreSQL is missing it measures SQLite, and asserts only that every run completes. A few minutes: marker
`sweep` (`make test-sweep`, CI).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.sweep


@pytest.mark.timeout(1500)
def test_a_postgresql_server_under_concurrent_runs_of_every_pipeline_logs_no_error():
    from benchmarks.server_load import measure
    from deployments import postgres_local
    from deployments.dynamodb_local import StackError

    try:
        postgres_local.bindir()
        database = "postgres"
    except StackError:  # the benchmark's quick run on SQLite instead (test_benchmarks_quick leaves it to this test)
        database = "sqlite"
    root = Path(tempfile.mkdtemp(prefix="server-load-"))  # under /tmp: the `postgres` user (as root) can reach it
    root.chmod(0o755)
    before = dict(os.environ)
    try:
        result = measure(database, per_pipeline=1, timeout_s=600, root=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert dict(os.environ) == before  # the stack's settings stay with the stack
    print(result)
    assert result["submitted"] == 5 and result["submitted_outcomes"] == {"Completed": 5}, result
    if database == "postgres":  # SQLite may answer "database is locked" under this load: why PostgreSQL is offered
        assert result["refused_submissions"] == {}, result
        assert result["errors"] == {"database is locked": 0, "ERROR lines": 0, "tracebacks": 0}, result
