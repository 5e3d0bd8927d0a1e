"""The local stack as a service: `make down` stops what runs."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from deployments import dynamodb_local, local_stack, postgres_local
from tasks.gpu.backends import pid_alive


@pytest.fixture
def stack_data(monkeypatch):
    """A stack data folder under /tmp (the `postgres` user, as root, can reach it) with its own PostgreSQL port."""
    try:
        postgres_local.bindir()
    except dynamodb_local.StackError as error:
        pytest.skip(str(error))
    folder = Path(tempfile.mkdtemp(prefix="stack-"))
    folder.chmod(0o755)
    monkeypatch.setattr(local_stack, "DATA", folder)
    monkeypatch.setattr(local_stack, "RUN", folder / "run")
    monkeypatch.setattr(local_stack, "LOGS", folder / "logs")
    monkeypatch.setattr(local_stack, "POSTGRES_PORT", dynamodb_local.free_port())
    monkeypatch.setattr(local_stack, "PREFECT_PORT", dynamodb_local.free_port())  # no server: no listeners to stop
    yield folder
    postgres_local.stop(folder / "postgres", seconds=10)
    shutil.rmtree(folder, ignore_errors=True)


def _wait_gone(pid: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while pid_alive(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} still runs")
        time.sleep(0.1)


def _start_again(data: Path, log: Path) -> None:
    """Start the cluster again as a supervisor would: retried while the killed postmaster's orphaned backends still
    hold its shared memory."""
    deadline = time.monotonic() + 60
    while postgres_local.postmaster_pid(data) is None:
        try:
            postgres_local.start(local_stack.POSTGRES_PORT, data, log)
        except dynamodb_local.StackError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_make_down_stops_a_postgresql_that_was_killed_and_started_again(stack_data, capsys):
    data = stack_data / "postgres"
    first = postgres_local.start(local_stack.POSTGRES_PORT, data, stack_data / "logs" / "postgres.log")
    local_stack.RUN.mkdir(parents=True)
    (local_stack.RUN / "postgres.pid").write_text(str(first.pid))  # what `make up` recorded
    killed = postgres_local.postmaster_pid(data)
    os.kill(killed, signal.SIGKILL)
    first.wait(timeout=30)
    _wait_gone(killed)
    _start_again(data, stack_data / "logs" / "postgres.log")
    running = postgres_local.postmaster_pid(data)
    assert running not in (None, killed)

    local_stack.down()

    assert "postgres         stopped now" in capsys.readouterr().out
    assert postgres_local.postmaster_pid(data) is None
    assert not pid_alive(running)
    assert not dynamodb_local.port_open("127.0.0.1", local_stack.POSTGRES_PORT)
