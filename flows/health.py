"""pipeline-health: seed 001's CloudWatch alarms, asked of all five pipelines on a schedule.

each pipeline's checks ─┐
(its pipeline.py)       ├─▶ alarms (thresholds block) ─▶ incidents (guarded writes) ─▶ one notification each
flow runs, listeners ───┘                                                       └─▶ table artifact
each pipeline's figures ─▶ dashboard (markdown artifact: last 24 h, charts, failure rates)
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.policies import HEAVY_RETRIES, pipeline_flow
from tasks.health.cloudwatch import publish_readings
from tasks.health.dashboard import dashboard
from tasks.health.run import check_health

check_task = task(check_health, name="check-health", **HEAVY_RETRIES)
dashboard_task = task(dashboard, name="dashboard", **HEAVY_RETRIES)
publish_task = task(publish_readings, name="publish-readings", **HEAVY_RETRIES)  # CloudWatch, in AWS


@pipeline_flow("pipeline-health")
def pipeline_health(notify_block: str | None = None) -> list[dict[str, Any]]:
    """Read every pipeline's records, raise or clear each alarm, notify new incidents once."""
    rows = check_task(notify_block)
    firing = [r for r in rows if r["state"] != "OK"]
    create_table_artifact(
        key="pipeline-health",
        table=rows,
        description=f"{len(firing)} of {len(rows)} alarm(s) firing"
        + (f": {', '.join(r['name'] for r in firing)}" if firing else ""),
    )
    markdown, _ = dashboard_task({r["name"]: r["value"] for r in rows})
    create_markdown_artifact(key="pipeline-dashboard", markdown=markdown, description="All pipelines, last 24 hours")
    publish_task(rows)  # the cloud dashboard's numbers are the artifact's
    for row in firing:
        get_run_logger().warning(
            "%s %s: %s (incident %s, notified %s)",
            row["state"],
            row["name"],
            row["detail"],
            row["incident"],
            row["notified"],
        )
    return rows
