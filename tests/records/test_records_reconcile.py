"""Prefect <-> DynamoDB reconciliation with real flow runs: a SIGKILLed worker, failed tasks, state events.

Run as a script, this module is the worker: a flow whose task moves a chunk IN_PROGRESS (with its Prefect run
ids) through the state store, then sleeps until it is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from prefect import flow, task
from prefect.runtime import flow_run, task_run

from tasks.core import state_store
from tasks.phspectra.keys import RUN_SK, chunk_sk

REPO_ROOT = Path(__file__).resolve().parents[2]


def _ids() -> dict[str, str]:
    return {k: str(v) for k, v in (("prefect_flow_run_id", flow_run.id), ("prefect_task_run_id", task_run.id)) if v}


def _start_chunk(run_id: str, start: int) -> None:
    """What a pipeline worker does first: PENDING -> IN_PROGRESS with its Prefect run ids."""
    from tasks.core import config

    result = state_store.transition(
        config.table_name("phspectra_runs"),
        {"PK": run_id, "SK": chunk_sk(start)},
        "PENDING",
        "IN_PROGRESS",
        set={"started_at": "2026-01-01T00:00:01Z", **_ids()},
    )
    assert result.applied, result


@task(name="fit-chunk-then-hang")
def fit_chunk_then_hang(run_id: str, start: int, ready: str) -> None:
    _start_chunk(run_id, start)
    Path(ready).write_text("in progress")
    time.sleep(300)


@flow(name="records-test-worker")
def worker(run_id: str, start: int, ready: str) -> None:
    fit_chunk_then_hang(run_id, start, ready)


if __name__ == "__main__":  # the worker subprocess
    worker(sys.argv[1], int(sys.argv[2]), sys.argv[3])
    raise SystemExit(0)


# --------------------------------------------------------------------------- tests

import pytest  # noqa: E402 - run as a script, the worker above needs none of the tests' imports

from flows.records import records_prefect_state, records_reconcile  # noqa: E402 - after the worker, as pytest is
from tasks import reconcile  # noqa: E402 - after the worker, as pytest is
from tests.helpers.prefect_runs import crash_event, task_run_state, wait_for  # noqa: E402 - after the worker, as pytest is

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


def _seed_run(table: str, run_id: str, chunks: dict[int, str], completed: int = 0, failed: int = 0) -> None:
    state_store.create_if_absent(
        table,
        {"PK": run_id, "SK": RUN_SK, "jobs_total": len(chunks), "jobs_completed": completed, "jobs_failed": failed},
        ["PK", "SK"],
    )
    for start, status in chunks.items():
        state_store.create_if_absent(
            table,
            {"PK": run_id, "SK": chunk_sk(start), "status": status, "created_at": "2026-01-01T00:00:00Z"},
            ["PK", "SK"],
        )


def _item(table, run_id, sk):
    return state_store.to_plain(state_store.get_item(table, {"PK": run_id, "SK": sk}))


@pytest.mark.timeout(180)
def test_killed_worker_is_reconciled_to_zero_disagreements(tables, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings
    from prefect.states import Crashed

    table = tables["phspectra_runs"]
    run_id = "run-kill"
    # chunk 0 goes to the worker; chunk 1 finished earlier but its counter was never added (drift)
    _seed_run(table, run_id, {0: "PENDING", 1: "COMPLETED"})
    ready = tmp_path / "ready"
    env = dict(
        os.environ, PREFECT_API_URL=get_current_settings().api.url, PIPELINES_USE_BLOCKS="0", PYTHONPATH=str(REPO_ROOT)
    )
    process = subprocess.Popen(
        [sys.executable, __file__, run_id, "0", str(ready)],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(ready.exists, 120, "the worker to move its chunk IN_PROGRESS")
        chunk = _item(table, run_id, chunk_sk(0))
        assert chunk["status"] == "IN_PROGRESS"
        wait_for(lambda: task_run_state(chunk["prefect_task_run_id"]) == "RUNNING", 30, "the task run in the API")
        process.send_signal(signal.SIGKILL)  # no hooks, no final state: the worker is simply gone
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL
    # a GPU task record that the same flow run had in flight (seed 002 table)
    state_store.create_if_absent(
        tables["ecs_task"],
        {"ecs_task_id": "task-1", "task_status": "IN_PROGRESS", "prefect_flow_run_id": chunk["prefect_flow_run_id"]},
        ["ecs_task_id"],
    )
    state_store.create_if_absent(
        tables["ecs_task"],
        {"ecs_task_id": "task-2", "task_status": "COMPLETE", "prefect_flow_run_id": chunk["prefect_flow_run_id"]},
        ["ecs_task_id"],
    )

    # Stand-in for the server's missed-heartbeat (zombie) detection, which marks the flow run Crashed.
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(
            chunk["prefect_flow_run_id"], Crashed(message="worker lost (heartbeat missed)"), force=True
        )
    assert task_run_state(chunk["prefect_task_run_id"]) == "RUNNING"  # Prefect leaves the task run Running

    before = reconcile.disagreements()
    assert sorted((f.pipeline, f.record, f.problem) for f in before) == [
        ("gpu", "task-1", "IN_PROGRESS while Prefect Crashed"),
        ("phspectra", f"{run_id}/CHUNK#chunk-0000000", "IN_PROGRESS while Prefect Crashed"),
        ("phspectra", f"{run_id}/RUN", "run counters do not match chunk items"),
    ]
    assert _item(table, run_id, chunk_sk(0))["status"] == "IN_PROGRESS"  # the dry run changed nothing

    findings = records_reconcile(dry_run=False)
    assert sorted((f["record"], f["outcome"]) for f in findings) == [
        ("run-kill/CHUNK#chunk-0000000", "applied"),
        ("run-kill/RUN", "applied"),
        ("task-1", "applied"),
    ]
    assert reconcile.disagreements() == []
    chunk = _item(table, run_id, chunk_sk(0))
    assert chunk["status"] == "FAILED" and chunk["error"].startswith(
        "reconciled: record IN_PROGRESS while Prefect flow run"
    )
    run = _item(table, run_id, RUN_SK)
    assert (run["jobs_completed"], run["jobs_failed"]) == (1, 1)
    gpu = state_store.to_plain(state_store.get_item(tables["ecs_task"], {"ecs_task_id": "task-1"}))
    assert gpu["task_status"] == "TERMINATED" and gpu["termination_reason"].startswith("reconciled: record IN_PROGRESS")
    done = state_store.get_item(tables["ecs_task"], {"ecs_task_id": "task-2"})
    assert done == {
        "ecs_task_id": "task-2",
        "task_status": "COMPLETE",
        "prefect_flow_run_id": chunk["prefect_flow_run_id"],
    }
    # a second pass finds nothing and changes nothing
    assert records_reconcile(dry_run=False) == []


@task(name="start-then-fail")
def start_then_fail(run_id: str, start: int) -> str:
    _start_chunk(run_id, start)
    raise RuntimeError("fit exploded")


@task(name="complete-then-fail")
def complete_then_fail(run_id: str, start: int) -> str:
    from tasks.core import config

    _start_chunk(run_id, start)
    table = config.table_name("phspectra_runs")
    state_store.transition(
        table,
        {"PK": run_id, "SK": chunk_sk(start)},
        "IN_PROGRESS",
        "COMPLETED",
        increments=[state_store.Increment(table, {"PK": run_id, "SK": RUN_SK}, {"jobs_completed": 1})],
    )
    raise RuntimeError("crashed after the record was written")


@flow(name="records-test-failing")
def failing(run_id: str) -> None:
    a = start_then_fail.submit(run_id, 0)
    b = complete_then_fail.submit(run_id, 1)
    a.wait()
    b.wait()


def test_task_failed_events_move_their_records(tables):
    table = tables["phspectra_runs"]
    run_id = "run-events"
    _seed_run(table, run_id, {0: "PENDING", 1: "PENDING"})
    failing(run_id, return_state=True)
    chunks = [_item(table, run_id, chunk_sk(i)) for i in (0, 1)]
    assert [c["status"] for c in chunks] == ["IN_PROGRESS", "COMPLETED"]
    for c in chunks:
        wait_for(lambda c=c: task_run_state(c["prefect_task_run_id"]) == "FAILED", 30, "the task run's Failed state")

    from prefect.events import Event

    for c in chunks:  # what a deployment trigger on prefect.task-run.Failed hands over: `{{ event | tojson }}`
        event = Event(
            event="prefect.task-run.Failed",
            resource={"prefect.resource.id": f"prefect.task-run.{c['prefect_task_run_id']}"},
            related=[
                {
                    "prefect.resource.id": f"prefect.flow-run.{c['prefect_flow_run_id']}",
                    "prefect.resource.role": "flow-run",
                }
            ],
        )
        records_prefect_state(event.model_dump(mode="json"))
    assert [_item(table, run_id, chunk_sk(i))["status"] for i in (0, 1)] == ["FAILED", "FAILED"]
    run = _item(table, run_id, RUN_SK)
    assert (run["jobs_completed"], run["jobs_failed"]) == (0, 2)
    assert reconcile.disagreements(["phspectra"]) == []
    with pytest.raises(ValueError, match="not a Prefect flow-run/task-run event"):
        reconcile.run_ids_from_event(
            {"event": "prefect.deployment.triggered", "resource": {"prefect.resource.id": "x"}}
        )


def test_transition_rule_table():
    got = {
        (role, state): reconcile.transition_for(role, state)
        for role in ("in_flight", "completed")
        for state in ("RUNNING", "COMPLETED", "FAILED", "CRASHED", "CANCELLED", "PENDING")
    }
    assert got == {
        ("in_flight", "RUNNING"): None,
        ("in_flight", "COMPLETED"): "failed",
        ("in_flight", "FAILED"): "failed",
        ("in_flight", "CRASHED"): "failed",
        ("in_flight", "CANCELLED"): "failed",
        ("in_flight", "PENDING"): None,
        ("completed", "RUNNING"): None,
        ("completed", "COMPLETED"): None,
        ("completed", "FAILED"): "failed",
        ("completed", "CRASHED"): "failed",
        ("completed", "CANCELLED"): "failed",
        ("completed", "PENDING"): None,
    }


def test_etl_manifest_and_video_job_follow_their_crashed_flow_runs(tables):
    """Records held by a whole flow run (a merge's MANIFEST, a video job being chunked) move when it crashes: the
    MANIFEST back to pending (re-driven), the video job failed."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed, Running

    from tasks import reconcile

    @flow(name="records-test-held")
    def held() -> None:
        pass

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(held)
        crashed = client.create_flow_run(held, state=Running())
        client.set_flow_run_state(crashed.id, Crashed(message="worker killed"), force=True)
        alive = client.create_flow_run(held, state=Running())
    assert flow_id
    tracking, jobs = tables["etl_file_tracking"], tables["video_jobs"]
    finished_task = str(uuid.uuid4())  # the task that wrote the record ended long ago: only the flow run counts
    for name, run in (("batch-0001-20260201-000000.json", crashed), ("batch-0002-20260201-000000.json", alive)):
        state_store.put(
            tracking,
            {
                "date_prefix": "2026-02-01",
                "file_key": f"MANIFEST#{name}",
                "status": "processing",
                "manifest_path": f"manifests/2026-02-01/{name}",
                "prefect_flow_run_id": str(run.id),
                "prefect_task_run_id": finished_task,
            },
        )
    state_store.put(
        tracking,
        {
            "date_prefix": "2026-02-01",
            "file_key": "a.ndjson",
            "status": "manifested#3",
            "prefect_flow_run_id": str(crashed.id),
        },
    )  # file records are not the adapter's
    for job_id, run in (("job-crashed", crashed), ("job-alive", alive)):
        state_store.put(
            jobs,
            {
                "job_id": job_id,
                "status": "chunking_in_progress",
                "prefect_flow_run_id": str(run.id),
                "prefect_task_run_id": finished_task,
            },
        )

    findings = reconcile.reconcile(["etl", "video"], dry_run=False)
    assert sorted((f.pipeline, f.record, f.outcome) for f in findings) == [
        ("etl", "2026-02-01/MANIFEST#batch-0001-20260201-000000.json", "applied"),
        ("video", "job-crashed", "applied"),
    ]
    manifest = state_store.get_item(
        tracking, {"date_prefix": "2026-02-01", "file_key": "MANIFEST#batch-0001-20260201-000000.json"}
    )
    # killed, not failed: back to pending for the next merge run, which takes it (its files stay with it)
    assert manifest["status"] == "pending" and "Crashed" in manifest["redrive_reason"] and manifest["redrives"] == 1
    assert "prefect_flow_run_id" not in manifest
    assert (
        state_store.get_item(
            tracking, {"date_prefix": "2026-02-01", "file_key": "MANIFEST#batch-0002-20260201-000000.json"}
        )["status"]
        == "processing"
    )
    assert (
        state_store.get_item(tracking, {"date_prefix": "2026-02-01", "file_key": "a.ndjson"})["status"]
        == "manifested#3"
    )
    assert state_store.get_item(jobs, {"job_id": "job-crashed"})["status"] == "failed"
    assert state_store.get_item(jobs, {"job_id": "job-alive"})["status"] == "chunking_in_progress"
    assert reconcile.reconcile(["etl", "video"], dry_run=True) == []  # zero disagreements left


def test_a_completed_chunk_stays_completed_when_its_flow_crashed_before_the_task_state_arrived(tables):
    """Issue 23, 9a (confirmed, then fixed): a COMPLETED chunk whose task run is still Running on the server (or
    was never reported) while its flow run is Crashed kept the flip to FAILED and jobs_completed - 1."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed, Running

    table = tables["phspectra_runs"]
    run_id = "run-crash-after-complete"
    _seed_run(table, run_id, {0: "COMPLETED", 1: "COMPLETED", 2: "IN_PROGRESS"}, completed=2)
    with get_client(sync_client=True) as client:
        crashed = client.create_flow_run(failing, state=Running())
        running_task = client.create_task_run(complete_then_fail, crashed.id, "0", state=Running())
        client.set_flow_run_state(crashed.id, Crashed(message="flow process killed"), force=True)
    owners = {0: str(running_task.id), 1: str(uuid.uuid4()), 2: str(uuid.uuid4())}  # 1, 2: never reached the server
    for start, task_run_id in owners.items():
        state_store.transition(
            table,
            {"PK": run_id, "SK": chunk_sk(start)},
            None,
            None,
            set={"prefect_flow_run_id": str(crashed.id), "prefect_task_run_id": task_run_id},
        )
    assert task_run_state(owners[0]) == "RUNNING"

    findings = reconcile.reconcile(["phspectra"], dry_run=False, run_ids={str(crashed.id)})
    # only the chunk that was still in flight moves; the two recorded results stand
    assert [(f.record, f.problem, f.outcome) for f in findings] == [
        (f"{run_id}/CHUNK#chunk-0000002", "IN_PROGRESS while Prefect Crashed", "applied")
    ]
    assert [_item(table, run_id, chunk_sk(i))["status"] for i in range(3)] == ["COMPLETED", "COMPLETED", "FAILED"]
    run = _item(table, run_id, RUN_SK)
    assert (run["jobs_completed"], run["jobs_failed"]) == (2, 1)
    assert reconcile.disagreements(["phspectra"]) == []


def test_a_flow_run_crashed_event_reaches_what_each_pipeline_flow_held(tables):
    """Issue 23, item 2 for every pipeline: the Crashed event of a flow run (what prefect.yaml's trigger hands
    `records-prefect-state`) finds the records that run held, each stored as its flow stores it: a phspectra chunk
    (its fit task's run ids), a GPU task (its gpu-job run's), an ETL manifest and a video job (the flow run's:
    they are held by the whole run). Records of a live run are left alone."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed, Running

    with get_client(sync_client=True) as client:
        crashed, alive = (client.create_flow_run(failing, state=Running()) for _ in range(2))
        fit = client.create_task_run(fit_chunk_then_hang, crashed.id, "0", state=Running())  # never finished
        client.set_flow_run_state(crashed.id, Crashed(message="flow process killed"), force=True)
    for held_by, run_id in ((crashed, "run-held"), (alive, "run-alive")):
        ids = {"prefect_flow_run_id": str(held_by.id)}
        _seed_run(tables["phspectra_runs"], run_id, {0: "PENDING"})
        state_store.transition(
            tables["phspectra_runs"],
            {"PK": run_id, "SK": chunk_sk(0)},
            "PENDING",
            "IN_PROGRESS",
            set={**ids, "prefect_task_run_id": str(fit.id) if held_by is crashed else str(uuid.uuid4())},
        )
        state_store.put(tables["ecs_task"], {"ecs_task_id": f"task-{run_id}", "task_status": "IN_PROGRESS", **ids})
        manifest = f"manifests/2026-02-02/batch-{run_id}.json"
        state_store.put(
            tables["etl_file_tracking"],
            {
                "date_prefix": "2026-02-02",
                "status": "processing",
                **ids,
                "file_key": f"MANIFEST#batch-{run_id}.json",
                "manifest_path": manifest,
            },
        )
        state_store.put(
            tables["etl_file_tracking"],
            {
                "date_prefix": "2026-02-02",
                "file_key": f"{run_id}.ndjson",
                "status": "manifested#1",
                "manifest_path": manifest,
                **ids,
            },
        )
        state_store.put(tables["video_jobs"], {"job_id": f"job-{run_id}", "status": "chunking_in_progress", **ids})

    findings = records_prefect_state(crash_event(crashed.id))
    assert sorted((f["pipeline"], f["record"], f["outcome"]) for f in findings) == [
        ("etl", "2026-02-02/MANIFEST#batch-run-held.json", "applied"),
        ("gpu", "task-run-held", "applied"),
        ("phspectra", "run-held/CHUNK#chunk-0000000", "applied"),
        ("video", "job-run-held", "applied"),
    ]
    statuses = {
        run_id: (
            _item(tables["phspectra_runs"], run_id, chunk_sk(0))["status"],
            state_store.get_item(tables["ecs_task"], {"ecs_task_id": f"task-{run_id}"})["task_status"],
            state_store.get_item(
                tables["etl_file_tracking"], {"date_prefix": "2026-02-02", "file_key": f"MANIFEST#batch-{run_id}.json"}
            )["status"],
            state_store.get_item(
                tables["etl_file_tracking"], {"date_prefix": "2026-02-02", "file_key": f"{run_id}.ndjson"}
            )["status"],
            state_store.get_item(tables["video_jobs"], {"job_id": f"job-{run_id}"})["status"],
        )
        for run_id in ("run-held", "run-alive")
    }
    assert statuses == {
        # a crashed merge's manifest is re-driven (pending, its file still in it); the others fail at once
        "run-held": ("FAILED", "TERMINATED", "pending", "manifested#1", "failed"),
        "run-alive": ("IN_PROGRESS", "IN_PROGRESS", "processing", "manifested#1", "chunking_in_progress"),
    }
    assert records_prefect_state(crash_event(crashed.id)) == []  # a second report finds nothing left to do


def test_records_of_an_in_process_subflow_follow_its_crashed_parent(tables):
    """The fast form of the next test: a subflow run in its parent's process (no deployment) ended with its parent;
    one with a deployment of its own (a `run_deployment` child, another process) did not."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed, Running

    table = tables["phspectra_runs"]
    _seed_run(table, "run-sub", {0: "PENDING", 6: "PENDING"})
    with get_client(sync_client=True) as client:
        parent = client.create_flow_run(failing, state=Running())
        calls = [client.create_task_run(fit_chunk_then_hang, parent.id, str(i), state=Running()) for i in range(2)]
        in_process = client.create_flow_run(worker, parent_task_run_id=calls[0].id, state=Running())
        deployment = client.create_deployment(client.create_flow(worker), "own-process")
        elsewhere = client.create_flow_run_from_deployment(deployment, parent_task_run_id=calls[1].id, state=Running())
        client.set_flow_run_state(parent.id, Crashed(message="flow process killed"), force=True)
    for start, held_by in ((0, in_process), (6, elsewhere)):
        state_store.transition(
            table,
            {"PK": "run-sub", "SK": chunk_sk(start)},
            "PENDING",
            "IN_PROGRESS",
            set={"prefect_flow_run_id": str(held_by.id), "prefect_task_run_id": str(uuid.uuid4())},
        )
    assert reconcile.with_subflows({str(parent.id)}) == {str(parent.id), str(in_process.id)}
    states = reconcile.prefect_states([str(in_process.id), str(elsewhere.id)], [])
    assert (states[str(in_process.id)].type, states[str(elsewhere.id)].type) == ("CRASHED", "RUNNING")

    findings = records_prefect_state(crash_event(parent.id))
    assert [(f["record"], f["outcome"]) for f in findings] == [("run-sub/CHUNK#chunk-0000000", "applied")]
    assert [_item(table, "run-sub", chunk_sk(s))["status"] for s in (0, 6)] == ["FAILED", "IN_PROGRESS"]


@pytest.mark.sweep  # a survey run twice in a child process (~1 min on a loaded machine): `make test-sweep`
@pytest.mark.timeout(600)
def test_a_crashed_survey_reaches_the_chunks_its_fit_subflow_held(tables, store_root, tmp_path):
    """A `phspectra-survey` process SIGKILLed mid-fit: its worker reports only the run it started Crashed, while the
    chunks were claimed by the fit tasks of its in-process `phspectra-fit-chunks` subflow, which stays Running on
    the server. The Crashed event still reaches them (the subflow died with its parent); before, 0 records."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.states import Crashed

    from tests.helpers.crashpoints import killed, run_child
    from tests.helpers.phspectra_survey import fits_cube

    call = "flows.phspectra_survey:phspectra_survey"
    kwargs = {
        "cube_url": fits_cube(tmp_path, ny=3, nx=4, n_channels=32),
        "survey": "grs-crash-event",
        "chunk_size": 6,
        "workers": 1,
        "lease_seconds": 2,
    }  # 2 chunks on one fitting slot, the second claimed ahead; short leases
    # dies once the first fit output lands, however many lease renewals (every 2/3 s here) came before it
    assert killed(run_child(call, {**kwargs, "run_id": "crash-event"}, "1:kill:after:objects:put_bytes:decompositions"))
    with get_client(sync_client=True) as client:
        live = FlowRunFilterStateType(any_=["RUNNING", "PENDING"])
        runs = [
            r
            for r in client.read_flow_runs(flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=live)))
            if r.parameters.get("run_id") == "crash-event"
        ]
        (survey,) = [r for r in runs if r.parent_task_run_id is None]
        (subflow,) = [r for r in runs if r.parent_task_run_id is not None]
        client.set_flow_run_state(survey.id, Crashed(message="flow process killed"), force=True)  # as its worker does
    table = tables["phspectra_runs"]
    chunks = {s: _item(table, "crash-event", chunk_sk(s)) for s in (0, 6)}
    before = {s: chunk["status"] for s, chunk in chunks.items()}
    # the chunk whose output landed first is held; the other one too, unless its own output and COMPLETED landed
    # in the moment between that write and the kill (its thread writes alongside)
    held = [s for s in (0, 6) if before[s] == "IN_PROGRESS"]
    assert held and {chunks[s]["prefect_flow_run_id"] for s in held} == {str(subflow.id)}, chunks

    time.sleep(3)  # the dead fitter's lease (2 s) lapses: the reconciler never takes a chunk whose lease is live
    findings = records_prefect_state(crash_event(survey.id))
    assert [(f["record"], f["problem"], f["outcome"]) for f in findings] == [
        (
            f"crash-event/{chunk_sk(s)}",
            f"IN_PROGRESS while Prefect Crashed (with its parent flow run {survey.id})",
            "applied",
        )
        for s in held
    ]
    assert {s: _item(table, "crash-event", chunk_sk(s))["status"] for s in (0, 6)} == {
        s: "FAILED" if s in held else before[s] for s in (0, 6)
    }  # the others untouched
    assert reconcile.disagreements(["phspectra"]) == []


def test_a_manifest_is_re_driven_only_after_a_crash_and_at_most_max_times(tables):
    """A merge run that Failed (its own reason) fails its MANIFEST; one that Crashed re-drives it, until it has been
    re-driven MAX_MANIFEST_REDRIVES times (a manifest that kills every run it is given), then it fails too."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed, Failed, Running

    from tasks import reconcile
    from tasks.etl.merge import MAX_MANIFEST_REDRIVES

    @flow(name="records-test-merge-ends")
    def merge_like() -> None:
        pass

    with get_client(sync_client=True) as client:
        client.create_flow(merge_like)
        runs = {name: client.create_flow_run(merge_like, state=Running()) for name in ("failed", "crashed", "worn")}
        client.set_flow_run_state(runs["failed"].id, Failed(message="merge error"), force=True)
        for name in ("crashed", "worn"):
            client.set_flow_run_state(runs[name].id, Crashed(message="process killed"), force=True)
    tracking = tables["etl_file_tracking"]
    for name, run in runs.items():
        state_store.put(
            tracking,
            {
                "date_prefix": "2026-02-02",
                "file_key": f"MANIFEST#{name}.json",
                "status": "processing",
                "manifest_path": f"manifests/2026-02-02/{name}.json",
                "prefect_flow_run_id": str(run.id),
                **({"redrives": MAX_MANIFEST_REDRIVES} if name == "worn" else {}),
            },
        )
    reconcile.reconcile(["etl"], dry_run=False)
    status = {
        name: state_store.get_item(tracking, {"date_prefix": "2026-02-02", "file_key": f"MANIFEST#{name}.json"})[
            "status"
        ]
        for name in runs
    }
    assert status == {"failed": "failed", "crashed": "pending", "worn": "failed"}
    assert reconcile.reconcile(["etl"], dry_run=True) == []
