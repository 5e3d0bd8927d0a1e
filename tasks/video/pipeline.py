"""Seed 003, video chunking, inference and reassembly, as the shared machinery sees it (``tasks.core.registry``)."""

from __future__ import annotations

from tasks.core.registry import OBJECTS, Landing, Pipeline, QueueSpec, Table
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
)
