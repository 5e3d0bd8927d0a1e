"""Video pipeline (seed 003): real ffmpeg, real DynamoDB Local, real Prefect flows."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flows.video import video_delete_cleanup, video_process
from tasks.core import keys, state_store
from tasks.core.object_store import LocalStore
from tasks.video import jobs as v
from tasks.video import keys as video_keys
from tasks.video.ffmpeg import make_test_video, probe

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

SECONDS, FPS, SEGMENT = 5.0, 10, 1.0  # 5 segments of 10 frames


@pytest.fixture(scope="module")
def source_video(tmp_path_factory) -> Path:
    return make_test_video(tmp_path_factory.mktemp("video") / "source.mp4", SECONDS, FPS, keyframe_seconds=SEGMENT)


def _upload(store_root: Path, data: bytes, mode: str = "grayscale") -> str:
    job = v.create_job(mode=mode, segment_seconds=SEGMENT)
    assert job["upload_target"] == str(store_root / video_keys.source_key(job["job_id"]))
    Path(job["upload_target"]).write_bytes(data)
    return job["job_id"]


def _objects(store_root: Path) -> list[str]:
    return sorted(LocalStore(store_root).list(""))


def _run(**params):
    return video_process(segment_seconds=SEGMENT, segment_retry_delays=[0, 0], **params)


def test_process_flow_grayscale_end_to_end(tables, store_root, source_video):
    job_id = _upload(store_root, source_video.read_bytes())
    job = _run(job_id=job_id, mode="grayscale")
    assert job["status"] == "completed" and job["total_segments"] == 5
    assert job["final_key"] == f"jobs/{job_id}/final.mp4"
    assert job["prefect_flow_run_id"] and job["prefect_task_run_id"]

    source, final = probe(source_video), probe(store_root / job["final_key"])
    boundaries = job["total_segments"] - 1
    assert abs(final.frames - source.frames) <= boundaries and source.frames == 50
    assert abs(final.duration - source.duration) <= boundaries / FPS
    assert final.has_audio
    assert job["final_frames"] == final.frames and job["source_frames"] == 50

    records = v.completions(job_id)
    assert [r["segment_index"] for r in records] == list(range(5))
    assert [r["segment_key"] for r in records] == [video_keys.segment_key(job_id, i, 5, "grayscale") for i in range(5)]
    assert [r["output_key"] for r in records] == [
        video_keys.output_segment_key(job_id, i, 5, "grayscale") for i in range(5)
    ]
    assert all(r["prefect_flow_run_id"] == job["prefect_flow_run_id"] and r["prefect_task_run_id"] for r in records)
    assert len({r["prefect_task_run_id"] for r in records}) == 5
    lock = state_store.get_item(tables["video_reassembly_locks"], {"job_id": job_id})
    assert {"triggered_at", "reassembly_started_at", "reassembly_completed_at"} <= set(lock)

    # every object is under the job's prefixes; the outputs really are gray
    assert set(_objects(store_root)) == (
        {video_keys.source_key(job_id), video_keys.final_key(job_id)}
        | {r["segment_key"] for r in records}
        | {r["output_key"] for r in records}
    )
    import av

    with av.open(str(store_root / job["final_key"])) as container:
        frame = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert abs(int(frame[..., 0].astype(int).mean()) - int(frame[..., 2].astype(int).mean())) <= 2

    assert list(store_root.parent.glob(".video-*")) == []  # scratch folders beside the store are gone

    # a re-run and a second reassembly are no-ops that recognise the finished job
    assert _run(job_id=job_id)["status"] == "completed"
    assert v.reassemble(job_id)["reassembled"] is False


def test_a_job_is_processed_with_the_mode_and_segment_length_it_was_created_with(
    tables, store_root, source_video, monkeypatch
):
    """`video create-job --mode grayscale --segment-seconds 1` then `video-process` with only the job id: the job's
    own settings, not the block's defaults (here 2.5 s segments, identity)."""
    monkeypatch.setenv("VIDEO_INFERENCE_SEGMENT_SECONDS", "2.5")
    monkeypatch.setenv("VIDEO_INFERENCE_MODE", "identity")
    job_id = _upload(store_root, source_video.read_bytes(), mode="grayscale")  # created with 1 s segments
    job = video_process(job_id=job_id, segment_retry_delays=[0, 0])
    assert (job["status"], job["total_segments"]) == ("completed", 5)
    outputs = [k for k in _objects(store_root) if k.startswith(f"jobs/{job_id}/segments/")]
    assert outputs == [video_keys.output_segment_key(job_id, i, 5, "grayscale") for i in range(5)]
    # a run's own parameters still come first
    other = _upload(store_root, source_video.read_bytes(), mode="grayscale")
    assert (
        video_process(job_id=other, segment_seconds=2.5, mode="identity", segment_retry_delays=[0, 0])["total_segments"]
        == 2
    )


def test_http_backend_stores_the_endpoints_responses(tables, store_root, source_video, http_backend):
    job_id = _upload(store_root, source_video.read_bytes(), mode="identity")
    job = _run(job_id=job_id, mode="identity", backend="http")
    assert job["status"] == "completed"
    assert sorted(http_backend.requests) == ["/infer?mode=identity"] * 5
    for record in v.completions(job_id):  # the output is exactly what the endpoint answered (an echo)
        assert (store_root / record["output_key"]).read_bytes() == (store_root / record["segment_key"]).read_bytes()
    final = probe(store_root / job["final_key"])
    assert final.frames == 50 and final.has_audio


@pytest.mark.parametrize(
    ("behaviour", "retries", "reason"),
    [("error", 2, "answered 500 model crashed"), ("slow", 1, "timed out after 0.5 s")],
)
def test_backend_errors_are_retried_then_fail_the_job(
    tables, store_root, source_video, http_backend, behaviour, retries, reason, monkeypatch
):
    http_backend.behaviour = behaviour
    monkeypatch.setenv("VIDEO_INFERENCE_TIMEOUT_S", "0.5")  # the slow endpoint answers after 1.5 s
    job_id = _upload(store_root, source_video.read_bytes(), mode="identity")
    with pytest.raises(v.JobFailed, match=reason):
        _run(job_id=job_id, mode="identity", backend="http", segment_retries=retries)
    assert len(http_backend.requests) == 5 * (retries + 1)  # every segment tried 1 + retries times
    job = state_store.to_plain(state_store.get_item(tables["video_jobs"], {"job_id": job_id}))
    assert job["status"] == "failed"
    assert job["failure_reason"].startswith("5 of 5 segments failed after retries; first: 00000_00005_identity.mp4")
    assert reason in job["failure_reason"]
    assert (
        v.completions(job_id) == []
        and state_store.get_item(tables["video_reassembly_locks"], {"job_id": job_id}) is None
    )
    assert all(
        k.startswith((video_keys.input_prefix(job_id), video_keys.segments_prefix(job_id)))
        for k in _objects(store_root)
    )


@pytest.mark.parametrize(
    ("name", "make_bytes", "reason"),
    [
        ("not a video", lambda src: b"this is a text file, not a video\n" * 20, "not a readable video"),
        ("zero-length", lambda src: b"", "the upload is empty (0 bytes)"),
        (
            "truncated",
            lambda src: src[: len(src) // 2],
            "source.mp4 is cut off: an mp4/mov without its index (moov atom)",
        ),
        ("audio only", None, "the file has no video stream"),
    ],
)
def test_bad_input_fails_the_job_with_the_reason(tables, store_root, source_video, tmp_path, name, make_bytes, reason):
    if make_bytes is None:
        import ffmpeg

        from tasks.video.ffmpeg import run

        audio = tmp_path / "audio.mp4"
        run(ffmpeg.input("sine=duration=1", f="lavfi").output(str(audio), acodec="aac"))
        data = audio.read_bytes()
    else:
        data = make_bytes(source_video.read_bytes())
    job_id = _upload(store_root, data)
    with pytest.raises(v.JobFailed, match=f"chunking failed: .*{re.escape(reason)}"):
        _run(job_id=job_id)
    job = state_store.to_plain(state_store.get_item(tables["video_jobs"], {"job_id": job_id}))
    assert job["status"] == "failed" and reason in job["failure_reason"] and "total_segments" not in job
    assert _objects(store_root) == [video_keys.source_key(job_id)]  # input kept, nothing else written
    with pytest.raises(ValueError, match="is failed: it cannot be processed"):
        v.start_chunking(job_id)


def test_missing_upload_fails_the_job(tables, store_root):
    job_id = v.create_job(mode="identity")["job_id"]
    with pytest.raises(v.JobFailed, match=f"no upload at input/{job_id}/source.mp4"):
        _run(job_id=job_id)
    assert v.get_job(job_id)["status"] == "failed"


def test_job_ids_that_could_escape_are_refused(tables, store_root):
    for bad in ["../escape", "a/b", "..", "x/../../y", ""]:
        for call in (v.create_job, v.get_job, v.request_delete, v.start_chunking):
            with pytest.raises(keys.InvalidKey, match="invalid job_id"):
                call(bad)
    with pytest.raises(keys.InvalidKey, match="invalid job_id '../escape'"):
        _run(job_id="../escape")
    assert _objects(store_root) == [] and list(state_store.scan_all(tables["video_jobs"])) == []


def _job_ready_for_trigger(tables, job_id: str, total: int) -> None:
    """A job record at chunking_complete, every completion but the last (no video: the trigger only reads records)."""
    state_store.create_if_absent(tables["video_jobs"], {"job_id": job_id, "status": "created"}, ["job_id"])
    assert state_store.transition(tables["video_jobs"], {"job_id": job_id}, "created", "chunking_in_progress")
    assert state_store.transition(
        tables["video_jobs"],
        {"job_id": job_id},
        "chunking_in_progress",
        "chunking_complete",
        set={"total_segments": total},
    )
    state_store.create_many_if_absent(
        tables["video_segment_completions"],
        [{"job_id": job_id, "segment_index": i} for i in range(total - 1)],
        ["job_id", "segment_index"],
    )


@pytest.mark.sweep  # slow for make test; CI runs it in make test-sweep
def test_trigger_on_write_fires_exactly_once_under_8_threads_50_rounds(tables):
    total, threads, rounds = 5, 8, 50
    started_per_round = []
    with ThreadPoolExecutor(threads) as pool:  # the same 8 threads every round (each keeps its boto3 client)
        for round_no in range(rounds):
            job_id = f"race-{round_no}"
            _job_ready_for_trigger(tables, job_id, total)
            assert v.trigger_on_write(job_id) is False  # one segment still missing: no trigger
            barrier = threading.Barrier(threads)

            def last_segment_finishes(worker: int, job_id=job_id, barrier=barrier):
                barrier.wait()
                segment = video_keys.SegmentKey(job_id, total - 1, total, "identity")
                v.record_completion(segment, video_keys.output_segment_key(job_id, total - 1, total, "identity"))
                if v.trigger_on_write(job_id):  # won the lock: start reassembly (claim reassembly_started_at)
                    return worker, v.claim_reassembly(job_id, owner=f"worker-{worker}").applied
                return None

            started = [r for r in pool.map(last_segment_finishes, range(threads)) if r is not None]
            started_per_round.append(started)
            assert v.count_completions(job_id) == total
    assert [len(s) for s in started_per_round] == [1] * rounds
    assert all(applied for s in started_per_round for _, applied in s)
    locks = list(state_store.scan_all(tables["video_reassembly_locks"]))
    assert len(locks) == rounds and all("reassembly_started_at" in item for item in locks)


def test_only_one_worker_claims_the_reassembly_lock(tables):
    _job_ready_for_trigger(tables, "claim", 1)
    assert v.trigger_on_write("claim") is False
    v.record_completion(video_keys.SegmentKey("claim", 0, 1, "identity"), "jobs/claim/segments/x.mp4")
    assert v.trigger_on_write("claim") is True and v.trigger_on_write("claim") is False
    barrier = threading.Barrier(8)
    results = {}

    def claim(worker: int) -> None:
        barrier.wait()
        results[worker] = v.claim_reassembly("claim", owner=f"w{worker}").applied

    pool = [threading.Thread(target=claim, args=(w,)) for w in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    winner = [w for w, applied in results.items() if applied]
    assert len(winner) == 1
    assert v.claim_reassembly("claim", owner=f"w{winner[0]}").applied  # the owner's retry re-claims
    assert not v.claim_reassembly("claim", owner="late").applied
    assert v.claim_reassembly("claim", owner="rescuer", stale_after_s=-1).applied  # a stale claim is taken over


_CLAIM_AND_HANG = """
import sys, time
from tasks.video import jobs as video
assert video.claim_reassembly(sys.argv[1], owner="doomed-worker").applied
print("claimed", flush=True)
time.sleep(120)
"""


def test_a_segment_that_does_not_finish_the_job_reads_the_job_once(tables, store_root, source_video, monkeypatch):
    job_id = _upload(store_root, source_video.read_bytes(), mode="identity")
    v.start_chunking(job_id)
    segment_keys = v.chunk_source(job_id, SEGMENT, "identity")
    job_reads = []
    get_item = state_store.get_item
    monkeypatch.setattr(
        state_store, "get_item", lambda table, *a, **k: job_reads.append(table) or get_item(table, *a, **k)
    )
    triggered = []
    for key in segment_keys:
        job_reads.clear()
        triggered.append(v.infer_segment(key, backend="ffmpeg")["triggered"])
        triggered.append(job_reads.count(tables["video_jobs"]))
    # each segment reads the job once (its status, frames); the trigger reads it again only at the last completion
    assert triggered == [False, 1] * 4 + [True, 2]
    assert v.trigger_on_write(job_id, 5) is False  # the lock is taken: no second winner


def test_a_rerun_reassembles_when_the_worker_died_after_the_trigger(tables, store_root, source_video):
    job_id = _upload(store_root, source_video.read_bytes(), mode="identity")
    v.start_chunking(job_id)
    segment_keys = v.chunk_source(job_id, SEGMENT, "identity")
    triggered = [v.infer_segment(k, backend="ffmpeg")["triggered"] for k in segment_keys]
    assert triggered == [False] * 4 + [True]  # the last completion won the lock ... and its worker dies

    # a real reassembly worker claims the lock and is SIGKILLed before it writes anything
    worker = subprocess.Popen(
        [sys.executable, "-c", _CLAIM_AND_HANG, job_id],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout.readline().strip() == "claimed"
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    assert worker.returncode == -signal.SIGKILL
    assert v.get_job(job_id)["status"] == "chunking_complete" and v.reassembly_pending(job_id)

    # another worker finds the fresh claim and leaves it alone; once the claim is stale, reassembly takes over
    assert v.reassemble(job_id) == {
        "job_id": job_id,
        "status": "chunking_complete",
        "reassembled": False,
        "skipped": "another worker holds the lock",
    }
    assert not (store_root / video_keys.final_key(job_id)).exists()
    job = _run(job_id=job_id, reassembly_stale_after_s=0)  # a re-run of the flow finds the pending reassembly
    assert job["status"] == "completed" and job["final_frames"] == 50
    lock = state_store.get_item(tables["video_reassembly_locks"], {"job_id": job_id})
    assert lock["reassembly_owner"] != "doomed-worker" and "reassembly_completed_at" in lock
    assert not v.reassembly_pending(job_id)


def test_delete_cleans_up_and_the_job_reads_as_not_found(tables, store_root, tmp_path, capsys):
    from deployments.cli import main
    from deployments.samples.video import make, report

    other = _upload(store_root, b"another job's upload")  # must survive the cleanup
    with pytest.raises(ValueError, match="is created: only completed or failed jobs can be deleted"):
        v.request_delete(other)
    # the demo's parameters: the flow creates the job from a source_url
    job = video_process(**make(tmp_path / "demo"), segment_retry_delays=[0, 0])
    job_id = job["job_id"]
    assert (job["status"], job["total_segments"], job["mode"]) == ("completed", 6, "grayscale")
    assert report(job_id).splitlines()[0] == f"video job {job_id}: completed, 6 segments, mode grayscale"
    assert v.request_delete(job_id)["status"] == "deleted"
    with pytest.raises(LookupError, match="not found"):
        v.get_job(job_id)
    assert job_id not in [j["job_id"] for j in v.list_jobs()]
    assert v.deleted_jobs_awaiting_cleanup() == [job_id]
    removed = video_delete_cleanup()  # the scheduled sweep: every deleted job not yet cleaned up
    assert removed == {job_id: {"objects": 1 + 6 + 6 + 1, "completion_records": 6, "locks": 1}}
    assert video_delete_cleanup() == {} and v.deleted_jobs_awaiting_cleanup() == []
    assert _objects(store_root) == [video_keys.source_key(other)]
    assert (
        v.completions(job_id) == []
        and state_store.get_item(tables["video_reassembly_locks"], {"job_id": job_id}) is None
    )
    row = state_store.get_item(tables["video_jobs"], {"job_id": job_id})
    assert row["status"] == "deleted" and "deleted_at" in row and "cleaned_up_at" in row
    assert main(["video", "get-job", job_id]) == 2
    assert f"video job '{job_id}' not found" in capsys.readouterr().err
    assert main(["video", "delete", job_id, "--cleanup", "none"]) == 2


def test_deleting_a_running_job_is_refused(tables, store_root, capsys):
    from deployments.cli import main

    job_id = v.create_job(mode="identity")["job_id"]
    v.start_chunking(job_id)
    assert main(["video", "delete", job_id, "--cleanup", "none"]) == 2
    assert "is chunking_in_progress: only completed or failed jobs can be deleted" in capsys.readouterr().err
    assert v.get_job(job_id)["status"] == "chunking_in_progress"


def test_cli_create_get_list(tables, store_root, capsys):
    import json

    from deployments.cli import main

    assert main(["video", "create-job", "--job-id", "cli-job", "--mode", "scale", "--segment-seconds", "2"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created == {
        "job_id": "cli-job",
        "status": "created",
        "source_key": "input/cli-job/source.mp4",
        "upload_target": str(store_root / "input/cli-job/source.mp4"),
    }
    assert main(["video", "create-job", "--job-id", "cli-job"]) == 2
    assert "already exists (status created)" in capsys.readouterr().err
    assert main(["video", "get-job", "cli-job"]) == 0
    job = json.loads(capsys.readouterr().out)
    assert (job["status"], job["mode"], job["segment_seconds"]) == ("created", "scale", 2)
    assert main(["video", "list", "--status", "created"]) == 0
    assert [j["job_id"] for j in json.loads(capsys.readouterr().out)] == ["cli-job"]
    assert main(["video", "create-job", "--job-id", "../x"]) == 2


def test_the_run_that_wins_the_trigger_reassembles_in_its_own_process(tables, store_root, source_video):
    """Issue 25: no second flow run on the user's path. The run whose completion created the lock claims it and
    writes final.mp4 as a task of its own; a reassembly run started later for the job (a trigger seen elsewhere)
    finds the job completed and writes nothing, moves no status."""
    from prefect.client.orchestration import get_client

    from flows.video import video_reassemble
    from tests.helpers.prefect_runs import wait_for

    job_id = _upload(store_root, source_video.read_bytes(), mode="identity")
    # a deployment that does not exist: starting `video-reassemble` would fail the run
    job = _run(job_id=job_id, mode="identity", reassembly_deployment="video-reassemble/not-deployed")
    assert (job["status"], job["final_frames"]) == ("completed", 50)
    lock = state_store.to_plain(state_store.get_item(tables["video_reassembly_locks"], {"job_id": job_id}))
    assert lock["reassembly_owner"] == lock["prefect_flow_run_id"] == job["prefect_flow_run_id"]
    assert "reassembly_flow_run_id" not in lock

    def task_run():  # the server records task runs from their events, a moment after they ran
        from prefect.exceptions import ObjectNotFound

        with get_client(sync_client=True) as client, contextlib.suppress(ObjectNotFound):
            return client.read_task_run(lock["prefect_task_run_id"])

    claimed_by = wait_for(task_run, 60, "the reassemble task run on the server")
    # the reassembly is a task run of the process run: its logs and retries are on that run's page in the UI
    assert (claimed_by.name.split("-")[0], str(claimed_by.flow_run_id)) == ("reassemble", job["prefect_flow_run_id"])

    final = store_root / video_keys.final_key(job_id)
    written = (final.stat().st_ino, final.stat().st_mtime_ns)
    assert video_reassemble(job_id) == {
        "job_id": job_id,
        "status": "completed",
        "final_key": video_keys.final_key(job_id),
        "reassembled": False,
    }
    assert (final.stat().st_ino, final.stat().st_mtime_ns) == written  # no second final.mp4
    assert v.get_job(job_id) == job  # no second transition: completed_at, final_* as the process run wrote them
    assert state_store.to_plain(state_store.get_item(tables["video_reassembly_locks"], {"job_id": job_id})) == lock


def test_concat_retimes_the_parts_in_one_ffmpeg_call_a_batch_and_keeps_every_frame(tmp_path, monkeypatch):
    from tasks.video import ffmpeg as video_ffmpeg

    source = make_test_video(tmp_path / "source.mp4", 6.0, 10, "160x120", 1.0)
    parts = video_ffmpeg.segment(source, tmp_path / "parts", 1.0, video_ffmpeg.OWN_DEMUXER)
    for part in parts[::2]:  # every other part re-encoded, as a backend's output is
        video_ffmpeg.transform(part, part.with_name(part.stem + "-gray.mp4"), "grayscale")
    parts = [part.with_name(part.stem + "-gray.mp4") if n % 2 == 0 else part for n, part in enumerate(parts)]
    assert len(parts) == 6
    commands: list[list[str]] = []
    run = video_ffmpeg.run
    monkeypatch.setattr(video_ffmpeg, "run", lambda stream: (commands.append(stream.compile()), run(stream))[1])
    monkeypatch.setattr(video_ffmpeg, "RETIME_BATCH", 4)
    video_ffmpeg.concat(parts, tmp_path / "final.mp4")
    assert len(commands) == 3  # parts 0-3 and 4-5 retimed, one call each, then the concat itself
    assert [command.count("-i") for command in commands[:2]] == [4, 2]
    final = probe(tmp_path / "final.mp4")
    assert final.frames == 60 and abs(final.duration - 6.0) < 1e-6
    for part in parts:  # the packets' span is what the full probe measures
        assert video_ffmpeg.video_span(part) == probe(part).duration
