"""``pipeline-health`` as the shared machinery sees it: its incidents table, its schedule and their retention.

It is no pipeline of a seed; it declares itself like one so the tables, limits and retention it needs come from
the same registry.
"""

from __future__ import annotations

from tasks.core.registry import Deployment, Pipeline, Table
from tasks.core.tables import TableSpec

PIPELINE = Pipeline(
    name="health",
    seed=90,
    # one item per alarm, its incident OPEN or CLEARED (created once, then guarded moves)
    tables={"health_incidents": Table(TableSpec("alarm", ttl_attribute="ttl"), "pipeline-health-incidents-{env}")},
    maintenance_flows=("pipeline-health",),
    retention_rules="tasks.health.incidents:RETENTION_RULES",
    deployments=(
        Deployment(
            "flows/health.py:pipeline_health",
            "Alarms over all five pipelines (thresholds block); one notification per incident, table artifact.",
            schedule="every_5_minutes",
            maintenance_service=True,
        ),
    ),
)
