"""pipelines-retention: what the seeds' AWS services expired for them (DynamoDB TTL, S3 lifecycle), on a schedule.

    finished records (phspectra runs, video jobs, GPU jobs, cleared incidents) ──▶ ttl stamped (guarded) ──▶ DynamoDB expires them
    ETL merge staging older than the merge timeout, replayed-and-failed dead letters (opt-in) ──▶ deleted
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task

from tasks.core import limits
from tasks.core.notify import notify_on_failure
from tasks.core.runtime import quick_heartbeat_exit
from tasks.retention.sweep import apply_retention

quick_heartbeat_exit()  # in every flow module: a worker loads the file by path, not as a package

retention_task = task(apply_retention, name="apply-retention", retries=2, retry_delay_seconds=[10, 60])


@flow(name="pipelines-retention", log_prints=True, timeout_seconds=limits.flow_timeout("pipelines-retention"),
      on_failure=[notify_on_failure], on_crashed=[notify_on_failure])
def pipelines_retention(record_days: float = 30, dead_letter_days: float | None = None) -> dict[str, Any]:
    """Stamp finished records for expiry after ``record_days``; age out dead staging (and old failed dead letters)."""
    report = retention_task(record_days, dead_letter_days)
    print(f"retention: ttl stamped {report['stamped']}, taken off live records {report['unstamped']}, "
          f"objects deleted {report['deleted_objects']}")
    return report
