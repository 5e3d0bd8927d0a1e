"""Seed 002, GPU jobs, as the shared machinery sees it (``tasks.core.registry``)."""

from __future__ import annotations

from tasks.core.registry import Deployment, Pipeline, Table, run_trigger
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
    deployments=(
        Deployment(
            "flows/gpu.py:gpu_job",
            "Seed 002: run → detect failure → health check → restart, guarded transitions.",
            limit="fan_out_local",
            aws_limit="gpu_job_limit_aws",
            parameters={"num_nodes": 2},
        ),
        Deployment(
            "flows/gpu.py:gpu_healthcheck",
            "Health check one node (NVML, dcgmi or a configured command).",
            limit="fan_out_local",
            aws_limit="gpu_check_limit_aws",
        ),
        Deployment(
            "flows/gpu.py:gpu_sweep",
            "Move every in-flight GPU job on (even one whose flow run is gone): task stops, abandoned steps, stranded"
            " nodes. Started when a gpu-job run ends without its job (then each minute while a job has no watcher);"
            " the schedule is a backstop.",
            schedule="every_10_minutes",
            # a gpu-job run's own loop watches its job while it runs; once the run ended Crashed, Cancelled, Failed or
            # TimedOut (process killed, watcher timed out) nothing watches it: a sweep at once moves the job on
            triggers=(
                run_trigger(
                    [
                        "prefect.flow-run.Crashed",
                        "prefect.flow-run.Cancelled",
                        "prefect.flow-run.Failed",
                        "prefect.flow-run.TimedOut",
                    ],
                    {"prefect.resource.role": "flow", "prefect.resource.name": "gpu-job"},
                ),
            ),
            maintenance_service=True,
        ),
        Deployment(
            "flows/gpu.py:gpu_node_healthcheck",
            "Check idle nodes and take bad ones out of service.",
            schedule="every_10_minutes",
            maintenance_service=True,
        ),
    ),
    record_flows=("gpu-job", "gpu-sweep"),
)
