"""Issue 14's re-runs as a user runs them: `prefect deploy` from prefect.yaml, a process worker, and
`prefect deployment run` for every step (README, "Re-drive, remediate, replay").

- video: a truncated upload fails the job (the reason names the object key, not a local path); the user uploads
  again to the same target and runs `video-process` for the job again: it completes with every frame.
- ETL: a merge fails on its worker (a fault injected at one of its writes); once the cause is fixed,
  `ndjson-merge --param rerun=true` completes the manifest and its files, each line exactly once, and a later
  `etl reprocess` + flush merges nothing twice.

About a minute (a worker and several flow-run processes): marker `sweep`, run by `make test-sweep` (and CI).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tasks.core import state_store
from tasks.etl import keys as etl_keys
from tasks.etl import ops as etl_ops
from tasks.video import jobs as v
from tasks.video import keys as video_keys
from tasks.video.ffmpeg import make_test_video, probe
from tests.helpers.etl import DAY, TODAY, assert_merged_exactly_once, file_statuses, manifests, write_five_inputs
from tests.helpers.prefect_runs import Worker, deploy_from_prefect_yaml, prefect_cli, wait_for, wait_for_runs

pytestmark = pytest.mark.sweep  # a worker and flow-run processes: `make test-sweep`, which CI runs


def _deployment_run(deployment: str, *params: str) -> None:
    """`prefect deployment run DEPLOYMENT --param …` (no --watch: the test waits on the run's state itself)."""
    prefect_cli("deployment", "run", deployment, *[arg for param in params for arg in ("--param", param)], timeout=120)


class Deployed:
    """prefect.yaml's 'local' deployments of some flows, renamed for this test, on a pool of their own."""

    def __init__(self, tmp_path: Path, flows: set[str]):
        self.tmp_path, self.name = tmp_path, f"faults-{uuid.uuid4().hex[:6]}"
        self.pool = f"pool-{self.name}"
        self.deployments = deploy_from_prefect_yaml(tmp_path, flows, self.pool, self.name)
        self.worker: Worker | None = None

    def start_worker(self, **env: str) -> None:
        """A (new) process worker for the pool, with this test's environment plus ``env``."""
        self.stop_worker()
        self.worker = Worker(self.pool, self.tmp_path / f"worker-{uuid.uuid4().hex[:4]}.log", env)

    def stop_worker(self) -> None:
        """Stop the worker and its flow runs."""
        if self.worker:
            self.worker.stop()
            self.worker = None


@pytest.fixture
def deployed(tmp_path):
    """Yields a function that deploys ``flows`` and starts a worker for them; the worker is stopped at the end."""
    made: list[Deployed] = []

    def deploy(flows: set[str], **worker_env: str) -> Deployed:
        made.append(Deployed(tmp_path, flows))
        made[-1].start_worker(**worker_env)
        return made[-1]

    yield deploy
    for one in made:
        one.stop_worker()


@pytest.mark.timeout(600)
def test_a_failed_video_job_is_rerun_through_its_deployment(tables, store_root, tmp_path, deployed):
    deployments = deployed({"video-process", "video-reassemble"}).deployments
    clip = make_test_video(tmp_path / "clip.mp4", 3.0, 10, keyframe_seconds=1.0)
    data = clip.read_bytes()
    job = v.create_job(mode="grayscale", segment_seconds=1.0)
    job_id, upload = job["job_id"], Path(job["upload_target"])
    upload.write_bytes(data[: len(data) // 2])  # the user's upload is cut short

    process = deployments["video-process"]
    _deployment_run(process, f"job_id={job_id}", "segment_retries=0")  # the job's own mode and segment length
    (run,) = wait_for_runs(process, 1)
    failed = v.get_job(job_id)
    assert (run.state_name, failed["status"]) == ("Failed", "failed"), failed
    assert "chunking failed" in failed["failure_reason"] and video_keys.source_key(job_id) in failed["failure_reason"]
    assert str(store_root) not in failed["failure_reason"]  # object keys, not this machine's paths

    upload.write_bytes(data)  # uploaded again to the same target, then the documented re-run
    _deployment_run(process, f"job_id={job_id}", "segment_retries=0")  # the job's own mode and segment length
    runs = wait_for_runs(process, 2)
    assert sorted(r.state_name for r in runs) == ["Completed", "Failed"]
    job = v.get_job(job_id)
    # the completed run reassembled in its own process (issue 25): no `video-reassemble` run was started
    assert not wait_for_runs(deployments["video-reassemble"], 0)
    assert (
        state_store.get_item(tables["video_reassembly_locks"], {"job_id": job_id})["reassembly_owner"]
        == job["prefect_flow_run_id"]
    )
    assert (job["status"], job["total_segments"], job["final_frames"], job["attempts"]) == ("completed", 3, 30, 1)
    assert "chunking failed" in job["previous_failure_reason"] and "failure_reason" not in job
    assert probe(store_root / video_keys.final_key(job_id)).frames == 30
    assert [r["segment_index"] for r in v.completions(job_id)] == [0, 1, 2]
    assert sorted((store_root / f"jobs/{job_id}/segments").iterdir()) == [  # the job's mode, not the block's
        store_root / video_keys.output_segment_key(job_id, i, 3, "grayscale") for i in range(3)
    ]


@pytest.mark.timeout(600)
def test_a_failed_merge_is_rerun_through_its_deployment(etl_env, tmp_path, deployed):
    from flows.etl import ndjson_flush_orphans, ndjson_ingest

    root, table = etl_env["root"], etl_env["table"]
    # the merge's flow-run processes on this worker fail at their second write (a part of the merge): the crash-point
    # injector (tasks/core/faults.py) in raise mode, a fault the merge does not retry
    stack = deployed({"ndjson-merge"}, PIPELINES_FAULT="2:raise:before")
    merge = stack.deployments["ndjson-merge"]
    urls = write_five_inputs(root, "d")

    summary = ndjson_ingest(file_urls=urls, merge_deployment=merge)
    assert (summary["tracked"], summary["launched"]) == (5, 1)
    (run,) = wait_for_runs(merge, 1, worker=stack.worker)
    (key,) = manifests(table)
    assert (run.state_name, manifests(table)[key]["status"]) == ("Failed", "failed"), stack.worker.tail()
    assert "InjectedFault" in manifests(table)[key]["error_message"]
    assert file_statuses(table) == {"failed": 5} and not list(
        root.glob(f"{etl_keys.merged_output_prefix(DAY)}*.parquet")
    )

    stack.start_worker()  # the cause is fixed (a worker without the fault); the README's re-run of a failed merge
    name = etl_keys.manifest_name_from_record_key(key)
    _deployment_run(merge, f"date_prefix={DAY}", f"manifest_name={name}", "rerun=true")
    runs = wait_for_runs(merge, 2, worker=stack.worker)
    assert sorted(r.state_name for r in runs) == ["Completed", "Failed"]
    assert manifests(table)[key]["status"] == "completed" and file_statuses(table) == {"completed": 5}
    assert_merged_exactly_once(root, urls)
    # nothing is left to reprocess, and the flush finds nothing to batch again
    assert etl_ops.reprocess_failed(DAY)["moved"] == 0
    assert ndjson_flush_orphans(today=TODAY, merge_deployment=merge)["launched"] == 0
    assert_merged_exactly_once(root, urls)
    assert not list(state_store.scan_all(table, keep=lambda i: str(i.get("status", "")).startswith("pending")))


def _flow_run_process(worker: Worker, flow_run_id: str):
    """The worker's child process that runs ``flow_run_id`` (None until it started)."""
    import psutil

    for child in psutil.Process(worker.process.pid).children(recursive=True):
        try:
            if child.environ().get("PREFECT__FLOW_RUN_ID") == flow_run_id:
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


@pytest.mark.timeout(600)
def test_a_video_run_killed_mid_inference_is_redriven_within_a_minute(
    tables, store_root, tmp_path, deployed, endpoints
):
    """Issue 23, item 2: a `video-process` flow process SIGKILLed while a segment is at the backend. Its worker reports
    the run Crashed, prefect.yaml's trigger starts `records-prefect-state`, which re-drives the job through the
    crashed run's deployment (no wait for `video-sweep-stuck`); the new run finishes it with every frame."""
    import signal
    import time

    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    from tasks import reconcile
    from tests.helpers.video import upload_bytes

    (backend, url), _ = endpoints
    backend.behaviour = "hold-after-first"
    stack = deployed(
        {"video-process", "video-reassemble", "records-prefect-state"}, VIDEO_INFERENCE_ENDPOINT_URL=f"{url}/infer"
    )
    clip = make_test_video(tmp_path / "clip.mp4", 3.0, 10, keyframe_seconds=1.0)
    job_id = upload_bytes(clip.read_bytes())
    process = stack.deployments["video-process"]
    try:
        params = {"job_id": job_id, "backend": "http", "max_parallel_segments": 1, "segment_retries": 0}
        crashed = str(run_deployment(process, parameters=params, timeout=0, as_subflow=False).id)
        wait_for(lambda: len(backend.seen) >= 2, 240, "segment 0 done and segment 1 at the backend")
        assert [c["segment_index"] for c in v.completions(job_id)] == [0]
        _flow_run_process(stack.worker, crashed).send_signal(signal.SIGKILL)  # mid-inference: no hook, no final state
        killed = time.monotonic()
        backend.behaviour = "ok"  # the backend is well again: a re-drive can finish the job

        redriven = wait_for(
            lambda: v.get_job(job_id).get("redrives") == 1 and v.get_job(job_id)["prefect_flow_run_id"],
            120,
            "the job to be re-driven",
        )
        redrive_s = time.monotonic() - killed
        runs = wait_for_runs(process, 2, worker=stack.worker)  # the re-driven run reassembles in its own process
        done_s = time.monotonic() - killed
        repairs = wait_for_runs(stack.deployments["records-prefect-state"], 1, worker=stack.worker)
    finally:
        with get_client(sync_client=True) as client:  # its trigger goes too: later crashes in the session start nothing
            client.delete_deployment(client.read_deployment_by_name(stack.deployments["records-prefect-state"]).id)
    print(f"killed mid-inference -> re-driven in {redrive_s:.1f} s, completed in {done_s:.1f} s")
    assert redrive_s < 60, redrive_s
    assert {str(r.id): r.state_name for r in runs} == {crashed: "Crashed", redriven: "Completed"}
    crash_repair = [r for r in repairs if crashed in str(r.parameters)]
    assert [r.state_name for r in crash_repair] == ["Completed"]
    job = v.get_job(job_id)
    assert (job["status"], job["final_frames"], job["redrives"]) == ("completed", 30, 1)
    assert probe(store_root / video_keys.final_key(job_id)).frames == 30
    assert [r["segment_index"] for r in v.completions(job_id)] == [0, 1, 2]
    assert reconcile.disagreements(["video"]) == []  # DynamoDB and Prefect agree
