"""The Prefect server's database migrates itself as the server starts: the local stack keeps Prefect's
migrate-on-start on for PostgreSQL and SQLite, and a server started on a database of the previous schema (a copy
downgraded one Alembic revision) comes up with it at the current one."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest

from deployments import local_stack

SETTING = "PREFECT_SERVER_DATABASE_MIGRATE_ON_START"


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_the_stack_server_keeps_prefect_migrating_its_database_at_start(database, tmp_path, monkeypatch):
    monkeypatch.setattr(local_stack, "SERVER_DB", database)
    monkeypatch.setattr(local_stack, "DATA", tmp_path)
    assert local_stack.prefect_server_env()[SETTING] == "true"


def _prefect(home, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "PREFECT_SERVER_DATABASE"))}
    subprocess.run(
        [sys.executable, "-m", "prefect", "server", "database", *args, "-y"],
        env={**env, "PREFECT_HOME": str(home)},
        check=True,
        capture_output=True,
        timeout=300,
    )


def _revision(home) -> str:
    with sqlite3.connect(home / "prefect.db") as db:
        return db.execute("select version_num from alembic_version").fetchone()[0]


@pytest.mark.sweep
def test_a_server_started_on_a_database_of_the_previous_schema_comes_up_migrated(tmp_path, monkeypatch):
    monkeypatch.setattr(local_stack, "DATA", tmp_path / "stack")
    home = tmp_path / "prefect"
    home.mkdir()
    _prefect(home, "reset")
    current = _revision(home)
    _prefect(home, "downgrade", "-r", "-1")
    assert _revision(home) != current  # the previous release's schema
    migrate = {SETTING: local_stack.prefect_server_env()[SETTING]}
    with local_stack.throwaway_prefect_server(home, migrate) as base:
        import urllib.request

        with urllib.request.urlopen(f"{base}/api/health", timeout=10) as answer:
            assert answer.status == 200
        assert _revision(home) == current
