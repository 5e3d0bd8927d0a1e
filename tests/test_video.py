"""Video pipeline (seed 003): real ffmpeg, real DynamoDB Local, real Prefect flows."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import pytest

from flows.video import video_delete_cleanup, video_process
from tasks import keys, state_store
from tasks import video as v
from tasks.object_store import LocalStore
from tasks.video_ffmpeg import make_test_video, probe

SECONDS, FPS, SEGMENT = 5.0, 10, 1.0  # 5 segments of 10 frames


@pytest.fixture(scope="module")
def source_video(tmp_path_factory) -> Path:
    return make_test_video(tmp_path_factory.mktemp("video") / "source.mp4", SECONDS, FPS, keyframe_seconds=SEGMENT)


def _upload(store_root: Path, data: bytes, mode: str = "grayscale") -> str:
    job = v.create_job(mode=mode, segment_seconds=SEGMENT)
    assert job["upload_target"] == str(store_root / keys.source_key(job["job_id"]))
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
    assert [r["segment_key"] for r in records] == [keys.segment_key(job_id, i, 5, "grayscale") for i in range(5)]
    assert [r["output_key"] for r in records] == [keys.output_segment_key(job_id, i, 5, "grayscale") for i in range(5)]
    assert all(r["prefect_flow_run_id"] == job["prefect_flow_run_id"] and r["prefect_task_run_id"] for r in records)
    assert len({r["prefect_task_run_id"] for r in records}) == 5
    lock = state_store.get_item(tables["video_reassembly_locks"], {"job_id": job_id})
    assert {"triggered_at", "reassembly_started_at", "reassembly_completed_at"} <= set(lock)

    # every object is under the job's prefixes; the outputs really are gray
    assert set(_objects(store_root)) == (
        {keys.source_key(job_id), keys.final_key(job_id)}
        | {r["segment_key"] for r in records} | {r["output_key"] for r in records}
    )
    import av

    with av.open(str(store_root / job["final_key"])) as container:
        frame = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert abs(int(frame[..., 0].astype(int).mean()) - int(frame[..., 2].astype(int).mean())) <= 2

    # a re-run and a second reassembly are no-ops that recognise the finished job
    assert _run(job_id=job_id)["status"] == "completed"
    assert v.reassemble(job_id)["reassembled"] is False
