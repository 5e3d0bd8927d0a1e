"""Service limits on the real Prefect server: deployment concurrency from prefect.yaml, the machine's CPU slots,
and a merge past its timeout ending Failed/TimedOut with the same reason in DynamoDB."""

from __future__ import annotations

import os
import threading
import time
import uuid
from datetime import UTC
from pathlib import Path

import pytest
import yaml

from flows.etl import ndjson_ingest, ndjson_merge
from tasks.core import faults, limits
from tasks.etl import keys
from tests.helpers.etl import DAY, records, write_input
from tests.helpers.prefect_runs import prefect_server_process

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

LIMITS = yaml.safe_load((Path(__file__).resolve().parents[2] / "prefect.yaml").read_text())["definitions"]["limits"]


def deployment_with(client, spec: dict) -> uuid.UUID:
    """A deployment of a throwaway flow with prefect.yaml's concurrency ``spec`` (limit + collision strategy)."""
    from prefect.client.schemas.objects import ConcurrencyOptions

    flow_id = client.create_flow_from_name(f"limits-{uuid.uuid4().hex[:8]}")
    return client.create_deployment(
        flow_id=flow_id,
        name="burst",
        concurrency_limit=spec["limit"],
        concurrency_options=ConcurrencyOptions(collision_strategy=spec["collision_strategy"]),
    )


def propose_pending(client, runs) -> list[str]:
    """Each run proposes Pending as a worker does; the state name each one ends in."""
    from prefect.states import Pending

    return [client.set_flow_run_state(run.id, Pending()).state.name for run in runs]


def finish(client, run) -> None:
    from prefect.states import Completed, Running

    client.set_flow_run_state(run.id, Running())
    client.set_flow_run_state(run.id, Completed())


def test_a_burst_of_merges_runs_at_most_the_limit_and_the_rest_wait_their_turn():
    from prefect.client.orchestration import get_client

    spec = LIMITS["merges"]
    assert (spec["limit"], spec["collision_strategy"]) == (3, "ENQUEUE")  # seed 001: Glue max concurrent runs 3
    with get_client(sync_client=True) as client:
        deployment = deployment_with(client, spec)
        runs = [client.create_flow_run_from_deployment(deployment) for _ in range(7)]
        states = propose_pending(client, runs)
        assert states.count("Pending") == 3 and states.count("AwaitingConcurrencySlot") == 4
        done = set()
        while len(done) < len(runs):  # as workers do: finish the active ones, retry the waiting ones
            active = [r for r, s in zip(runs, states) if s == "Pending" and r.id not in done]
            assert 1 <= len(active) <= 3
            for run in active:
                finish(client, run)
                done.add(run.id)
            states = ["done" if r.id in done else s for r, s in zip(runs, states)]
            waiting = [r for r, s in zip(runs, states) if s == "AwaitingConcurrencySlot"]
            for run, state in zip(waiting, propose_pending(client, waiting)):
                states[runs.index(run)] = state
        final = [client.read_flow_run(r.id).state.name for r in runs]
    assert final == ["Completed"] * 7  # nothing lost


def test_a_maintenance_run_due_while_one_is_active_is_cancelled():
    from prefect.client.orchestration import get_client

    spec = LIMITS["one_at_a_time"]
    assert (spec["limit"], spec["collision_strategy"]) == (1, "CANCEL_NEW")
    with get_client(sync_client=True) as client:
        deployment = deployment_with(client, spec)
        first, second = (client.create_flow_run_from_deployment(deployment) for _ in range(2))
        assert propose_pending(client, [first, second]) == ["Pending", "Cancelled"]
        finish(client, first)
        third = client.create_flow_run_from_deployment(deployment)
        assert propose_pending(client, [third]) == ["Pending"]  # the slot is free again once the first ended


def peak_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans running at one instant."""
    running = peak = 0
    for _, step in sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans]):
        running += step
        peak = max(peak, running)
    return peak


HOLD_SLOT = """
import sys, time
from tasks.core import limits
with limits.cpu_slot(2) as index:
    started = time.time()
    print("held", index, flush=True)
    time.sleep(float(sys.argv[1]))
    print(started, time.time(), flush=True)
"""


@pytest.fixture
def slot_holder(tmp_path, monkeypatch):
    """Start a process that holds one of 2 CPU slots (in a folder of the test's own) for ``seconds``."""
    import subprocess
    import sys

    monkeypatch.setenv("PIPELINES_CPU_SLOTS_DIR", str(tmp_path / "slots"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    started: list[subprocess.Popen] = []

    def start(seconds: float) -> subprocess.Popen:
        started.append(
            subprocess.Popen(
                [sys.executable, "-c", HOLD_SLOT, str(seconds)], env=env, stdout=subprocess.PIPE, text=True
            )
        )
        return started[-1]

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_cpu_slots_bound_the_processes_of_one_machine(slot_holder):
    holders = [slot_holder(0.6) for _ in range(5)]
    outputs = [h.communicate(timeout=120)[0].splitlines() for h in holders]
    assert all(h.returncode == 0 for h in holders), outputs
    spans = [tuple(map(float, out[1].split())) for out in outputs]
    assert peak_overlap(spans) == 2  # five processes on two slots: two at a time, never three
    assert {out[0] for out in outputs} == {"held 0", "held 1"}


def test_a_killed_slot_holder_lets_go_of_its_slot_at_once(slot_holder):
    holders = [slot_holder(600) for _ in range(2)]  # both slots, for ten minutes
    held = [int(h.stdout.readline().split()[1]) for h in holders]
    assert sorted(held) == [0, 1]
    waits: list[int] = []
    taken: list[tuple[int, float]] = []

    def take() -> None:
        with limits.cpu_slot(2, on_wait=waits.append) as index:
            taken.append((index, time.monotonic()))

    taker = threading.Thread(target=take)
    taker.start()
    time.sleep(1.0)
    assert waits == [2] and taken == []  # told once that it waits, and still waiting
    killed_at = time.monotonic()
    holders[1].kill()  # SIGKILL: no cleanup of its own runs
    taker.join(10)
    assert [index for index, _ in taken] == [held[1]] and taken[0][1] - killed_at < 1.0  # the killed one's slot


def test_cpu_heavy_tasks_of_a_flow_hold_the_machines_cpu_slots(tmp_path, monkeypatch):
    from prefect import flow, task
    from prefect.task_runners import ThreadPoolTaskRunner

    monkeypatch.setenv("PIPELINES_CPU_SLOTS_DIR", str(tmp_path / "slots"))
    monkeypatch.setenv("PIPELINES_CPU_HEAVY_SLOTS", "2")
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    def heavy(i: int) -> int:
        started = time.monotonic()
        time.sleep(0.5)
        with lock:
            spans.append((started, time.monotonic()))
        return i

    heavy_task = task(limits.holding_cpu_slot(heavy), name="heavy")

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=4))
    def burst() -> list[int]:
        return heavy_task.map(range(4)).result()

    assert burst() == [0, 1, 2, 3]
    assert len(spans) == 4 and peak_overlap(spans) == 2  # without the slots the four threads overlap (peak 4)


@pytest.mark.timeout(
    300, method="thread"
)  # no SIGALRM handler of pytest's: the flow's timeout uses the alarm, as in a worker
def test_a_merge_past_its_timeout_is_timed_out_in_prefect_and_failed_with_the_same_reason_in_dynamodb(
    etl_env, tmp_path
):
    root, table = etl_env["root"], etl_env["table"]
    urls = [write_input(root, DAY, f"t-{i}.ndjson", [{"id": f"t{i}-{k}", "v": k} for k in range(3)]) for i in range(5)]
    ndjson_ingest(file_urls=urls, merge_deployment="ndjson-merge/not-deployed")  # tracked, manifest left pending
    (key,) = [k[1] for k in records(table) if k[1].startswith("MANIFEST#")]
    manifest = keys.manifest_name_from_record_key(key)
    # the merge's first parse in a process loads its Numba kernels (seconds on a loaded machine): done here, so
    # the 3 s run reaches its rename (else the timeout came first and the failure hook's write stalled instead)
    from tasks.etl.ndjson_text import parse_ndjson

    parse_ndjson("file:///warm.ndjson", b'{"a": 1}\n')
    # write 1 takes the manifest; write 2 (the first publish rename) hangs like a request that never answers
    log = tmp_path / "writes.log"
    with faults.inject(at=2, mode="stall", log=str(log)):
        state = ndjson_merge.with_options(timeout_seconds=3)(DAY, manifest, return_state=True)
    assert log.read_text().splitlines()[1].split("\t")[2] == "rename", log.read_text()
    assert (state.type.value, state.name) == ("FAILED", "TimedOut")
    record = records(table)[(DAY, key)]
    assert record["status"] == "failed"
    assert record["error_message"] == state.message == "Flow run exceeded timeout of 3.0 second(s)"
    assert {v["status"].split("#")[0] for k, v in records(table).items() if k[1].endswith(".ndjson")} == {"failed"}


@pytest.mark.sweep  # slow for make test; CI runs it in make test-sweep
@pytest.mark.timeout(600)
def test_the_server_vacuum_deletes_ended_runs_past_retention_and_keeps_the_rest(tmp_path):
    """`make up`'s server settings: runs that ended over 3 days ago go (with their logs); newer or active runs stay."""
    import sqlite3
    from datetime import datetime, timedelta

    from prefect import flow
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Completed, Running

    from deployments.local_stack import server_retention_env

    env = {**server_retention_env(), "PREFECT_SERVER_SERVICES_DB_VACUUM_LOOP_SECONDS": "2"}
    assert env["PREFECT_SERVER_SERVICES_DB_VACUUM_RETENTION_PERIOD"] == str(3 * 86400)
    with prefect_server_process(tmp_path, env) as base, SyncPrefectClient(f"{base}/api") as client:

        @flow(name="retention")
        def retention() -> None:
            """Never run: its runs' states are set by the test."""

        def run_that(end_days_ago: float | None):
            """A run that ended that many days ago (None: running); the clock injected into the server's database."""
            run = client.create_flow_run(retention, name=f"ended-{end_days_ago}")
            client.set_flow_run_state(run.id, Running(), force=True)
            if end_days_ago is not None:
                client.set_flow_run_state(run.id, Completed(), force=True)
                with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:
                    (stored,) = db.execute("SELECT end_time FROM flow_run WHERE id = ?", (str(run.id),)).fetchone()
                    ended = datetime.fromisoformat(stored) - timedelta(days=end_days_ago)
                    db.execute("UPDATE flow_run SET end_time = ? WHERE id = ?", (ended.isoformat(sep=" "), str(run.id)))
            return run.id

        def event_that(days_ago: float) -> str:
            """An event that occurred that many days ago (a landed batch's, say); its resource id."""
            resource = f"retention.{uuid.uuid4().hex}"
            occurred = datetime.now(UTC) - timedelta(days=days_ago)
            client.request(
                "POST",
                "/events",
                json=[
                    {
                        "id": str(uuid.uuid4()),
                        "occurred": occurred.isoformat(),
                        "event": "pipelines.etl.object.tracked",
                        "resource": {"prefect.resource.id": resource},
                    }
                ],
            )
            return resource

        def events_of(resource: str) -> int:
            found = client.request(
                "POST",
                "/events/filter",
                json={"filter": {"resource": {"id": [resource]}, "occurred": {"since": "2000-01-01T00:00:00Z"}}},
            )
            return len(found.json()["events"])

        old, recent, active = run_that(4), run_that(2.9), run_that(None)
        old_event, recent_event = event_that(4), event_that(2.9)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                client.read_flow_run(old)
            except ObjectNotFound:
                if events_of(old_event) == 0 and events_of(recent_event) == 1:
                    break
            time.sleep(1)
        else:
            pytest.fail("the run that ended 4 days ago, or the event of 4 days ago, was not vacuumed")
        assert client.read_flow_run(recent).state.is_completed()
        assert client.read_flow_run(active).state.is_running()
        assert events_of(recent_event) == 1


def test_make_up_starts_the_server_with_the_retention_settings(monkeypatch):
    """The retention above is what `make up`'s server runs with (3 days unless PIPELINES_PREFECT_RETENTION_DAYS)."""
    from deployments import local_stack

    monkeypatch.setenv("PIPELINES_PREFECT_RETENTION_DAYS", "2")
    env = local_stack.prefect_server_env()  # what the supervisor's `serve-server` starts the server with
    assert env["PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED"] == "events,flow_runs,orphans"
    assert env["PREFECT_SERVER_SERVICES_DB_VACUUM_RETENTION_PERIOD"] == str(2 * 86400)
    assert env["PREFECT_SERVER_EVENTS_RETENTION_PERIOD"] == f"PT{2 * 86400}S"


def test_make_up_drops_the_cpu_heavy_tag_limit_an_older_version_created(monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from deployments import local_stack

    monkeypatch.setattr(local_stack, "local_env", lambda: {})  # the session's server, not the stack's
    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag=limits.CPU_HEAVY_TAG, concurrency_limit=2)
        assert local_stack.drop_stale_tag_limits() == [limits.CPU_HEAVY_TAG]
        with pytest.raises(ObjectNotFound):
            client.read_concurrency_limit_by_tag(limits.CPU_HEAVY_TAG)
    assert local_stack.drop_stale_tag_limits() == []  # nothing left to drop: make up is idempotent


# --------------------------------------------------------------------------- who can reach the CPU slots


def test_the_cpu_slots_live_in_a_private_folder_of_their_user(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELINES_CPU_SLOTS_DIR", raising=False)
    monkeypatch.setenv("PIPELINES_RUNTIME_DIR", str(tmp_path / "runtime"))
    with limits.cpu_slot(1):
        folder = limits.cpu_slots_dir()
    assert folder == tmp_path / "runtime" / "cpu-slots"
    for path in (folder, folder.parent):
        assert (path.stat().st_uid, path.stat().st_mode & 0o777) == (os.getuid(), 0o700)


@pytest.mark.parametrize("mode", [0o777, 0o755, 0o710])
def test_a_slot_folder_others_may_reach_is_refused(tmp_path, monkeypatch, mode):
    from tasks.core.private_folder import NotPrivate

    folder = tmp_path / "slots"
    folder.mkdir()
    folder.chmod(mode)  # pre-created by someone who would hold every slot
    monkeypatch.setenv("PIPELINES_CPU_SLOTS_DIR", str(folder))
    with pytest.raises(NotPrivate, match="others may reach it"):
        with limits.cpu_slot(1):
            pass
    assert list(folder.iterdir()) == []  # not a slot file made in it


def test_a_slot_folder_another_user_owns_is_refused(tmp_path, monkeypatch):
    from tasks.core.private_folder import NotPrivate

    if os.getuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    folder = tmp_path / "slots"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    monkeypatch.setenv("PIPELINES_CPU_SLOTS_DIR", str(folder))
    with pytest.raises(NotPrivate, match="belongs to uid 65534"):
        limits.cpu_slots_dir()


# --------------------------------------------------------------------------- `make up` on a running stack


def test_make_up_deploys_again_only_when_what_deployments_are_made_from_changed(tmp_path, monkeypatch):
    """`prefect deploy` (here its effect: a deployment on the pool, the CLI taking a minute or two) runs on the
    first `up`, not on the next while nothing changed, and again after prefect.yaml or a flow changed or the server
    lost one."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from deployments import local_stack

    pool = f"up-{uuid.uuid4().hex[:6]}"
    (tmp_path / "flows").mkdir()
    (tmp_path / "prefect.yaml").write_text("deployments: []\n")
    (tmp_path / "flows" / "a.py").write_text("A = 1\n")
    monkeypatch.setattr(local_stack, "local_env", lambda: {})  # the session's server, not the stack's
    monkeypatch.setattr(local_stack, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(local_stack, "RUN", tmp_path / "run")
    monkeypatch.setattr(local_stack, "DEPLOYED", tmp_path / "run" / "deployed.json")
    monkeypatch.setattr(local_stack, "WORK_POOL", pool)
    deploys = []

    def prefect_cli(*args, **_):
        assert args[:2] == ("--no-prompt", "deploy")
        with get_client(sync_client=True) as client:
            flow_id = client.create_flow_from_name(f"up-{uuid.uuid4().hex[:6]}")
            deploys.append(client.create_deployment(flow_id, "local", work_pool_name=pool))

    monkeypatch.setattr(local_stack, "_prefect", prefect_cli)
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        assert local_stack.deploy_all().startswith("deployed") and len(deploys) == 1
        assert local_stack.deploy_all().startswith("unchanged") and len(deploys) == 1
        (tmp_path / "flows" / "a.py").write_text("A = 2\n")  # a flow changed
        assert local_stack.deploy_all().startswith("deployed") and len(deploys) == 2
        assert local_stack.deploy_all().startswith("unchanged")
        (tmp_path / "prefect.yaml").write_text("deployments: [] # edited\n")
        assert local_stack.deploy_all().startswith("deployed") and len(deploys) == 3
        client.delete_deployment(deploys[0])  # the server lost one (its database reset, a person deleted it)
        assert local_stack.deploy_all().startswith("deployed") and len(deploys) == 4
        assert local_stack.deploy_all().startswith("unchanged") and len(deploys) == 4


def test_the_server_runs_on_postgresql_where_installed_and_on_sqlite_with_a_warning_otherwise(
    tmp_path, monkeypatch, capsys
):
    from deployments import local_stack, postgres_local
    from deployments.dynamodb_local import StackError

    monkeypatch.setattr(local_stack, "DATA", tmp_path)
    monkeypatch.setattr(local_stack, "RUN", tmp_path / "run")
    monkeypatch.setattr(local_stack, "SERVER_DB", "")  # PREFECT_SERVER_DB unset
    running: set[str] = set()
    monkeypatch.setattr(local_stack, "_pid", lambda name: 1 if name in running else None)
    monkeypatch.setattr(postgres_local, "missing", lambda: None)
    assert local_stack.server_db() == "postgres"
    assert local_stack.server_database_env()["PREFECT_SERVER_DATABASE_CONNECTION_URL"].startswith(
        "postgresql+asyncpg://"
    )

    monkeypatch.setattr(postgres_local, "missing", lambda: "PostgreSQL is missing: install it")
    assert local_stack.server_db() == "sqlite" and local_stack.server_database_env() == {}
    assert local_stack.start_postgres() == "not used"
    assert 'WARNING: the Prefect server runs on SQLite, which reports "database is locked"' in capsys.readouterr().out

    monkeypatch.setattr(local_stack, "SERVER_DB", "sqlite")  # asked for: no warning
    assert local_stack.start_postgres() == "not used" and capsys.readouterr().out == ""

    monkeypatch.setattr(local_stack, "SERVER_DB", "")
    monkeypatch.setattr(postgres_local, "missing", lambda: None)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "prefect-server.database").write_text("sqlite")
    running.add("prefect-server")  # a server running on SQLite keeps it until `make down`
    assert local_stack.server_db() == "sqlite"
    running.clear()

    def refuses(*args):
        raise StackError("the `postgres` user cannot reach /x: a folder above it is private (mode 700?)")

    monkeypatch.setattr(postgres_local, "init", refuses)
    assert local_stack.start_postgres() == "failed"  # by default: SQLite, said so
    assert "WARNING: PostgreSQL could not start (the `postgres` user cannot reach" in capsys.readouterr().out
    assert local_stack.server_db() == "sqlite"
    monkeypatch.setattr(local_stack, "SERVER_DB", "postgres")  # asked for by name: the error, no fallback
    with pytest.raises(StackError, match="cannot reach"):
        local_stack.start_postgres()
