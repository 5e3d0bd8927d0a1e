"""Seed 002, GPU jobs, as the shared machinery sees it (``tasks.core.registry``)."""

from __future__ import annotations

from tasks.core.registry import Pipeline, Table
from tasks.core.tables import TableSpec

PIPELINE = Pipeline(
    name="gpu",
    seed=2,
    tables={
        "ecs_task": Table(TableSpec("ecs_task_id", ttl_attribute="ttl"), "ecs_task"),
        "ecs_job": Table(TableSpec("job_id", ttl_attribute="ttl"), "ecs_job"),
        "ecs_node": Table(TableSpec("node_name"), "ecs_node"),
    },
    flows=("gpu-job", "gpu-healthcheck"),
    maintenance_flows=("gpu-sweep", "gpu-node-healthcheck"),
    health_checks="tasks.gpu.alarms:CHECKS",
    service_checks="tasks.gpu.alarms:SERVICE_CHECKS",
    severities={"gpu-stuck-jobs": "WARNING", "gpu-nodes-out-of-service": "WARNING", "gpu-restarts-per-hour": "WARNING"},
    retention_rules="tasks.gpu.retention:RULES",
    reconcile_adapters="tasks.gpu.reconcile:ADAPTERS",
    dashboard="tasks.gpu.alarms:figures",
    aws="tasks.gpu.aws:PARTS",
)
