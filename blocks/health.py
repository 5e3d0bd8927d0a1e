"""Thresholds of the ``pipeline-health`` alarms (seed 001's CloudWatch alarms, over all five pipelines)."""

from __future__ import annotations

from pydantic import Field

from blocks.base import ConfigBlock

__all__ = ["HealthThresholds"]


class HealthThresholds(ConfigBlock):
    """When each alarm fires (env ``HEALTH_<FIELD>`` overrides) and where its notification goes."""

    _block_type_name = "Pipeline Health Thresholds"

    dead_letter_max: int = Field(
        default=0, description="Records: alarm when the dead-letter archive holds more objects."
    )
    pending_file_minutes: float = Field(
        default=60, description="ETL: a file pending longer than this is late (seed: 1 hour)."
    )
    late_pending_files_max: int = Field(default=0, description="ETL: alarm when more files are late than this.")
    iterator_age_seconds: float = Field(
        default=60,
        description="ETL: a pending file a full batch could have taken waited this long "
        "(seed IteratorAgeHigh: > 60 s).",
    )
    read_throttles_5min_max: int = Field(
        default=5, description="ETL: throttled reads of the tracking table in 5 min (seed: > 5)."
    )
    write_throttles_5min_max: int = Field(
        default=5, description="ETL: throttled writes of the tracking table in 5 min (seed: > 5)."
    )
    pending_files_max: int = Field(
        default=1000, description="ETL: alarm when more files are pending (seed: depth > 1000)."
    )
    failed_manifests_max: int = Field(default=0, description="ETL: alarm when more manifests are failed.")
    merge_paused_minutes: float = Field(
        default=30,
        description="ETL: alarm when the merge deployment stays paused longer (its circuit breaker open: a trial "
        "every 5 min; or a pause nothing resumes).",
    )
    stuck_chunk_minutes: float = Field(
        default=30, description="phspectra: a chunk IN_PROGRESS longer than this is stuck (the sweep re-drives at 15)."
    )
    video_stuck_minutes: float = Field(
        default=60, description="Video: a job unchanged this long in a non-terminal status."
    )
    gpu_job_stuck_minutes: float = Field(
        default=60, description="GPU: a job this long in PENDING_HEALTHCHECK / PENDING_RESTART / RESTARTING."
    )
    gpu_job_running_minutes: float = Field(default=1440, description="GPU: a job IN_PROGRESS this long with no update.")
    gpu_node_out_minutes: float = Field(default=15, description="GPU: a node FAILED / REBOOTING / UNKNOWN this long.")
    failed_runs_5min_max: int = Field(
        default=10, description="All: flow runs failed/crashed in 5 min (seed Lambda-Errors: > 10)."
    )
    failed_merge_runs_5min_max: int = Field(
        default=0, description="ETL: merge runs failed in 5 min (seed ExecutionFailed: > 0)."
    )
    waiting_runs_max: int = Field(default=5, description="All: runs held by a concurrency limit (seed throttles: > 5).")
    active_runs_max: int = Field(
        default=40, description="All: flow runs running at once (seed ConcurrentExecutions: > 40)."
    )
    duration_alarm_fraction: float = Field(
        default=0.8, description="All: a run past this share of its timeout (seed DurationHigh: 80%)."
    )
    merge_file_failures_5min_max: int = Field(
        default=10, description="ETL: files failed by merges in 5 min (seed GlueJob-Failures: > 10)."
    )
    gpu_restarts_hour_max: int = Field(default=5, description="GPU: job restarts in the last hour.")
    video_failed_hour_max: int = Field(default=0, description="Video: jobs failed in the last hour.")
    records_archived_hour_max: int = Field(default=10, description="Records: messages dead-lettered in the last hour.")
    dlq_messages_max: int = Field(
        default=0, description="AWS: messages in a landing dead-letter queue (seed DLQ-Messages)."
    )
    disk_warning_percent: float = Field(
        default=85, description="All: WARNING when a disk the stack writes to is more than this share full."
    )
    disk_critical_percent: float = Field(
        default=95,
        description="All: CRITICAL when a disk the stack writes to is more than this share full (bytes or inodes): "
        "writes there are about to meet ENOSPC, and then wait for space.",
    )
    disk_paths: str = Field(
        default="",
        description="All: more folders whose disk to watch, as 'label=path' separated by commas (the object "
        "store, the landing places and the stack's data folder are always watched).",
    )
    notify_lease_seconds: float = Field(
        default=300, description="A notification claimed but not confirmed (its sender died) is sent again after this."
    )
    notify_retry_seconds: float = Field(
        default=300, description="A notification the block failed to deliver (webhook down) is sent again after this."
    )
    notify_block: str | None = Field(
        default=None,
        description="Notification block as 'block-type-slug/name' (unset: PIPELINES_NOTIFY_BLOCK, else the log).",
    )
