"""PHSpectra survey (seed 000): outputs equal direct fits, exact counters under retries, kills and resumes,
the seed's five access patterns, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.dataset as ds
import pytest

from deployments.samples.phspectra import synthetic_cube
from tasks.core import keys, state_store
from tasks.core.runtime import iso_ago, now_iso
from tasks.core.state_store import to_plain
from tasks.phspectra import keys as phspectra_keys
from tasks.phspectra import survey as ph
from tests.helpers.phspectra_survey import direct_rows, fits_cube, output_rows, wait_until_leases_expire

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

REPO = Path(__file__).resolve().parents[2]


def chunk_items(run_id: str) -> dict[str, dict]:
    return {c["SK"]: c for c in to_plain(ph.list_chunks(run_id))}


def test_every_spectrum_equals_a_direct_fit_and_records_agree(tables, store_root, tmp_path):
    from flows.phspectra_survey import phspectra_survey

    cube_url = fits_cube(tmp_path, ny=4, nx=6, n_channels=96, nan_channels=3)
    params = {"beta": 3.0, "max_refine_iter": 2}
    summary = phspectra_survey(cube_url=cube_url, survey="grs-15", chunk_size=7, fit_params=params, workers=2)

    run_id = summary["run_id"]
    expected = direct_rows(cube_url, params)
    assert output_rows(store_root, "grs-15", run_id) == expected
    assert len(expected) == 24 and sum(map(len, expected.values())) == summary["n_components"] > 0

    run = to_plain(ph.get_run(run_id))
    assert {k: run[k] for k in ("jobs_total", "jobs_completed", "jobs_failed", "n_spectra", "n_chunks", "status")} == {
        "jobs_total": 4,
        "jobs_completed": 4,
        "jobs_failed": 0,
        "n_spectra": 24,
        "n_chunks": 4,
        "status": "COMPLETED",
    }
    assert run["n_nan_channels"] == 3 and json.loads(run["params"]) == params
    assert (run["GSI1_PK"], run["GSI1_SK"]) == ("grs-15", run["created_at"])
    chunks = chunk_items(run_id)
    assert sorted(chunks) == [phspectra_keys.chunk_sk(s) for s in (0, 7, 14, 21)]
    for sk, chunk in chunks.items():
        start = phspectra_keys.chunk_start_from_sk(sk)
        assert chunk["status"] == "COMPLETED" and chunk["n_spectra"] == (3 if start == 21 else 7)
        assert chunk["output_key"] == phspectra_keys.decomposition_key("grs-15", run_id, start)
        assert chunk["chunk_key"] == phspectra_keys.chunk_npz_key(run_id, start)
        assert chunk["completed_at"] > chunk["started_at"] > chunk["created_at"] and chunk["duration_ms"] > 0
        assert chunk["prefect_flow_run_id"] and chunk["prefect_task_run_id"] and chunk["attempts"] == 1
    # the whole survey as one dataset (hive partitions survey=/run_id=) in pyarrow and duckdb
    root = store_root / phspectra_keys.decomposition_prefix("grs-15")
    table = ds.dataset(root, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 24 and set(table.column("run_id").to_pylist()) == {run_id}
    count, components = duckdb.sql(
        f"SELECT count(*), sum(n_components) FROM read_parquet('{root}/**/*.parquet', hive_partitioning=true) "
        f"WHERE run_id = '{run_id}'"
    ).fetchall()[0]
    assert (count, components) == (24, summary["n_components"])

    from prefect.artifacts import Artifact

    chunk_table = Artifact.get(f"phspectra-chunks-{run_id}")
    assert chunk_table is not None and len(json.loads(chunk_table.data)) == 4
    assert "24 / 24" in Artifact.get(f"phspectra-summary-{run_id}").data
    assert Artifact.get(f"phspectra-progress-{run_id}").data == 100.0


def test_spectra_past_the_time_limit_are_refitted_by_the_slow_lane(tables, store_root, tmp_path):
    from flows.phspectra_survey import phspectra_survey

    cube_url = fits_cube(tmp_path, ny=2, nx=4, n_channels=96, nan_channels=0)
    summary = phspectra_survey(cube_url=cube_url, survey="grs-slow", chunk_size=4, time_limit_s=1e-5, workers=2)

    assert output_rows(store_root, "grs-slow", summary["run_id"]) == direct_rows(cube_url, {})
    chunks = chunk_items(summary["run_id"]).values()
    assert sum(c["n_slow_refit"] for c in chunks) == 8 and all(c["n_timed_out"] == 0 for c in chunks)
    assert summary["status"] == "COMPLETED" and summary["n_slow_refit"] == 8


def test_retries_failures_and_resume_keep_counters_exact(tables, store_root, tmp_path, monkeypatch):
    import flows.phspectra_survey as flow_module

    monkeypatch.setattr(flow_module, "fit_chunk_task", flow_module.fit_chunk_task.with_options(retry_delay_seconds=0))
    calls: dict[str, int] = {}
    real_write = ph.write_parquet

    def flaky_write(store, key, table):  # chunk 0 fails once (retried), chunk 5 fails every time
        calls[key] = calls.get(key, 0) + 1
        if key.endswith("chunk-0000005.parquet") or (key.endswith("chunk-0000000.parquet") and calls[key] == 1):
            raise RuntimeError(f"injected failure #{calls[key]} " + "x" * 2000)
        return real_write(store, key, table)

    monkeypatch.setattr(ph, "write_parquet", flaky_write)
    cube_url = fits_cube(tmp_path, ny=3, nx=5, n_channels=64, nan_channels=0)
    run_id = "retry-run-1"
    with pytest.raises(RuntimeError, match="1 of 3 chunks failed"):
        flow_module.phspectra_survey(cube_url=cube_url, survey="grs-retry", chunk_size=5, run_id=run_id, workers=2)

    run = to_plain(ph.get_run(run_id))
    assert (run["jobs_total"], run["jobs_completed"], run["jobs_failed"], run["status"]) == (3, 2, 1, "FAILED")
    chunks = chunk_items(run_id)
    assert (
        chunks[phspectra_keys.chunk_sk(0)]["attempts"] == 2
        and chunks[phspectra_keys.chunk_sk(0)]["status"] == "COMPLETED"
    )
    assert (
        chunks[phspectra_keys.chunk_sk(5)]["attempts"] == 3 and chunks[phspectra_keys.chunk_sk(5)]["status"] == "FAILED"
    )
    failed = to_plain(ph.failures(run_id))
    assert [c["SK"] for c in failed] == [phspectra_keys.chunk_sk(5)]
    assert failed[0]["error"].startswith("RuntimeError: injected failure #3") and len(failed[0]["error"]) == 1024

    monkeypatch.setattr(ph, "write_parquet", real_write)  # resume: only the failed chunk is fitted again
    summary = flow_module.phspectra_survey(cube_url=cube_url, survey="grs-retry", run_id=run_id, workers=2)
    run = to_plain(ph.get_run(run_id))
    assert (run["jobs_total"], run["jobs_completed"], run["jobs_failed"], run["status"]) == (3, 3, 0, "COMPLETED")
    assert {sk: c["attempts"] for sk, c in chunk_items(run_id).items()} == {
        phspectra_keys.chunk_sk(0): 2,
        phspectra_keys.chunk_sk(5): 4,
        phspectra_keys.chunk_sk(10): 1,
    }
    assert ph.failures(run_id) == [] and "error" not in chunk_items(run_id)[phspectra_keys.chunk_sk(5)]
    assert output_rows(store_root, "grs-retry", run_id) == direct_rows(cube_url, {})
    assert summary["spectra_fitted"] == 15


def wait_for_worker(table: str, run_id: str, process: subprocess.Popen, timeout: float = 90) -> dict:
    """The chunk item once its fitting process runs (``worker_pid`` recorded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        chunk = state_store.get_item(table, ph.chunk_key(run_id, 0))
        if chunk and chunk.get("worker_pid"):
            return to_plain(chunk)
        time.sleep(0.02)
    raise AssertionError(f"the chunk never started (fitter exit code {process.poll()})")


@pytest.mark.sweep  # slow for make test; CI runs it in make test-sweep
def test_a_killed_fitter_keeps_its_chunk_until_its_lease_expires_then_it_is_refitted_once(tables, store_root, tmp_path):
    from prefect.settings import get_current_settings

    from flows.phspectra_survey import phspectra_sweep_stuck
    from tasks import reconcile
    from tests.helpers.crashpoints import report_crashed_runs

    cube_url = fits_cube(tmp_path, ny=4, nx=5, n_channels=424, nan_channels=0)  # one slow chunk of 20 spectra
    run_id, survey, lease = "killed-run-1", "grs-kill", 6.0
    env = {**os.environ, "PREFECT_API_URL": str(get_current_settings().api.url), "PYTHONPATH": str(REPO)}
    code = (  # loaded from its entrypoint, as a deployment does (the file is named like the phspectra package)
        "from prefect.flows import load_flow_from_entrypoint; "
        "survey_flow = load_flow_from_entrypoint('flows/phspectra_survey.py:phspectra_survey'); "
        f"survey_flow(cube_url={cube_url!r}, survey={survey!r}, chunk_size=20, run_id={run_id!r}, workers=1, "
        f"lease_seconds={lease})"
    )
    flow_process = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO, start_new_session=True)
    try:
        chunk = wait_for_worker(tables["phspectra_runs"], run_id, flow_process)
        os.killpg(flow_process.pid, signal.SIGKILL)  # the flow, its fork server and the fitting child
    finally:
        if flow_process.poll() is None:
            os.killpg(flow_process.pid, signal.SIGKILL)
        flow_process.wait(timeout=30)
    pid = int(chunk["worker_pid"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the fitting process survived SIGKILL"
    output_key = phspectra_keys.decomposition_key(survey, run_id, 0)
    assert not (store_root / output_key).exists(), "the chunk finished before the kill"
    report_crashed_runs()  # what its process worker does: the flow run is Crashed

    # while the dead fitter's lease runs, no sweep, claim or reconciliation takes its chunk
    assert phspectra_sweep_stuck(survey=survey) == {}
    assert ph.claim_chunk(run_id, 0, take_expired=True) is None
    assert reconcile.disagreements(["phspectra"]) == []
    chunk = to_plain(state_store.get_item(tables["phspectra_runs"], ph.chunk_key(run_id, 0)))
    assert chunk["status"] == "IN_PROGRESS" and not ph.lease_expired(chunk), "the checks outlasted the lease"

    wait_until_leases_expire(run_id)
    adapter = reconcile.adapters()["phspectra"]
    [record] = [r for r in adapter.tracked() if r.scope == run_id]
    assert ph.ChunkLease(run_id, 0, chunk["started_at"], 0.5).renew()  # its fitter renews before the repair lands
    assert adapter.repair(record, "reconciled").outcome is state_store.Outcome.STALE
    wait_until_leases_expire(run_id)
    findings = reconcile.reconcile_rows(["phspectra"], dry_run=False)  # the records-reconcile flow's task body
    assert [(f["record"], f["outcome"]) for f in findings] == [(f"{run_id}/{phspectra_keys.chunk_sk(0)}", "applied")]

    swept = phspectra_sweep_stuck(survey=survey)
    assert swept == {run_id: {"redriven": [0], "status": "COMPLETED"}}
    run = to_plain(ph.get_run(run_id))
    assert (run["jobs_completed"], run["jobs_failed"], run["jobs_total"], run["status"]) == (1, 0, 1, "COMPLETED")
    rows = output_rows(store_root, survey, run_id)
    assert sorted(rows) == sorted((x, y) for y in range(4) for x in range(5))
    assert chunk_items(run_id)[phspectra_keys.chunk_sk(0)]["attempts"] == 2
    assert phspectra_sweep_stuck(survey=survey) == {}  # nothing left to sweep


@pytest.mark.sweep  # slow for make test; CI runs it in make test-sweep
def test_a_fit_that_outlives_its_lease_renews_it_and_keeps_its_chunk_and_result(tables, store_root, tmp_path):
    from datetime import datetime, timedelta

    from flows.phspectra_survey import phspectra_sweep_stuck

    run_id, survey, lease = "long-fit", "grs-long", 2.0
    # 96 spectra (~7 s of fitting) outlast 1.5 leases even on a quiet machine
    ph.split_cube(run_id, survey, fits_cube(tmp_path, ny=4, nx=24, n_channels=424, nan_channels=0), chunk_size=96)
    result: dict = {}
    fitter = threading.Thread(target=lambda: result.update(ph.fit_chunk(run_id, 0, lease_seconds=lease)))
    fitter.start()
    while (claimed := to_plain(state_store.get_item(tables["phspectra_runs"], ph.chunk_key(run_id, 0))))[
        "status"
    ] == "PENDING":
        time.sleep(0.02)
    past_lease = now_iso(datetime.fromisoformat(claimed["started_at"]) + timedelta(seconds=1.5 * lease))
    sweeps_past_lease = 0
    while fitter.is_alive():  # sweeps run concurrently with the fit, again and again
        checked_at = now_iso()
        assert phspectra_sweep_stuck(survey=survey, lease_seconds=lease) == {}
        assert ph.claim_chunk(run_id, 0, take_expired=True) is None
        if checked_at > past_lease and fitter.is_alive():  # this sweep saw a fit older than 1.5 leases
            sweeps_past_lease += 1
    fitter.join()
    assert sweeps_past_lease >= 1, "the fit ended before a sweep saw it run past its lease"
    assert result["outcome"] == "completed" and result["n_spectra"] == 96
    chunk = chunk_items(run_id)[phspectra_keys.chunk_sk(0)]
    assert (chunk["status"], chunk["started_at"], chunk["attempts"]) == ("COMPLETED", claimed["started_at"], 1)
    assert chunk["lease_expires_at"] > past_lease  # renewed while it fitted
    assert to_plain(ph.get_run(run_id))["jobs_completed"] == 1
    assert sorted(output_rows(store_root, survey, run_id)) == sorted((x, y) for y in range(4) for x in range(24))


def test_a_fitter_that_lost_its_claim_stops_and_publishes_nothing(tables, store_root, tmp_path):
    from tests.helpers.crashpoints import child_command, child_env

    run_id, survey, lease = "superseded", "grs-superseded", 2.0
    ph.split_cube(run_id, survey, fits_cube(tmp_path, ny=6, nx=20, n_channels=424, nan_channels=0), chunk_size=120)
    call = child_command("tasks.phspectra.survey:fit_chunk", {"run_id": run_id, "start": 0, "lease_seconds": lease})
    fitter = subprocess.Popen(
        call,
        env=child_env(),
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        chunk = wait_for_worker(tables["phspectra_runs"], run_id, fitter)
        os.killpg(fitter.pid, signal.SIGSTOP)  # the fitter, its fork server and its fitting process pause
        wait_until_leases_expire(run_id)
        taken = ph.claim_chunk(run_id, 0, take_expired=True)  # a sweeper takes the chunk whose lease expired
        assert taken is not None and taken["attempts"] == 2
        os.killpg(fitter.pid, signal.SIGCONT)
        resumed = time.monotonic()
        out, err = fitter.communicate(timeout=120)
        stopped_s = time.monotonic() - resumed
    finally:
        if fitter.poll() is None:
            os.killpg(fitter.pid, signal.SIGKILL)
            fitter.wait()
    assert fitter.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["outcome"] == "superseded"
    assert stopped_s < 6, f"the fitter ran on for {stopped_s:.1f} s after its renewal failed (120 spectra take longer)"
    assert not Path(f"/proc/{chunk['worker_pid']}").exists(), "its fitting process still runs"
    assert not (store_root / phspectra_keys.decomposition_key(survey, run_id, 0)).exists()
    now = chunk_items(run_id)[phspectra_keys.chunk_sk(0)]
    assert (now["status"], now["started_at"], now["attempts"]) == ("IN_PROGRESS", taken["started_at"], 2)
    assert to_plain(ph.get_run(run_id))["jobs_completed"] == 0


def test_a_resume_by_run_id_alone_fits_into_the_runs_stored_output_url(tables, store_root, tmp_path):
    from flows.phspectra_survey import phspectra_survey

    cube_url, elsewhere = fits_cube(tmp_path, ny=2, nx=6, n_channels=48, nan_channels=0), tmp_path / "elsewhere"
    run_id, survey = "stored-url", "grs-stored"
    ph.split_cube(run_id, survey, cube_url, chunk_size=4, output_url=elsewhere.as_uri())
    assert ph.fit_chunk(run_id, 0, output_url=elsewhere.as_uri())["outcome"] == "completed"  # then interrupted
    before = chunk_items(run_id)

    other = (tmp_path / "other").as_uri()
    with pytest.raises(ValueError) as refused:
        phspectra_survey(run_id=run_id, output_url=other, chunk_size=5)
    assert str(refused.value) == (
        f"run {run_id} resumes with the parameters it was started with, and these differ: chunk_size=5 (the run's: 4); "
        f"output_url={other!r} (the run's: {elsewhere.as_uri()!r}). "
        "Leave them out (run_id is enough) or start a new run"
    )
    with pytest.raises(ValueError, match="no run absent to resume; a new run needs cube_url and survey"):
        phspectra_survey(run_id="absent")
    assert chunk_items(run_id) == before and to_plain(ph.get_run(run_id))["jobs_completed"] == 1  # nothing moved

    summary = phspectra_survey(run_id=run_id, workers=2)
    assert (summary["status"], summary["spectra_fitted"], summary["jobs_completed"]) == ("COMPLETED", 12, 3)
    assert output_rows(elsewhere, survey, run_id) == direct_rows(cube_url, {})  # each spectrum once, where it belongs
    assert not (store_root / phspectra_keys.decomposition_prefix(survey)).exists()
    assert {sk: c["attempts"] for sk, c in chunk_items(run_id).items()} == {
        phspectra_keys.chunk_sk(s): 1 for s in (0, 4, 8)
    }


def test_sweeps_never_overlap_a_second_one_is_cancelled(tables, tmp_path):
    import uuid

    from prefect.client.orchestration import get_client
    from prefect.states import Pending

    from tests.helpers.prefect_runs import deploy_from_prefect_yaml

    name = f"sweep-{uuid.uuid4().hex[:6]}"
    deployment_name = deploy_from_prefect_yaml(tmp_path, {"phspectra-sweep-stuck"}, f"pool-{name}", name)[
        "phspectra-sweep-stuck"
    ]
    with get_client(sync_client=True) as client:  # prefect.yaml's deployment, as `prefect deploy` made it
        deployment = client.read_deployment_by_name(deployment_name)
        first, second = (client.create_flow_run_from_deployment(deployment.id) for _ in range(2))
        client.set_flow_run_state(first.id, Pending())  # what a worker does before it starts a run
        client.set_flow_run_state(second.id, Pending())  # a second sweep while the first still runs
        states = [client.read_flow_run(run.id).state for run in (first, second)]
        client.delete_deployment(deployment.id)
    assert [(s.type.value, s.message) for s in states] == [
        ("PENDING", None),
        ("CANCELLED", "Deployment concurrency limit reached."),
    ]


def test_two_sweepers_cannot_both_take_a_chunk_whose_lease_expired(tables, store_root, tmp_path):
    ph.split_cube("race-run", "grs-race", fits_cube(tmp_path, ny=1, nx=2, n_channels=32), chunk_size=1)
    barrier = threading.Barrier(8)

    def claim(take_expired, lease_seconds):
        barrier.wait()
        return ph.claim_chunk("race-run", 0, take_expired, lease_seconds=lease_seconds)

    def race(take_expired, lease_seconds=1.0):
        results: list = []
        threads = [
            threading.Thread(target=lambda: results.append(claim(take_expired, lease_seconds))) for _ in range(8)
        ]
        [t.start() for t in threads], [t.join() for t in threads]
        return [r for r in results if r is not None]

    first = race(False)  # PENDING -> IN_PROGRESS: exactly one claim, with its lease
    assert len(first) == 1 and first[0]["lease_expires_at"] > first[0]["started_at"]
    assert race(False) == []  # IN_PROGRESS: only a sweeper of expired leases may take it
    while not ph.lease_expired(first[0]):
        time.sleep(0.05)
    # the lease expired: exactly one sweeper re-drives it (with a lease that outlives the race on a loaded machine)
    second = race(True, lease_seconds=60.0)
    assert len(second) == 1 and second[0]["started_at"] > first[0]["started_at"]
    assert to_plain(state_store.get_item(tables["phspectra_runs"], ph.chunk_key("race-run", 0)))["attempts"] == 2
    assert race(True) == []  # the new claim's lease is live


def test_the_five_access_patterns_match_the_seed_cli_queries(tables, store_root, tmp_path, capsys):
    from deployments.cli import main

    cube_url = fits_cube(tmp_path, ny=1, nx=3, n_channels=32)
    ph.split_cube("old-run", "grs-ap", cube_url, chunk_size=1)
    time.sleep(0.01)
    ph.split_cube("new-run", "grs-ap", cube_url, chunk_size=1, fit_params={"beta": 4})
    ph.fit_chunk("new-run", 0)
    ph.claim_chunk("new-run", 1)
    state_store.transition(
        tables["phspectra_runs"], ph.chunk_key("new-run", 1), "IN_PROGRESS", None, set={"started_at": iso_ago(3600)}
    )
    ph.claim_chunk("new-run", 2)
    state_store.transition(
        tables["phspectra_runs"], ph.chunk_key("new-run", 2), "IN_PROGRESS", "FAILED", set={"error": "boom"}
    )

    import boto3
    from boto3.dynamodb.types import TypeDeserializer

    client, name = boto3.client("dynamodb"), tables["phspectra_runs"]  # a raw client, typed like the aws CLI

    def plain(items: list[dict]) -> list[dict]:
        """The items as Python values, less the state store's write token (its bookkeeping, hidden from its reads)."""
        return [
            {k: TypeDeserializer().deserialize(v) for k, v in i.items() if k != state_store.WRITE_TOKEN} for i in items
        ]

    run_key = {"PK": {"S": "new-run"}, "SK": {"S": "RUN"}}
    chunks_of_run = {
        "TableName": name,
        "KeyConditionExpression": "PK = :pk AND begins_with(SK, :prefix)",
        "ExpressionAttributeValues": {":pk": {"S": "new-run"}, ":prefix": {"S": "CHUNK#"}},
    }
    in_progress = {
        "FilterExpression": "#s = :status",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {**chunks_of_run["ExpressionAttributeValues"], ":status": {"S": "IN_PROGRESS"}},
    }
    newest_of_survey = {
        "TableName": name,
        "IndexName": "GSI1",
        "KeyConditionExpression": "GSI1_PK = :survey",
        "ExpressionAttributeValues": {":survey": {"S": "grs-ap"}},
        "ScanIndexForward": False,
        "Limit": 1,
    }
    seed = {  # the seed's `aws dynamodb ...` commands, as the same requests
        "get-run": plain([client.get_item(TableName=name, Key=run_key)["Item"]])[0],
        "list-chunks": plain(client.query(**chunks_of_run)["Items"]),
        "stuck": plain(client.query(**chunks_of_run | in_progress)["Items"]),
        "latest": plain(client.query(**newest_of_survey)["Items"]),
    }
    assert ph.get_run("new-run") == seed["get-run"]
    assert ph.list_chunks("new-run") == seed["list-chunks"] and len(seed["list-chunks"]) == 3
    assert ph.stuck_chunks("new-run") == seed["stuck"] and [c["SK"] for c in seed["stuck"]] == [
        phspectra_keys.chunk_sk(1)
    ]
    assert ph.latest_run("grs-ap") == seed["latest"][0] and seed["latest"][0]["PK"] == "new-run"
    assert ph.latest_run("grs-ap", not_before="2999-01-01") is None
    assert ph.latest_run("grs-none") is None
    assert [(c["SK"], c["error"]) for c in ph.failures("new-run")] == [(phspectra_keys.chunk_sk(2), "boom")]

    def cli(*args):
        assert main(["phspectra", *args]) == 0
        return json.loads(capsys.readouterr().out)

    assert cli("get-run", "--run-id", "new-run") == to_plain(seed["get-run"])
    assert len(cli("list-chunks", "--run-id", "new-run")) == 3
    assert cli("latest-run", "--survey", "grs-ap")["PK"] == "new-run"
    assert [c["SK"] for c in cli("stuck-chunks", "--run-id", "new-run", "--minutes", "15")] == [
        phspectra_keys.chunk_sk(1)
    ]
    assert cli("failures", "--run-id", "new-run")[0]["error"] == "boom"
    assert main(["phspectra", "get-run", "--run-id", "nope"]) == 2
    assert "no run nope" in capsys.readouterr().err

    from deployments.samples.phspectra import make, report

    text = report(survey="grs-ap")
    assert text.startswith("phspectra run new-run (grs-ap): RUNNING, chunks 1 completed / 0 failed / 3 total")
    assert text.endswith("stuck (>15 min): 1, failures: 1")
    params = make(tmp_path / "demo")
    assert ph.load_cube(params["cube_url"]).shape == (128, 6, 8) and params["survey"] == "grs-demo"


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "cube not found"),
        ("unreadable", "cannot read cube"),
        ("two_axes", "has 2 axes"),
        ("all_nan", "entirely NaN"),
        ("unknown_param", "unknown fit_params key(s) ['bogus']"),
        ("chunk_size", "chunk_size must be an integer >= 1"),
    ],
)
def test_bad_input_fails_clearly_before_any_chunk_is_written(tables, store_root, tmp_path, case, message):
    cube = tmp_path / "cube.npy"
    np.save(cube, np.ones((16, 2, 2)))
    kwargs = {"cube_url": cube.as_uri(), "chunk_size": 2, "fit_params": None}
    if case == "missing":
        kwargs["cube_url"] = (tmp_path / "absent.fits").as_uri()
    elif case == "unreadable":
        (tmp_path / "bad.fits").write_bytes(b"not a fits file")
        kwargs["cube_url"] = (tmp_path / "bad.fits").as_uri()
    elif case == "two_axes":
        np.save(cube, np.ones((16, 4)))
    elif case == "all_nan":
        np.save(cube, np.full((16, 2, 2), np.nan))
    elif case == "unknown_param":
        kwargs["fit_params"] = {"beta": 3.0, "bogus": 1}
    else:
        kwargs["chunk_size"] = 0
    with pytest.raises(ValueError) as error:
        ph.split_cube(f"bad-{case.replace('_', '-')}", "grs-bad", **kwargs)
    assert message in str(error.value)
    run = to_plain(ph.latest_run("grs-bad"))
    assert run["status"] == "FAILED" and message in run["error"] and run["jobs_total"] == 0
    assert ph.list_chunks(run["PK"]) == [] and list(store_root.rglob("*.npz")) == []


def test_the_flow_reports_bad_input_and_cannot_resume_it(tables, store_root, tmp_path):
    from flows.phspectra_survey import phspectra_survey

    cube_url = fits_cube(tmp_path, ny=1, nx=2, n_channels=32)
    with pytest.raises(ValueError, match="unknown fit_params"):
        phspectra_survey(cube_url=cube_url, survey="grs-bad", run_id="bad-flow", fit_params={"nope": 1})
    with pytest.raises(ValueError, match="failed before its chunks were written"):
        phspectra_survey(cube_url=cube_url, survey="grs-bad", run_id="bad-flow")
    assert to_plain(ph.get_run("bad-flow"))["status"] == "FAILED" and ph.list_chunks("bad-flow") == []


@pytest.mark.sweep  # slow for make test; CI runs it in make test-sweep
def test_the_fits_run_on_a_dask_local_cluster(tables, store_root, tmp_path):
    from flows.phspectra_survey import phspectra_survey

    cube_url = fits_cube(tmp_path, ny=2, nx=3, n_channels=48, nan_channels=0)
    summary = phspectra_survey(cube_url=cube_url, survey="grs-dask", chunk_size=3, dask_workers=2)
    assert summary["jobs_completed"] == summary["jobs_total"] == 2
    assert output_rows(store_root, "grs-dask", summary["run_id"]) == direct_rows(cube_url, {})
    assert all(c["prefect_task_run_id"] and c["worker_host"] for c in chunk_items(summary["run_id"]).values())


# --------------------------------------------------------------------------- fault paths (issue 12)


def test_a_split_that_died_before_its_chunk_items_resumes_to_every_spectrum(tables, store_root, tmp_path, monkeypatch):
    from flows.phspectra_survey import phspectra_survey

    cube_url = fits_cube(tmp_path, ny=2, nx=5, n_channels=48, nan_channels=0)

    def crash(*args, **kwargs):
        raise SystemExit("process died after the RUN item, before the CHUNK items")

    with monkeypatch.context() as patch:
        patch.setattr(state_store, "create_many_if_absent", crash)
        with pytest.raises(SystemExit):
            ph.split_cube("half-split", "grs-half", cube_url, chunk_size=4)
    assert to_plain(ph.get_run("half-split"))["jobs_total"] == 3 and ph.list_chunks("half-split") == []
    assert ph.finalize_run("half-split")["status"] == "RUNNING"  # 0 of 3 chunk items: not COMPLETED

    summary = phspectra_survey(cube_url=cube_url, survey="grs-half", run_id="half-split", workers=2)
    assert (summary["status"], summary["spectra_fitted"], summary["jobs_completed"]) == ("COMPLETED", 10, 3)
    assert output_rows(store_root, "grs-half", "half-split") == direct_rows(cube_url, {})


def test_a_second_start_with_one_run_id_cannot_overwrite_or_fail_the_first(tables, store_root, tmp_path):
    first = fits_cube(tmp_path / "a", ny=1, nx=4, n_channels=32, seed=1)
    ph.split_cube("twice", "grs-twice", first, chunk_size=2)
    files = {p: p.read_bytes() for p in store_root.rglob("*.npz")}
    assert len(files) == 2
    other = fits_cube(tmp_path / "b", ny=1, nx=6, n_channels=32, seed=2)
    with pytest.raises(ValueError, match="already exists"):
        ph.split_cube("twice", "grs-twice", other, chunk_size=2)
    assert {p: p.read_bytes() for p in store_root.rglob("*.npz")} == files
    with pytest.raises(ValueError, match="unknown fit_params"):  # a bad second start: the first run is untouched
        ph.split_cube("twice", "grs-twice", first, chunk_size=2, fit_params={"bogus": 1})
    run = to_plain(ph.get_run("twice"))
    assert (run["status"], run["jobs_total"], "error" in run) == ("RUNNING", 2, False)
    with pytest.raises(ValueError, match="unknown fit_params"):  # a failed start's reason is still updated
        ph.split_cube("failed-twice", "grs-twice", first, fit_params={"bogus": 1})
    with pytest.raises(ValueError, match="chunk_size"):
        ph.split_cube("failed-twice", "grs-twice", first, chunk_size=0)
    assert "chunk_size" in to_plain(ph.get_run("failed-twice"))["error"]


def test_chunk_starts_past_ten_million_parse_sort_and_resume(tables, store_root):
    starts = [0, 5_000_000, 10_000_000, 15_000_000]
    assert [phspectra_keys.chunk_start_from_sk(phspectra_keys.chunk_sk(s)) for s in starts] == starts
    assert (
        phspectra_keys.chunk_sk(0) == "CHUNK#chunk-0000000"
        and phspectra_keys.chunk_sk(10_000_000) == "CHUNK#chunk-10000000"
    )
    for bad in ("CHUNK#chunk-000000", "CHUNK#chunk-00000000", "CHUNK#chunk-1e7"):
        with pytest.raises(keys.InvalidKey):
            phspectra_keys.chunk_start_from_sk(bad)
    table = tables["phspectra_runs"]
    run = {
        **ph.run_key("wide"),
        "GSI1_PK": "grs-wide",
        "GSI1_SK": now_iso(),
        "survey": "grs-wide",
        "status": "RUNNING",
        "created_at": now_iso(),
        "jobs_total": 4,
        "jobs_completed": 3,
        "jobs_failed": 0,
        "n_spectra": 15_000_001,
        "n_chunks": 4,
        "chunk_size": 5_000_000,
        "n_channels": 8,
        "cube_url": "file:///nowhere.npy",
    }
    state_store.create_if_absent(table, run, ["PK", "SK"])
    for start in starts:
        status = "PENDING" if start == 15_000_000 else "COMPLETED"
        item = {**ph.chunk_key("wide", start), "status": status, "n_spectra": 1 if status == "PENDING" else 5_000_000}
        state_store.create_if_absent(table, item, ["PK", "SK"])
    assert [phspectra_keys.chunk_start_from_sk(c["SK"]) for c in ph.list_chunks("wide")] == starts  # spectrum order
    assert ph.complete_split("wide") == [] and ph.chunks_to_fit("wide") == ([15_000_000], [])
    assert [c["chunk"] for c in ph.summarize("wide")["chunks"]][-2:] == ["chunk-10000000", "chunk-15000000"]
    assert ph.finalize_run("wide")["status"] == "RUNNING"


def _driven_then_abandoned(run_id: str, cube_url: str, survey: str) -> None:
    """A flow run: splits, completes chunk 0, loses chunk 4 (FAILED, as the reconciler marks it), leaves 8 PENDING."""
    from prefect import flow

    @flow(name="phspectra-abandoned")
    def abandoned() -> None:
        ph.split_cube(run_id, survey, cube_url, chunk_size=4)
        ph.fit_chunk(run_id, 0)
        ph.claim_chunk(run_id, 4)
        state_store.transition(
            ph.runs_table(),
            ph.chunk_key(run_id, 4),
            "IN_PROGRESS",
            "FAILED",
            set={"error": "reconciled: crashed"},
            increments=[state_store.Increment(ph.runs_table(), ph.run_key(run_id), {"jobs_failed": 1})],
        )

    abandoned()


def test_the_sweeper_finishes_runs_whose_driver_ended(tables, store_root, tmp_path):
    from flows.phspectra_survey import phspectra_sweep_stuck

    cube_url = fits_cube(tmp_path, ny=2, nx=5, n_channels=48, nan_channels=0)
    _driven_then_abandoned("abandoned", cube_url, "grs-sweep")
    assert to_plain(ph.get_run("abandoned"))["status"] == "RUNNING"
    assert phspectra_sweep_stuck(survey="grs-sweep") == {"abandoned": {"redriven": [4, 8], "status": "COMPLETED"}}
    run = to_plain(ph.get_run("abandoned"))
    assert (run["status"], run["jobs_completed"], run["jobs_failed"], run["sweep_attempts"]) == ("COMPLETED", 3, 0, 1)
    assert output_rows(store_root, "grs-sweep", "abandoned") == direct_rows(cube_url, {})
    assert phspectra_sweep_stuck(survey="grs-sweep") == {}

    from prefect import get_client
    from prefect.states import Cancelled

    _driven_then_abandoned("cancelled", cube_url, "grs-sweep")  # a person cancelled it: FAILED, not re-driven
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(ph.get_run("cancelled")["driver_flow_run_id"], Cancelled(), force=True)
    assert phspectra_sweep_stuck(survey="grs-sweep") == {"cancelled": {"redriven": [], "status": "FAILED"}}
    run = to_plain(ph.get_run("cancelled"))
    assert run["status"] == "FAILED" and "was cancelled (chunks 1 COMPLETED, 1 FAILED, 1 PENDING of 3)" in run["error"]


def test_a_failed_slow_lane_is_retried_by_the_sweeper_then_failed_with_a_reason(
    tables, store_root, tmp_path, monkeypatch
):
    import flows.phspectra_survey as flow_module

    real_slow_lane = flow_module.slow_lane_task

    @flow_module.task(name="slow-lane-refit")
    def broken_slow_lane(run_id, start, output_url=None, fit_slots=1):
        raise RuntimeError("slow lane worker lost")

    cube_url = fits_cube(tmp_path, ny=1, nx=4, n_channels=64, nan_channels=0)
    monkeypatch.setattr(flow_module, "slow_lane_task", broken_slow_lane)
    with pytest.raises(RuntimeError, match="unfinished .*4 spectra still past the time limit"):
        flow_module.phspectra_survey(
            cube_url=cube_url, survey="grs-lane", run_id="lane", chunk_size=2, time_limit_s=1e-5, workers=2
        )
    assert to_plain(ph.get_run("lane"))["status"] == "RUNNING"
    assert flow_module.phspectra_sweep_stuck(survey="grs-lane", max_sweeps=1) == {
        "lane": {"redriven": [], "status": "RUNNING"}
    }
    swept = flow_module.phspectra_sweep_stuck(survey="grs-lane", max_sweeps=1)  # bounded: gives up with the reason
    assert swept == {"lane": {"redriven": [], "status": "FAILED"}}
    run = to_plain(ph.get_run("lane"))
    assert run["status"] == "FAILED" and run["error"].startswith("gave up after 1 sweeps: chunks 2 COMPLETED of 2")
    assert "4 spectra still past the time limit" in run["error"]

    monkeypatch.setattr(flow_module, "slow_lane_task", real_slow_lane)  # a resume with the slow lane back: COMPLETED
    summary = flow_module.phspectra_survey(cube_url=cube_url, survey="grs-lane", run_id="lane", workers=2)
    assert summary["status"] == "COMPLETED" and summary["n_slow_refit"] == 4
    assert output_rows(store_root, "grs-lane", "lane") == direct_rows(cube_url, {})


def test_a_flow_killed_while_its_fork_server_starts_leaves_no_fork_server(tmp_path):
    code = (  # the flow starts the fork server (warm_up) and dies while it still imports numpy/scipy/phspectra
        "import glob, os, threading, time; from tasks.phspectra import worker; "
        "threading.Thread(target=worker._fork_server, daemon=True).start(); "
        "spawned = lambda: any(open(f).read().strip() for f in glob.glob(f'/proc/{os.getpid()}/task/*/children')); "
        "exec('while not spawned(): time.sleep(0.005)'); os.kill(os.getpid(), 9)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # the pipes close only once every process holding them (the fork server) has exited
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, timeout=90)
    assert result.returncode == -signal.SIGKILL


def test_a_chunk_alone_is_fitted_on_every_slot_with_its_rows_in_spectrum_order(tmp_path):
    from tasks.phspectra import worker

    spectra = ph.prepare_spectra(synthetic_cube(3, 8, 64, seed=5, nan_channels=0))[0]
    path = tmp_path / "chunk.npz"
    np.savez(path, spectra=spectra)
    direct = worker.fit_spectra(spectra, {"beta": 3.5}, None)
    alone = worker.run_in_child(path, {"beta": 3.5}, None, slots=2)
    assert alone.rows == direct
    assert alone.n_processes > 2, "the last chunk was not shared by both slots in shrinking pieces"
    assert worker.run_in_child(path, {"beta": 3.5}, None, slots=1)[::2] == (direct, 1)  # one slot: one process


def test_a_stopped_fit_kills_every_fitting_process_of_its_chunk_and_leaves_the_others(tmp_path):
    import psutil

    from tasks.phspectra import worker

    spectra = ph.prepare_spectra(synthetic_cube(4, 10, 424, seed=6, nan_channels=0))[0]
    np.savez(tmp_path / "stopped.npz", spectra=spectra)
    np.savez(tmp_path / "other.npz", spectra=spectra[:8])
    stop, started, outcome = threading.Event(), [], {}

    def fit(name: str, **kwargs) -> None:
        try:
            outcome[name] = worker.run_in_child(tmp_path / f"{name}.npz", {}, None, slots=2, **kwargs).rows
        except Exception as error:  # noqa: BLE001 - asserted below
            outcome[name] = error

    fitters = [
        threading.Thread(target=fit, args=("stopped",), kwargs={"on_start": started.append, "stop": stop}),
        threading.Thread(target=fit, args=("other",)),
    ]
    fitters[0].start()
    while not started:
        time.sleep(0.01)
    fitters[1].start()  # queued behind the stopped chunk: it gets the slots once that one is stopped
    server = psutil.Process(worker._fork_server().process.pid)
    deadline = time.monotonic() + 30
    while len(server.children()) < 2:  # the 40 spectra are on both slots
        assert time.monotonic() < deadline, "the chunk never ran on two fitting processes"
        time.sleep(0.01)
    stop.set()
    for fitter in fitters:
        fitter.join(timeout=120)
    assert isinstance(outcome["stopped"], worker.FitStopped)
    assert outcome["other"] == worker.fit_spectra(spectra[:8], {}, None)
    deadline = time.monotonic() + 5  # a killed process that closed its connection may still be exiting
    while server.children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.children() == [], "a fitting process outlived its stopped fit"


def _server_environ(pid: int) -> dict[str, str]:
    """A process's environment as it started."""
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)


def test_each_fitting_process_gets_the_cores_shared_among_the_slots_in_blas_threads(monkeypatch):
    from tasks.phspectra import worker

    assert [worker.threads_per_fit(s, cores=16) for s in (1, 4, 16, 32)] == [16, 4, 1, 1]
    for name in worker.THREAD_VARIABLES:  # (a Dask cluster of an earlier test may have set some here)
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(worker, "_server", None)  # one started before under other variables serves its own fits
    cores = worker.caller_cores()
    for slots in (cores, 1):  # a new slot count starts a server sized for it, before it imports numpy
        worker.start_fork_server(slots)
        environ = _server_environ(worker._fork_server().process.pid)
        assert {n: environ.get(n) for n in worker.THREAD_VARIABLES} == dict.fromkeys(
            worker.THREAD_VARIABLES, str(max(1, cores // slots))
        )
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own choice is kept, and no other variable is added
    assert worker.thread_environment(1, os.environ) == {}
