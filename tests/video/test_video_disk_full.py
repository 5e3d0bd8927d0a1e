"""A video job that meets a full disk waits for space (issue 53 item 5): chunking, a segment's output or the
reassembly that meets ENOSPC leaves the job active with the reason, nothing half-written published and nothing
failed; `video-sweep-stuck` leaves it waiting while the disk is full and takes it again (not counted against
``MAX_REDRIVES``) once there is room, and the job completes once with every frame.

The disk is a real tmpfs holding the object store and the jobs' scratch folders (as root; skipped cleanly
otherwise).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from flows.video import video_process, video_sweep_stuck
from tasks import reconcile
from tasks.core import state_store
from tasks.core.config import table_name
from tasks.core.object_store import LocalStore
from tasks.video import jobs as v
from tasks.video import keys
from tasks.video.ffmpeg import make_test_video, probe
from tests.helpers.disk import fill, hidden_parts, small_disk
from tests.helpers.video import assert_like_source, upload_bytes

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

SECONDS, FPS, SEGMENT = 3.0, 10, 1.0  # 3 segments of 10 frames


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return make_test_video(tmp_path_factory.mktemp("clip") / "clip.mp4", SECONDS, FPS, keyframe_seconds=SEGMENT)


@pytest.fixture
def small_store(tables, tmp_path, monkeypatch) -> Path:
    """The object store on a small disk of its own, its scratch folders beside it on the same disk."""
    with small_disk(tmp_path / "disk", megabytes=8) as mount:
        root = mount / "objects"
        root.mkdir()
        monkeypatch.setenv("OBJECT_STORE_BASE_URL", root.as_uri())
        yield root


def _job(job_id: str) -> dict:
    return state_store.to_plain(state_store.get_item(table_name("video_jobs"), {"job_id": job_id}))


def _nothing_half_written(root: Path, job_id: str) -> None:
    """No segment of an unfinished chunking, no final.mp4, no .part and no scratch folder left behind."""
    assert not (root / keys.final_key(job_id)).exists()
    assert not hidden_parts(root.parent)
    assert [p.name for p in root.parent.iterdir() if p.name.startswith(".video-")] == []


def _process_runs(client, deployment) -> list:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment])))


def _video_deployment(client) -> uuid.UUID:
    """A deployment of video-process with no work pool (the test runs its flow runs itself, as a worker would)."""
    flow_id = client.create_flow(video_process)
    return client.create_deployment(flow_id, f"space-{uuid.uuid4().hex[:6]}", entrypoint="flows/video.py:video_process")


def _run(flow_run) -> None:
    from prefect.flow_engine import run_flow

    state = run_flow(video_process, flow_run=flow_run, parameters=flow_run.parameters, return_type="state")
    assert state.is_completed(), state


def test_a_job_whose_chunking_meets_a_full_disk_waits_and_is_redriven_once_there_is_room(small_store, clip):
    from prefect.client.orchestration import get_client

    job_id = upload_bytes(clip.read_bytes(), mode="grayscale")
    filler = fill(small_store)
    with get_client(sync_client=True) as client:
        deployment = _video_deployment(client)
        params = {"job_id": job_id, "segment_seconds": SEGMENT, "segment_retries": 0}
        first = client.create_flow_run_from_deployment(deployment, parameters=params)
        _run(first)  # its run ends: the job waits, it is not failed

        job = _job(job_id)
        assert job["status"] == "chunking_in_progress" and "failure_reason" not in job
        assert (
            job["waiting_for_space"].startswith("chunking met a full disk")
            and "No space left" in job["waiting_for_space"]
        )
        assert job["waiting_for_space_since"] and job["prefect_flow_run_id"] == str(first.id)
        assert list(LocalStore(small_store).list(keys.segments_prefix(job_id))) == []
        _nothing_half_written(small_store, job_id)

        for _ in range(2):  # still full: left waiting, no run started, nothing counted
            assert video_sweep_stuck() == {}
        assert reconcile.disagreements(["video"]) == []  # a waiting job is the sweep's, not a crash to recover
        assert [r.id for r in _process_runs(client, deployment)] == [first.id]
        assert _job(job_id)["waiting_for_space"] == job["waiting_for_space"]

        filler.unlink()
        swept = video_sweep_stuck()
        assert swept[job_id]["action"] == "re-driven"
        job = _job(job_id)
        (redriven,) = [r for r in _process_runs(client, deployment) if r.id != first.id]
        assert job["prefect_flow_run_id"] == str(redriven.id) and job["space_redrives"] == 1
        assert "redrives" not in job and "waiting_for_space" not in job  # MAX_REDRIVES is for crashes
        assert video_sweep_stuck() == {}  # no longer waiting: its new run has it

        _run(redriven)
    job = v.get_job(job_id)
    assert job["status"] == "completed" and "waiting_for_space" not in job
    assert_like_source(clip, job, small_store)
    assert probe(small_store / keys.final_key(job_id)).frames == 30
    assert [c["segment_index"] for c in v.completions(job_id)] == [0, 1, 2]  # each segment once


def test_a_job_whose_segments_meet_a_full_disk_keeps_what_was_done_and_finishes_once_there_is_room(small_store, clip):
    from prefect.client.orchestration import get_client

    job_id = upload_bytes(clip.read_bytes(), mode="grayscale")
    with get_client(sync_client=True) as client:
        deployment = _video_deployment(client)
        params = {"job_id": job_id, "segment_seconds": SEGMENT, "segment_retries": 0}
        first = client.create_flow_run_from_deployment(deployment, parameters=params)
        v.start_chunking(job_id)
        v.chunk_source(job_id, SEGMENT, "grayscale")  # chunked by its run (as that run's record says) ...
        held = {"prefect_flow_run_id": str(first.id)}
        state_store.transition(table_name("video_jobs"), {"job_id": job_id}, None, None, set=held)
        v.infer_segment(v.segment_keys_of(v.get_job(job_id))[0], backend="ffmpeg")  # ... one segment done
        filler = fill(small_store)  # then the disk fills
        _run(first)

        job = _job(job_id)
        assert job["status"] == "chunking_complete" and "failure_reason" not in job
        assert job["waiting_for_space"].startswith("2 of 3 segments met a full disk")
        assert [c["segment_index"] for c in v.completions(job_id)] == [0]  # the done segment stays done
        outputs = sorted(LocalStore(small_store).list(keys.job_output_prefix(job_id)))
        assert len(outputs) == 1 and "00000_" in outputs[0]  # no output of a segment that met the full disk
        _nothing_half_written(small_store, job_id)
        assert video_sweep_stuck() == {}

        filler.unlink()
        assert video_sweep_stuck()[job_id]["action"] == "re-driven"
        (redriven,) = [r for r in _process_runs(client, deployment) if r.id != first.id]
        _run(redriven)
    job = v.get_job(job_id)
    assert job["status"] == "completed" and job["space_redrives"] == 1 and "redrives" not in job
    assert_like_source(clip, job, small_store)
    assert [c["segment_index"] for c in v.completions(job_id)] == [0, 1, 2]


def test_a_reassembly_that_meets_a_full_disk_waits_and_the_sweep_reassembles_once_there_is_room(small_store, clip):
    job_id = upload_bytes(clip.read_bytes())  # identity: the outputs are links to the segments, no new space
    v.start_chunking(job_id)
    for key in v.chunk_source(job_id, SEGMENT, "identity"):
        v.infer_segment(key, backend="ffmpeg")  # every segment done, the trigger fired; the reassembly is to come
    filler = fill(small_store)

    result = video_process(job_id=job_id, segment_seconds=SEGMENT, segment_retries=0)  # its reassembly meets it

    assert result["status"] == "chunking_complete"
    job = _job(job_id)
    assert job["status"] == "chunking_complete" and "failure_reason" not in job
    assert (
        job["waiting_for_space"].startswith("reassembly met a full disk")
        and "No space left" in job["waiting_for_space"]
    )
    assert str(small_store) not in job["waiting_for_space"]  # object keys, not local paths, as in failure reasons
    _nothing_half_written(small_store, job_id)
    assert video_sweep_stuck() == {}  # still full: left waiting
    assert _job(job_id)["status"] == "chunking_complete"

    filler.unlink()
    swept = video_sweep_stuck()
    assert swept[job_id] == {"job_id": job_id, "status": "completed", "action": "reassembled"}
    job = v.get_job(job_id)
    assert job["status"] == "completed" and "waiting_for_space" not in job and "redrives" not in job
    assert_like_source(clip, job, small_store)
    assert video_sweep_stuck() == {}
