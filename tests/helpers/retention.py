"""Retention test helpers: finished and live records of every pipeline, and objects aged by their mtime."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from tasks.core import state_store
from tasks.gpu import jobs as gpu
from tasks.health import incidents
from tasks.phspectra import keys, survey
from tasks.video import jobs as video

ENDED = "2026-01-01T00:00:00.000000+00:00"  # when every finished record of make_records ended


def make_records(tables: dict) -> None:
    """A finished and a live record of each kind retention knows, ended (or created) at ``ENDED``."""

    def put(logical, it):
        return state_store.put(tables[logical], it)

    put("phspectra_runs", {"PK": "run-done", "SK": keys.RUN_SK, "status": survey.RUN_COMPLETED, "completed_at": ENDED})
    put("phspectra_runs", {"PK": "run-done", "SK": keys.chunk_sk(0), "status": "COMPLETED"})
    put("phspectra_runs", {"PK": "run-live", "SK": keys.RUN_SK, "status": survey.RUN_RUNNING, "created_at": ENDED})
    put("phspectra_runs", {"PK": "run-live", "SK": keys.chunk_sk(0), "status": "IN_PROGRESS"})
    put("video_jobs", {"job_id": "v-done", "status": video.COMPLETED, "completed_at": ENDED})
    put("video_segment_completions", {"job_id": "v-done", "segment_index": 0})
    put("video_reassembly_locks", {"job_id": "v-done"})
    put("video_jobs", {"job_id": "v-reopened", "status": video.CREATED, "created_at": ENDED, "ttl": 1})  # live again
    put("ecs_job", {"job_id": "g-done", "job_status": gpu.JOB_COMPLETE, "updated_at": ENDED})
    put("ecs_task", {"ecs_task_id": "t-1", "job_id": "g-done"})
    put("ecs_job", {"job_id": "g-live", "job_status": gpu.JOB_IN_PROGRESS, "updated_at": ENDED})
    put("ecs_task", {"ecs_task_id": "t-2", "job_id": "g-live"})
    put("health_incidents", {"alarm": "cleared", "status": incidents.CLEARED, "cleared_at": ENDED})
    put("health_incidents", {"alarm": "open", "status": incidents.OPEN, "opened_at": ENDED})


def aged(root, key: str, days: float, now: datetime) -> None:
    """An object at ``key`` under ``root`` last modified ``days`` before ``now``."""
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    stamp = (now - timedelta(days=days)).timestamp()
    os.utime(path, (stamp, stamp))
