"""Crash-point sweep of the video pipeline: `video-process` dies at each chosen write, then only what the product
runs afterwards (the worker's crash report, `records-reconcile`, `video-sweep-stuck`, the documented re-run,
delete + `video-delete-cleanup`) must leave every job completed with one whole final.mp4, or failed with a reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tasks.core import state_store
from tasks.core.object_store import LocalStore
from tasks.video import jobs as v
from tasks.video import keys
from tasks.video.ffmpeg import make_test_video, probe
from tests.helpers.crashpoints import count_writes, crash_points, killed, report, report_crashed_runs, run_child

pytestmark = pytest.mark.crashpoints  # `make test-sweep` takes every write; by hand 3 sampled points

SECONDS, FPS, SEGMENT = 2.0, 10, 1.0  # 2 segments, 20 frames


def process_job(job_id: str) -> str:
    """The child's step: `video-process` for an uploaded job, as a Prefect flow run."""
    from flows.video import video_process

    return video_process(job_id=job_id, segment_seconds=SEGMENT, segment_retry_delays=[0, 0])["status"]


def _new_job(clip: Path) -> str:
    job = v.create_job(mode="identity", segment_seconds=SEGMENT)
    Path(job["upload_target"]).write_bytes(clip.read_bytes())  # the user's upload, before the flow runs
    return job["job_id"]


def _recover(job_id: str) -> dict:
    """What the product runs after a crash: the worker's report, the scheduled sweeps, the documented re-run."""
    from flows.video import video_process, video_sweep_stuck
    from tasks import reconcile

    report_crashed_runs()
    reconcile.reconcile(["video"], dry_run=False)  # the body of the scheduled `records-reconcile`
    video_sweep_stuck(stuck_minutes=0)
    job = v.get_job(job_id)
    if job["status"] != v.COMPLETED:  # README: "re-run video-process for the job"
        try:
            video_process(job_id=job_id, segment_seconds=SEGMENT, segment_retry_delays=[0, 0])
        except v.JobFailed:
            pass
    return v.get_job(job_id)


@pytest.mark.timeout(1200)  # ~7 s a point on a quiet machine; a loaded one is several times slower
def test_video_process_survives_a_crash_at_every_write(tables, store_root, tmp_path):
    from tasks import reconcile

    clip = make_test_video(tmp_path / "clip.mp4", SECONDS, FPS, keyframe_seconds=SEGMENT)
    writes = count_writes(
        "tests.video.test_crashpoints_video:process_job", {"job_id": _new_job(clip)}, tmp_path / "w.log"
    )
    kinds = {w.kind for w in writes}
    assert {"objects:put_file:segments", "objects:copy:jobs", "objects:put_file:jobs"} <= kinds, kinds
    points = crash_points(writes)
    store = LocalStore(store_root)
    for n, point in enumerate(points):
        job_id = _new_job(clip)
        when = "after" if n % 2 == 0 else "before"
        result = run_child("tests.video.test_crashpoints_video:process_job", {"job_id": job_id}, f"{point}:kill:{when}")
        # both segments may see the last completion and both try the lock (the loser's write is EXISTS): a run makes
        # one write more or less than the counted one, so the last point may lie past a run's end
        finished = result.returncode == 0 and point == writes[-1].number
        assert killed(result) or finished, f"write {point} ({when}): the child was not killed\n{result.stderr[-2000:]}"
        job = _recover(job_id)
        where = f"crash at write {point} {when} ({writes[point - 1].operation} {writes[point - 1].target})"
        if job["status"] == v.COMPLETED:
            final = probe(store_root / keys.final_key(job_id))
            assert (final.frames, job["final_frames"]) == (20, 20), where
            total = job["total_segments"]
            assert sorted(store.list(f"jobs/{job_id}/")) == sorted(
                [keys.final_key(job_id)] + [keys.output_segment_key(job_id, i, total, "identity") for i in range(total)]
            ), where
            assert sorted(store.list(keys.segments_prefix(job_id))) == v.segment_keys_of(job), where
            assert [r["segment_index"] for r in v.completions(job_id)] == list(range(total)), where
        else:
            assert job["status"] == v.FAILED and job["failure_reason"], where
        # Prefect and the job record agree while the job still exists (before the delete below removes it)
        assert reconcile.disagreements(["video"]) == [], where
        # the user removes the job; the scheduled cleanup leaves nothing behind
        v.request_delete(job_id)
        assert v.deleted_jobs_awaiting_cleanup() == [job_id], where
        v.cleanup_deleted_job(job_id)  # what the scheduled `video-delete-cleanup` does for each such job
        assert not [k for k in store.list("") if job_id in k], where
        hidden = [f"{d}/{name}" for d, _, files in os.walk(store_root) for name in files if job_id in f"{d}/{name}"]
        assert hidden == [], where
        assert (
            v.completions(job_id) == []
            and state_store.get_item(tables["video_reassembly_locks"], {"job_id": job_id}) is None
        )
    report(f"video: {len(points)} crash points exercised of {len(writes)} writes: {points}")


def cleanup_job(job_id: str) -> dict:
    """The child's step: the scheduled `video-delete-cleanup` sweep."""
    from flows.video import video_delete_cleanup

    return video_delete_cleanup(job_id=job_id)


@pytest.mark.parametrize("when", ["before", "after"])
def test_delete_cleanup_survives_a_crash(tables, store_root, tmp_path, when):
    from flows.video import video_delete_cleanup, video_process

    clip = make_test_video(tmp_path / "clip.mp4", SECONDS, FPS, keyframe_seconds=SEGMENT)
    job_id = _new_job(clip)
    assert video_process(job_id=job_id, segment_seconds=SEGMENT)["status"] == "completed"
    v.request_delete(job_id)
    point = 4  # an object delete in the middle of the cleanup
    result = run_child("tests.video.test_crashpoints_video:cleanup_job", {"job_id": job_id}, f"{point}:kill:{when}")
    assert killed(result), result.stderr[-2000:]
    report_crashed_runs()
    assert v.deleted_jobs_awaiting_cleanup() == [job_id]
    video_delete_cleanup()  # the scheduled sweep finishes it
    assert v.deleted_jobs_awaiting_cleanup() == [] and not list(LocalStore(store_root).list(""))
