"""Video fault paths (issue 14, items 9-13): bad backend output, failed reassembly, stuck jobs, re-runs of failed
jobs, credentials on redirects, secrets and local paths in messages, the source allow-list."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from flows.video import video_process, video_sweep_stuck
from tasks.core import state_store
from tasks.core.object_store import LocalStore
from tasks.video import inference, keys
from tasks.video import jobs as v
from tasks.video.ffmpeg import make_test_video, probe
from tests.helpers.prefect_runs import crash_event
from tests.helpers.video import upload_bytes

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

SECONDS, FPS, SEGMENT = 3.0, 10, 1.0  # 3 segments of 10 frames


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return make_test_video(tmp_path_factory.mktemp("clip") / "clip.mp4", SECONDS, FPS, keyframe_seconds=SEGMENT)


def _run(**params):
    params = {"segment_seconds": SEGMENT, "segment_retries": 0, "segment_retry_delays": [0], **params}
    return video_process(**params)


def _job(tables, job_id: str) -> dict:
    return state_store.to_plain(state_store.get_item(tables["video_jobs"], {"job_id": job_id}))


# --------------------------------------------------------------------------- 9: bad output, reassembly, stuck jobs


def test_a_200_with_a_json_body_is_not_a_completed_segment(tables, store_root, clip, endpoints, monkeypatch):
    (backend, url), _ = endpoints
    backend.behaviour = "json"
    monkeypatch.setenv("VIDEO_INFERENCE_ENDPOINT_URL", f"{url}/infer")
    job_id = upload_bytes(clip.read_bytes())
    with pytest.raises(v.JobFailed, match="http backend output for segment 0 is no video"):
        _run(job_id=job_id, backend="http")
    job = _job(tables, job_id)
    assert job["status"] == "failed" and "3 of 3 segments failed" in job["failure_reason"]
    assert v.completions(job_id) == [] and not list(LocalStore(store_root).list(keys.job_output_prefix(job_id)))


def test_an_output_with_missing_frames_is_refused(tables, store_root, clip, tmp_path):
    job_id = upload_bytes(clip.read_bytes())
    v.start_chunking(job_id)
    v.chunk_source(job_id, SEGMENT, "identity")
    short = make_test_video(tmp_path / "short.mp4", 0.5, FPS)  # a real video, but 5 frames instead of 10
    with pytest.raises(inference.InferenceError, match="has 5 frames / 0.500 s; the segment has 10 frames / 1.000 s"):
        v.check_output(short, "x", 0, v.get_job(job_id), "http")


def test_a_failed_reassembly_fails_the_job_with_the_reason(tables, store_root, clip):
    job_id = upload_bytes(clip.read_bytes())
    v.start_chunking(job_id)
    segment_keys = v.chunk_source(job_id, SEGMENT, "identity")
    for key in segment_keys:
        v.infer_segment(key, backend="ffmpeg")
    record = v.completions(job_id)[1]
    (store_root / record["output_key"]).unlink()  # an output lost after its completion was recorded
    (store_root / record["output_key"]).write_bytes(b"garbage")
    with pytest.raises(v.JobFailed, match="reassembly failed"):
        v.reassemble(job_id)
    job = _job(tables, job_id)
    assert job["status"] == "failed" and job["failure_reason"].startswith("reassembly failed: ")
    assert str(store_root) not in job["failure_reason"]


def test_the_sweep_reassembles_or_fails_jobs_stuck_in_chunking_complete(tables, store_root, clip):
    complete, partial = upload_bytes(clip.read_bytes()), upload_bytes(clip.read_bytes())
    for job_id in (complete, partial):
        v.start_chunking(job_id)
        v.chunk_source(job_id, SEGMENT, "identity")
    for key in v.segment_keys_of(v.get_job(complete)):  # every segment done, the trigger fired, no reassembly
        v.infer_segment(key, backend="ffmpeg")
    v.infer_segment(v.segment_keys_of(v.get_job(partial))[0], backend="ffmpeg")  # its worker died after one
    assert video_sweep_stuck(stuck_minutes=60) == {}  # not stuck long enough yet
    swept = video_sweep_stuck(stuck_minutes=0)
    assert swept[complete] == {"job_id": complete, "status": "completed", "action": "reassembled"}
    assert (
        swept[partial]["status"] == "failed" and "with 1 of 3 segments done" in _job(tables, partial)["failure_reason"]
    )
    assert probe(store_root / keys.final_key(complete)).frames == 30
    assert video_sweep_stuck(stuck_minutes=0) == {}


def test_the_sweep_leaves_a_job_alone_while_a_run_that_holds_it_is_alive(tables, store_root, clip):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed, Running

    @flow(name="video-process-stand-in")
    def holder() -> None:
        pass

    job_id = upload_bytes(clip.read_bytes())
    v.start_chunking(job_id)
    v.chunk_source(job_id, SEGMENT, "identity")
    v.infer_segment(v.segment_keys_of(v.get_job(job_id))[0], backend="ffmpeg")  # one of three segments done so far
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(holder, state=Running())
        state_store.transition(
            tables["video_jobs"], {"job_id": job_id}, None, None, set={"prefect_flow_run_id": str(run.id)}
        )
        assert video_sweep_stuck(stuck_minutes=0) == {}  # its run is still working on it
        assert _job(tables, job_id)["status"] == "chunking_complete"
        client.set_flow_run_state(run.id, Crashed(message="worker killed (test)"), force=True)
    swept = video_sweep_stuck(stuck_minutes=0)
    assert swept[job_id]["status"] == "failed" and "with 1 of 3 segments done" in _job(tables, job_id)["failure_reason"]


# --------------------------------------------------------------------------- issue 23 item 2: a crashed run is
# recovered at once


def _video_deployment(client) -> uuid.UUID:
    """A deployment of video-process with no work pool (the test runs its flow runs itself)."""
    flow_id = client.create_flow(video_process)
    return client.create_deployment(
        flow_id, f"redrive-{uuid.uuid4().hex[:6]}", entrypoint="flows/video.py:video_process"
    )


def _hold(tables, job_id: str, run_id, **lock) -> None:
    state_store.transition(
        tables["video_jobs"], {"job_id": job_id}, None, None, set={"prefect_flow_run_id": str(run_id)}
    )
    if lock:
        state_store.put(tables["video_reassembly_locks"], {"job_id": job_id, **lock})


def test_the_reconciler_redrives_reassembles_or_fails_a_job_whose_runs_crashed(tables, store_root, clip):
    """A crashed run's report (the `records-prefect-state` flow, called directly) recovers the jobs it held the
    way `video-sweep-stuck` does, at once: re-driven through the run's deployment (bounded), reassembled, or failed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.states import Crashed, Running

    from flows.records import records_prefect_state
    from tasks import reconcile

    partial, done, spent = (upload_bytes(clip.read_bytes()) for _ in range(3))
    for job_id in (partial, done, spent):
        v.start_chunking(job_id)
        v.chunk_source(job_id, SEGMENT, "identity")
    v.infer_segment(v.segment_keys_of(v.get_job(partial))[0], backend="ffmpeg")  # 1 of 3 when its run died
    for key in v.segment_keys_of(v.get_job(done)):
        v.infer_segment(key, backend="ffmpeg")  # all 3 (the trigger took the lock); the reassembly run dies
    state_store.transition(tables["video_jobs"], {"job_id": spent}, None, None, set={"redrives": 2})
    with get_client(sync_client=True) as client:
        deployment = _video_deployment(client)
        params = {"segment_seconds": SEGMENT, "segment_retries": 0, "source_url": "file:///was/imported.mp4"}
        crashed = client.create_flow_run_from_deployment(
            deployment, parameters={**params, "job_id": partial}, state=Running()
        )
        spent_run = client.create_flow_run_from_deployment(deployment, parameters={"job_id": spent}, state=Running())
        reassembly = client.create_flow_run(video_sweep_stuck, state=Running())  # stands in for video-reassemble
        _hold(tables, partial, crashed.id)
        _hold(tables, spent, spent_run.id)
        _hold(tables, done, crashed.id, reassembly_flow_run_id=str(reassembly.id))
        for run in (crashed, spent_run):
            client.set_flow_run_state(run.id, Crashed(message="flow process killed (test)"), force=True)

        findings = records_prefect_state(crash_event(crashed.id))
        # `done` is still held by its live reassembly run: left alone; `partial` gets a new run of the deployment
        assert [(f["record"], f["action"], f["outcome"]) for f in findings] == [(partial, "-> recover", "applied")]
        job = _job(tables, partial)
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment])))
        redriven = next(r for r in runs if r.id not in (crashed.id, spent_run.id))
        assert (job["status"], job["prefect_flow_run_id"], job["redrives"]) == (
            "chunking_complete",
            str(redriven.id),
            1,
        )
        assert redriven.parameters == {"segment_seconds": SEGMENT, "segment_retries": 0, "job_id": partial}
        assert redriven.state.type.value == "SCHEDULED"
        # a second report of the same crash changes nothing and starts nothing
        assert records_prefect_state(crash_event(crashed.id)) == []
        assert (
            len(client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment]))))
            == 3
        )

        # the re-driven run (what a worker does with it) finishes the job with every frame
        from prefect.flow_engine import run_flow

        finished = run_flow(video_process, flow_run=redriven, parameters=redriven.parameters, return_type="state")
        assert finished.is_completed(), finished
        assert (_job(tables, partial)["status"], probe(store_root / keys.final_key(partial)).frames) == (
            "completed",
            30,
        )

        # the reassembly run dies too: every segment is done, so the job is reassembled right away
        client.set_flow_run_state(reassembly.id, Crashed(message="flow process killed (test)"), force=True)
        assert [f["record"] for f in records_prefect_state(crash_event(reassembly.id))] == [done]
        assert (_job(tables, done)["status"], probe(store_root / keys.final_key(done)).frames) == ("completed", 30)

        # a job re-driven twice already is failed with the reason
        assert [f["record"] for f in records_prefect_state(crash_event(spent_run.id))] == [spent]
    failed = _job(tables, spent)
    assert (failed["status"], failed["failure_reason"]) == (
        "failed",
        f"stuck in chunking_complete with 0 of 3 segments done after 2 re-drives (reconciled: record "
        f"chunking_complete while Prefect flow run {spent_run.id} Crashed); re-run video-process for the job",
    )
    assert reconcile.disagreements(["video"]) == []
    assert v.reopen_failed_job(spent) and "redrives" not in _job(tables, spent)  # a person's re-run starts afresh


# --------------------------------------------------------------------------- 10: a failed job can be re-run


def test_a_failed_job_is_rerun_after_a_good_upload(tables, store_root, clip, endpoints, monkeypatch):
    data = clip.read_bytes()
    job_id = upload_bytes(data[: len(data) // 2])  # truncated upload
    with pytest.raises(v.JobFailed, match="chunking failed"):
        _run(job_id=job_id)
    Path(store_root / keys.source_key(job_id)).write_bytes(data)  # the user uploads again to the same target
    job = _run(job_id=job_id)
    assert (job["status"], job["final_frames"], job["attempts"]) == ("completed", 30, 1)
    assert "failure_reason" not in job and "chunking failed" in job["previous_failure_reason"]

    # a job failed after some segments were processed: its old segments and completions go before the re-run
    (backend, url), _ = endpoints
    backend.behaviour = "json"
    monkeypatch.setenv("VIDEO_INFERENCE_ENDPOINT_URL", f"{url}/infer")
    other = upload_bytes(data, mode="grayscale")
    with pytest.raises(v.JobFailed):
        _run(job_id=other, mode="grayscale", segment_seconds=1.5, backend="http")
    assert len(list(LocalStore(store_root).list(keys.segments_prefix(other)))) == 2
    job = _run(job_id=other, mode="grayscale", backend="ffmpeg")
    assert (job["status"], job["total_segments"], job["final_frames"]) == ("completed", 3, 30)
    assert [r["segment_index"] for r in v.completions(other)] == [0, 1, 2]
    assert sorted(LocalStore(store_root).list(keys.segments_prefix(other))) == v.segment_keys_of(job)


# --------------------------------------------------------------------------- 11: credentials and secrets


@pytest.mark.parametrize("code", [302, 307])
def test_the_bearer_token_never_goes_to_another_host(tmp_path, clip, endpoints, code):
    (first, first_url), (other, other_url) = endpoints
    first.behaviour, first.target = f"redirect-{code}", other_url
    target = tmp_path / "out.mp4"
    if code == 302:  # the POST would become a GET without the segment: refused
        with pytest.raises(
            inference.InferenceError, match=r"redirected \(302\) to http://127.0.0.1:\d+/infer\?mode=\*\*\*"
        ):
            inference.infer_http(clip, target, "identity", f"{first_url}/infer", 30, api_key="s3cret-token")
    else:
        inference.infer_http(clip, target, "identity", f"{first_url}/infer", 30, api_key="s3cret-token")
        assert target.read_bytes() == clip.read_bytes()
    assert first.seen[0]["authorization"] == "Bearer s3cret-token"
    assert all(request["authorization"] is None for request in other.seen)
    assert len(other.seen) == (1 if code == 307 else 0)


def test_a_same_host_redirect_keeps_the_token(tmp_path, clip, endpoints):
    (first, url), _ = endpoints
    first.behaviour, first.target = "redirect-307", url
    calls = []
    original = first.do_POST

    def once(self):
        calls.append(1)
        if len(calls) > 1:
            type(self).behaviour = "ok"
        original(self)

    first.do_POST = once
    inference.infer_http(clip, tmp_path / "out.mp4", "identity", f"{url}/a", 30, api_key="tok-123")
    assert [r["authorization"] for r in first.seen] == ["Bearer tok-123"] * 2


def test_secrets_never_reach_the_record_the_logs_or_the_run_state(
    tables, store_root, clip, endpoints, monkeypatch, caplog
):
    import logging

    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    (backend, url), _ = endpoints
    backend.behaviour = "echo-key"
    monkeypatch.setenv("VIDEO_INFERENCE_ENDPOINT_URL", f"{url}/infer?api_key=KEY-in-query-42&region=eu-west-1")
    monkeypatch.setenv("VIDEO_INFERENCE_API_KEY", "bearer-secret-77")
    job_id = upload_bytes(clip.read_bytes())
    with caplog.at_level(logging.DEBUG):
        state = _run(job_id=job_id, backend="http", return_state=True)
    assert state.is_failed()
    reason = _job(tables, job_id)["failure_reason"]
    assert f"http backend: {url}/infer?api_key=***&region=*** answered 500" in reason
    # every log record the run emitted, formatted with its traceback: what Prefect's API log handler sends
    emitted = [logging.Formatter().format(record) for record in caplog.records]
    assert any("answered 500" in text for text in emitted)  # the failure is logged ...
    # ... and what the server stored of them (its SQLite may hold a batch back under load: whatever arrived)
    APILogWorker.drain_all(timeout=30)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
        stored = [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))]
    texts = [reason, state.message or "", run.state.message or "", *emitted, *stored]
    for secret in ("KEY-in-query-42", "bearer-secret-77", "eu-west-1"):
        assert not [text for text in texts if secret in text], secret  # ... without the secrets


# --------------------------------------------------------------------------- 12: keys, not local paths


def test_failure_reasons_name_object_keys_not_local_paths(tables, store_root):
    job_id = upload_bytes(b"not a video at all\n" * 10)
    with pytest.raises(v.JobFailed):
        _run(job_id=job_id)
    reason = _job(tables, job_id)["failure_reason"]
    assert f"input/{job_id}/source.mp4" in reason
    assert str(store_root) not in reason and "/tmp" not in reason and "file://" not in reason
    assert v.public_reason("ffmpeg failed: /tmp/.video-chunk-x1/part-00001.mp4: Invalid data; see http://h:1/a/b") == (
        "ffmpeg failed: part-00001.mp4: Invalid data; see http://h:1/a/b"
    )


# --------------------------------------------------------------------------- 13: allow-list of sources


def test_source_urls_outside_the_allow_list_are_refused(tables, store_root, clip, tmp_path, monkeypatch):
    allowed = tmp_path / "uploads"
    allowed.mkdir()
    (allowed / "ok.mp4").write_bytes(clip.read_bytes())
    (tmp_path / "uploads-evil").mkdir()
    (tmp_path / "uploads-evil" / "x.mp4").write_bytes(clip.read_bytes())
    monkeypatch.setenv("VIDEO_INFERENCE_SOURCE_PREFIXES", f"{allowed.as_uri()}/, s3://media-uploads/incoming/")
    for refused in [
        (tmp_path / "uploads-evil" / "x.mp4").as_uri(),  # a sibling that shares the prefix's spelling
        f"{allowed.as_uri()}/../uploads-evil/x.mp4",  # escapes with ..
        str(clip),  # a bare path elsewhere
        "s3://media-uploads/incoming-other/a.mp4",
        "s3://other-bucket/incoming/a.mp4",
        "http://example.com/a.mp4",
    ]:
        with pytest.raises(v.SourceRefused, match="not under an allowed prefix|unsupported source_url"):
            _run(source_url=refused)
    assert list(state_store.scan_all(tables["video_jobs"])) == []  # refused before any job exists
    assert v.check_source_allowed("s3://media-uploads/incoming/deep/a.mp4")
    job = _run(source_url=(allowed / "ok.mp4").as_uri())
    assert job["status"] == "completed" and job["final_frames"] == 30
    monkeypatch.delenv("VIDEO_INFERENCE_SOURCE_PREFIXES")  # empty: any source (the local default)
    assert v.check_source_allowed((tmp_path / "uploads-evil" / "x.mp4").as_uri())
