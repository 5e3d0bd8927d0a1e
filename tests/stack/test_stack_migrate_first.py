"""`up` migrates before the code that reads the data starts: a whole stack of its own (a data folder of its own, free
ports) is brought up, then brought up again with a migration registered, as a release that ships one does. The
migration records which of the stack's programs the supervisor had started when it ran: the stores (DynamoDB Local,
PostgreSQL, the Prefect server) answer, and neither the engine fork server, nor the worker, nor the listeners' keeper
runs, old code or new. After `up` every program runs again, and `up` prints the same lines as the first time."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks.server_load import stack
from deployments.supervisor import Supervisor, socket_for
from tests.helpers.crashpoints import REPO_ROOT, child_command
from tests.helpers.prefect_runs import wait_for
from tests.helpers.stack_probe import own_stack

pytestmark = pytest.mark.sweep  # a whole stack, up twice (the first deploys every pipeline): ~3 minutes

CONSUMERS = ("engine", "worker", "listeners")  # the programs that run the release's code on the stores
STARTED = ("STARTING", "RUNNING", "BACKOFF")  # a program the supervisor has started (or is starting again)
MIGRATED_TABLE = "ecs_node"  # rows from the first `up` on (its GPU nodes), so the second one's migration applies


def up_with_a_migration(name: str, table: str, record: str) -> None:
    """The child: `local_stack up` with one more migration registered, whose ``apply`` writes to ``record`` the
    supervisor's state of every program of the stack when it first runs."""
    from deployments import local_stack
    from tasks.core import migrations

    def apply(item: dict, names: dict) -> None:
        if not os.path.exists(record):
            statuses = {info["name"]: info["statename"] for info in local_stack.supervisor().statuses()}
            Path(record).write_text(json.dumps(statuses))

    migrations.MIGRATIONS = (*migrations.MIGRATIONS, migrations.Migration(name, table, apply))
    local_stack.up()


def _up(env: dict[str, str], migration: str, record: Path) -> str:
    """`local_stack up` of the stack in ``env`` with ``migration`` registered; what it printed."""
    call = "tests.stack.test_stack_migrate_first:up_with_a_migration"
    kwargs = {"name": migration, "table": MIGRATED_TABLE, "record": str(record)}
    result = subprocess.run(
        child_command(call, kwargs), cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, f"up failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def _labels(output: str) -> list[str]:
    """The part each printed line names, with its state: `engine           started` -> ('engine', 'started')."""
    return [line[:25].strip() for line in output.splitlines() if line[:16].strip() in (*CONSUMERS, "listener keeper")]


@pytest.mark.timeout(1800)
def test_up_migrates_before_the_engine_worker_and_listeners_start():
    folder, data, env = own_stack("migrate-first-")
    supervisor = Supervisor(data, socket_for(data))

    def all_running() -> bool:
        states = {info["name"]: info["statename"] for info in supervisor.statuses()}
        return set(CONSUMERS) <= set(states) and set(states.values()) == {"RUNNING"}

    try:
        first = _up(env, "9001-test-on-a-fresh-stack", folder / "first.json")
        assert "migration        applied to 0 items 9001-test-on-a-fresh-stack" in first, first  # its tables empty
        wait_for(all_running, 120, "every program running after the first up")
        record = folder / "second.json"
        second = _up(env, "9002-test-on-a-running-stack", record)
        assert "9002-test-on-a-running-stack" in second and record.exists(), second

        seen = json.loads(record.read_text())
        stores = [name for name in ("dynamodb", "postgres", "prefect-server") if name in seen]
        assert {"dynamodb", "prefect-server"} <= set(stores), seen
        assert all(seen[name] in STARTED for name in stores), seen  # the server restarted: STARTING for 10 s
        assert not {name: state for name, state in seen.items() if state in STARTED and name not in stores}, (
            "a program that runs the code on the data started before the migration",
            seen,
        )

        # every program runs again, and the second `up` says so as the first said it started them
        wait_for(all_running, 120, "every program running after the second up")
        assert _labels(first) == ["engine           started", "worker           started", "listener keeper  started"]
        assert _labels(second) == ["engine           running", "worker           running", "listener keeper  running"]
    finally:
        with contextlib.suppress(Exception):
            print(stack("down", env))
        shutil.rmtree(folder, ignore_errors=True)
    assert not supervisor.running()
