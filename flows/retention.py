"""pipelines-retention: what the seeds' AWS services expired for them (DynamoDB TTL, S3 lifecycle), on a schedule.

finished records (phspectra runs, video jobs, GPU jobs, cleared incidents) ──▶ ttl stamped (guarded) ──▶ DynamoDB
expires them
ETL merge staging older than the merge timeout, replayed-and-failed dead letters (opt-in) ──▶ deleted
"""

from __future__ import annotations

from typing import Any

from prefect import task

from flows.policies import pipeline_flow, retry_policy
from tasks.retention.sweep import apply_retention

# it walks every table and the store: a busy one gets a minute
retention_task = task(apply_retention, name="apply-retention", **retry_policy(10, 60))


@pipeline_flow("pipelines-retention")
def pipelines_retention(record_days: float = 30, dead_letter_days: float | None = None) -> dict[str, Any]:
    """Stamp finished records for expiry after ``record_days``; age out dead staging (and old failed dead letters)."""
    report = retention_task(record_days, dead_letter_days)
    print(
        f"retention: ttl stamped {report['stamped']}, taken off live records {report['unstamped']}, "
        f"objects deleted {report['deleted_objects']}"
    )
    return report
