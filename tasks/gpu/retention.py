"""The GPU pipeline's retention: an ended job and its task records get the same ttl."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.core import state_store
from tasks.core.config import table_name
from tasks.gpu import jobs as gpu
from tasks.retention.sweep import Child, Rule


def _gpu_tasks(job: Mapping[str, Any], cache: dict[str, Any]) -> list[Child]:
    """The job's task records; the pass reads them all once (one Scan, not one per job)."""
    if "tasks_by_job" not in cache:
        by_job: dict[str, list[tuple[str, bool]]] = {}
        for task in state_store.scan_all(table_name("ecs_task")):
            by_job.setdefault(str(task.get("job_id")), []).append((task["ecs_task_id"], "ttl" in task))
        cache["tasks_by_job"] = by_job
    return [
        ("ecs_task", {"ecs_task_id": task_id}, has_ttl)
        for task_id, has_ttl in cache["tasks_by_job"].get(str(job["job_id"]), [])
    ]


RULES = (
    Rule("ecs_job", ("job_id",), "job_status", gpu.JOB_TERMINAL, ("updated_at", "created_at"), children=_gpu_tasks),
)
