"""Demo data for the video pipeline: a generated testsrc+sine clip; the report reads the job store back."""

from __future__ import annotations

from pathlib import Path

from tasks.video import jobs as video
from tasks.video.ffmpeg import make_test_video


def make(workdir: Path) -> dict:
    """A 6 s clip with a keyframe per second; parameters for `video-process` that create the job from it."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = make_test_video(workdir / "video-source.mp4", seconds=6.0, fps=24, size="320x240", keyframe_seconds=1.0)
    return {"source_url": source.resolve().as_uri(), "segment_seconds": 1.0, "mode": "grayscale", "backend": "ffmpeg"}


def drop(workdir: Path, store) -> dict:
    """`video create-job` (grayscale, 1 s segments), then the clip written to the upload target it prints."""
    job = video.create_job(f"demo-video-{Path(workdir).name}", mode="grayscale", segment_seconds=1.0)
    store.put_file(job["source_key"], Path(make(workdir)["source_url"].removeprefix("file://")))
    return {"job_id": job["job_id"]}


def landed(job_id: str, **_: object) -> bool:
    """Whether the job has ended (completed or failed)."""
    return video.get_job(job_id)["status"] in (video.COMPLETED, video.FAILED)


def report(job_id: str, **_: object) -> str:
    """The job (GetItem), its completions (Query by job_id, in segment order) and the final output."""
    job = video.get_job(job_id)
    records = video.completions(job_id)
    lines = [
        f"video job {job_id}: {job['status']}, {job.get('total_segments')} segments, mode {job.get('mode')}",
        f"  source: {job.get('source_frames')} frames, {job.get('source_duration')} s",
        f"  final:  {job.get('final_key')} ({job.get('final_frames')} frames, {job.get('final_duration')} s)",
        f"  completions: {[r['segment_index'] for r in records]}",
    ]
    if job.get("failure_reason"):
        lines.append(f"  failed: {job['failure_reason']}")
    return "\n".join(lines)
