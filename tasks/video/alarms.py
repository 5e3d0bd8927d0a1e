"""What ``pipeline-health`` reads of the video pipeline: stuck and failed jobs, and its dashboard figures."""

from __future__ import annotations

from blocks.health import HealthThresholds
from tasks.core.runtime import iso_ago
from tasks.health.checks import Alarm, count_alarm, last_change
from tasks.health.dashboard import Figures, Outcomes, Window, ended_since
from tasks.video import jobs as video

HOUR_S = 3600
VIDEO_TIMES = ("created_at", "chunking_started_at", "chunking_completed_at")


def video_stuck_jobs(limits: HealthThresholds) -> Alarm:
    """Video: jobs in created / chunking_in_progress / chunking_complete unchanged for ``video_stuck_minutes``."""
    cutoff = iso_ago(limits.video_stuck_minutes * 60)
    stuck = [
        f"{job['job_id']} ({job['status']})"
        for job in video.list_jobs()
        if job.get("status") in video.ACTIVE and last_change(job, VIDEO_TIMES) < cutoff
    ]
    return count_alarm(
        "video-stuck-jobs", "video", stuck, 0, f"job(s) non-terminal > {limits.video_stuck_minutes:g} min"
    )


def video_jobs_failed(limits_: HealthThresholds) -> Alarm:
    """Seed 003: video jobs failed in the last hour."""
    since = iso_ago(HOUR_S)
    failed = [
        f"{job['job_id']}: {job.get('failure_reason', '')[:80]}"
        for job in video.list_jobs(video.FAILED)
        if str(job.get("failed_at", "")) >= since
    ]
    return count_alarm(
        "video-jobs-failed-per-hour",
        "video",
        failed,
        limits_.video_failed_hour_max,
        "video job(s) failed in the last hour",
    )


def figures(window: Window) -> Figures:
    """Video jobs that ended in the window."""
    return Figures(
        Outcomes.of(
            "video",
            "jobs",
            video.list_jobs(),
            "status",
            video.COMPLETED,
            video.FAILED,
            ended_since(window, "completed_at", "failed_at", "created_at"),
        )
    )


CHECKS = {video_stuck_jobs: ("video-stuck-jobs",)}
SERVICE_CHECKS = {video_jobs_failed: ("video-jobs-failed-per-hour",)}
