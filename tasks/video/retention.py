"""The video pipeline's retention: an ended job, its segment completions and its reassembly lock get the same ttl."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from boto3.dynamodb.conditions import Key

from tasks.core import state_store
from tasks.core.config import table_name
from tasks.retention.sweep import Child, Rule
from tasks.video import jobs as video


def _video_items(job: Mapping[str, Any], cache: dict[str, Any]) -> list[Child]:
    done = state_store.query_all(
        table_name("video_segment_completions"), KeyConditionExpression=Key("job_id").eq(job["job_id"])
    )
    items = [
        ("video_segment_completions", {"job_id": c["job_id"], "segment_index": c["segment_index"]}, "ttl" in c)
        for c in done
    ]
    lock = state_store.get_item(table_name("video_reassembly_locks"), {"job_id": job["job_id"]})
    if lock:
        items.append(("video_reassembly_locks", {"job_id": job["job_id"]}, "ttl" in lock))
    return items


RULES = (
    Rule(
        "video_jobs",
        ("job_id",),
        "status",
        (video.COMPLETED, video.FAILED, video.DELETED),
        ("deleted_at", "completed_at", "failed_at", "created_at"),
        children=_video_items,
    ),
)
