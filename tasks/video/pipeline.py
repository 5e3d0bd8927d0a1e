"""Seed 003, video chunking, inference and reassembly, as the shared machinery sees it (``tasks.core.registry``)."""

from __future__ import annotations

from tasks.core.registry import OBJECTS, SET, Deployment, Landing, Pipeline, QueueSpec, Table
from tasks.core.tables import TableSpec
from tasks.video import keys

PIPELINE = Pipeline(
    name="video",
    seed=3,
    tables={  # the seed describes them abstractly: the names are ours
        "video_jobs": Table(TableSpec("job_id", ttl_attribute="ttl"), "video-jobs-{env}"),
        "video_segment_completions": Table(
            TableSpec("job_id", "segment_index", key_types={"segment_index": "N"}, ttl_attribute="ttl"),
            "video-segment-completions-{env}",
        ),
        "video_reassembly_locks": Table(TableSpec("job_id", ttl_attribute="ttl"), "video-reassembly-locks-{env}"),
    },
    # an upload's object-created event notifies the chunking queue; the seed gives no timeout, so 15 minutes covers
    # the chunking it starts (an ffmpeg split of a whole upload)
    landing=Landing(
        "video-listen",
        keys.VIDEO_INPUT_PREFIX,
        QueueSpec("video-chunking-{env}", "video-chunking-dlq-{env}", 900, OBJECTS, keys.VIDEO_INPUT_PREFIX),
        suffixes=(".mp4",),
    ),
    flows=("video-process", "video-reassemble"),
    maintenance_flows=("video-sweep-stuck", "video-delete-cleanup"),
    health_checks="tasks.video.alarms:CHECKS",
    service_checks="tasks.video.alarms:SERVICE_CHECKS",
    severities={"video-stuck-jobs": "WARNING", "video-jobs-failed-per-hour": "CRITICAL"},
    retention_rules="tasks.video.retention:RULES",
    reconcile_adapters="tasks.video.reconcile:ADAPTERS",
    dashboard="tasks.video.alarms:figures",
    aws="tasks.video.aws:PARTS",
    deployments=(
        Deployment(
            "flows/video.py:video_process",
            "Seed 003: chunk with ffmpeg → map(inference) → trigger-on-write reassembly.",
            limit="fan_out_local",
            aws_limit="video_limit_aws",
            parameters={"reassembly_deployment": f"video-reassemble/{SET}"},
        ),
        Deployment(
            "flows/video.py:video_reassemble",
            "Concatenate a job's processed segments into final.mp4 (one worker per job, by lock).",
            limit="fan_out_local",
            aws_limit="video_limit_aws",
        ),
        Deployment(
            "flows/video.py:video_delete_cleanup",
            "Remove a soft-deleted job's objects and records; the job row stays `deleted`.",
            schedule="every_10_minutes",
            maintenance_service=True,
        ),
        Deployment(
            "flows/video.py:video_sweep_stuck",
            "Jobs left chunking_complete (no live run): reassemble when every segment is done, else re-drive"
            " (bounded), else fail.",
            schedule="every_10_minutes",
            maintenance_service=True,
        ),
        Deployment(
            "flows/video.py:video_listen",
            "Seed 003 upload event: an object at input/{job_id}/source.mp4 starts one video-process run for its job"
            " (a second event starts nothing).",
            parameters={"process_deployment": f"video-process/{SET}"},
        ),
    ),
    record_flows=("video-process", "video-reassemble", "video-sweep-stuck"),
)
