"""The deployment trigger of prefect.yaml, on a real Prefect server: a pipeline run that crashes or fails starts
`records-prefect-state` (through the server's own trigger and action services), which brings the records back
into agreement with Prefect.

The session's test server is a real `prefect server` process (``prefect_test_harness``), whose reactive
trigger and action services run; the deployment and its trigger are prefect.yaml's, deployed with
`prefect deploy`, and a process worker runs what the trigger starts.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tasks import reconcile
from tasks.core import state_store
from tasks.etl import keys as etl_keys
from tasks.phspectra import keys as phspectra_keys
from tests.helpers.prefect_runs import Worker, deploy_from_prefect_yaml, wait_for_runs


@pytest.mark.sweep  # a server, a worker and its trigger: `make test-sweep`, which CI runs
def test_crashed_and_failed_pipeline_runs_trigger_records_prefect_state_and_the_records_agree(
    tables, store_root, tmp_path, monkeypatch
):
    from prefect.client.orchestration import get_client

    from flows.etl import ndjson_ingest
    from flows.phspectra_survey import phspectra_survey

    for name, value in {
        "ETL_EXPECTED_FILE_SIZE_MB": "0.001",
        "ETL_SIZE_TOLERANCE_PERCENT": "99",
        "ETL_MAX_FILES_PER_MANIFEST": "2",
        "ETL_NUM_STATUS_SHARDS": "1",
    }.items():
        monkeypatch.setenv(name, value)
    name, survey_run = f"trigger-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    deployments = deploy_from_prefect_yaml(tmp_path, {"records-prefect-state"}, f"pool-{name}", name)
    merges = deploy_from_prefect_yaml(tmp_path, {"ndjson-merge"}, f"pool-{name}-merge", f"{name}-merge")
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(deployments["records-prefect-state"])
        automations = [a for a in client.read_automations() if str(deployment.id) in a.model_dump_json()]
    assert len(automations) == 1 and automations[0].enabled  # prefect.yaml's trigger, as `prefect deploy` made it

    # a merge, started by the ingest as a deployment run, whose flow process dies right after taking its manifest:
    # its worker (the crash-point injector armed in the flow-run processes it starts) reports the run Crashed
    day = "2026-04-01"
    urls = []
    for i in range(2):
        path = store_root / etl_keys.input_key(day, f"f{i}.ndjson")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f'{{"id": "{i}-{k}", "pad": "{"x" * 40}"}}\n' for k in range(10)))
        urls.append(path.as_uri())
    worker = Worker(f"pool-{name}", tmp_path / "worker.log")
    merge_worker = Worker(f"pool-{name}-merge", tmp_path / "merge-worker.log", {"PIPELINES_FAULT": "1:kill:after"})
    try:
        [manifest] = ndjson_ingest(file_urls=urls, merge_deployment=merges["ndjson-merge"])["manifests"]
        [merge_run] = wait_for_runs(merges["ndjson-merge"], 1, timeout=120, worker=merge_worker)
        assert merge_run.state_name == "Crashed", merge_worker.tail()  # reported by the worker itself
        key = {"date_prefix": day, "file_key": etl_keys.manifest_record_key(manifest)}
        crashed_run = str(merge_run.id)

        # a pipeline run that fails: a survey of a cube that is not there (its split task fails, then the flow)
        started = time.monotonic()
        failed = phspectra_survey(
            cube_url=(store_root / "missing.fits").as_uri(), survey="trigger", run_id=survey_run, return_state=True
        )
        assert failed.is_failed() and "cube not found" in failed.message
        failed_run = str(failed.state_details.flow_run_id)

        # the server's trigger starts records-prefect-state once per event; the worker runs them
        repairs = [
            r
            for r in wait_for_runs(deployments["records-prefect-state"], 3, timeout=180, worker=worker)
            if crashed_run in json.dumps(r.parameters) or failed_run in json.dumps(r.parameters)
        ]  # only the events of this test's runs (another test's stray run cannot confuse it)
        assert [r.state_name for r in repairs] == ["Completed"] * 3, worker.tail()
        events = {
            (r.parameters["event"]["event"], r.parameters["event"]["resource"]["prefect.resource.id"].split(".")[1])
            for r in repairs
        }
        assert events == {
            ("prefect.flow-run.Crashed", "flow-run"),
            ("prefect.flow-run.Failed", "flow-run"),
            ("prefect.task-run.Failed", "task-run"),
        }
        crash_event = next(r.parameters["event"] for r in repairs if r.parameters["event"]["event"].endswith("Crashed"))
        assert crash_event["resource"]["prefect.resource.id"] == f"prefect.flow-run.{crashed_run}"
        print(f"crash and failure -> 3 records-prefect-state runs completed in {time.monotonic() - started:.1f} s")
    finally:
        worker.stop()
        merge_worker.stop()
        with get_client(sync_client=True) as client:
            client.delete_deployment(deployment.id)  # and its trigger: later crashes in the session start nothing

    record = state_store.to_plain(state_store.get_item(tables["etl_file_tracking"], key))
    # a crashed run (its process killed, as an upgrade's swap does) gives its manifest back for the next merge run
    assert record["status"] == "pending" and "Crashed" in record["redrive_reason"] and record["redrives"] == 1
    assert record["redriven_from"] == crashed_run  # the crashed run had taken the manifest before it died
    run = state_store.to_plain(
        state_store.get_item(tables["phspectra_runs"], {"PK": survey_run, "SK": phspectra_keys.RUN_SK})
    )
    assert run["status"] == "FAILED" and "cube not found" in run["error"]
    assert reconcile.disagreements() == []
