"""What ``pipeline-health`` reads of the GPU pipeline: stuck jobs, nodes out of service, restarts, and its
dashboard figures."""

from __future__ import annotations

from blocks.health import HealthThresholds
from tasks.core import state_store
from tasks.core.config import table_name
from tasks.core.runtime import iso_ago
from tasks.gpu import jobs as gpu
from tasks.health.checks import Alarm, count_alarm, last_change
from tasks.health.dashboard import Figures, Outcomes, Window, ended_since

HOUR_S = 3600


def gpu_stuck_jobs(limits: HealthThresholds) -> Alarm:
    """GPU: jobs IN_PROGRESS without an update for ``gpu_job_running_minutes``, or in a recovery status too long."""
    running, recovering = iso_ago(limits.gpu_job_running_minutes * 60), iso_ago(limits.gpu_job_stuck_minutes * 60)
    stuck = []
    for job in gpu.list_jobs():
        status = job.get("job_status")
        if status not in gpu.JOB_ACTIVE:
            continue
        cutoff = running if status == gpu.JOB_IN_PROGRESS else recovering
        if last_change(job, ("created_at", "updated_at")) < cutoff:
            stuck.append(f"{job['job_id']} ({status})")
    return count_alarm("gpu-stuck-jobs", "gpu", stuck, 0, "job(s) stuck in a non-terminal status")


NODE_OUT = (gpu.NODE_FAILED, gpu.NODE_REBOOTING, gpu.NODE_UNKNOWN)


def gpu_nodes_out(limits: HealthThresholds) -> Alarm:
    """GPU: nodes FAILED / REBOOTING / UNKNOWN for longer than ``gpu_node_out_minutes``."""
    cutoff = iso_ago(limits.gpu_node_out_minutes * 60)
    out = [
        f"{node['node_name']} ({node['node_status']})"
        for node in gpu.list_nodes()
        if node.get("node_status") in NODE_OUT
        and last_change(node, ("created_at", "updated_at", "rebooted_at")) < cutoff
    ]
    return count_alarm(
        "gpu-nodes-out-of-service", "gpu", out, 0, f"node(s) out of service > {limits.gpu_node_out_minutes:g} min"
    )


def gpu_restarts(limits_: HealthThresholds) -> Alarm:
    """Seed 002: GPU job restarts in the last hour (tasks started for a retry > 0)."""
    since = iso_ago(HOUR_S)
    tasks_table = table_name("ecs_task")
    restarts = {
        f"{item['job_id']} (retry {item['retry']})"
        for item in state_store.scan_all(tasks_table)
        if str(item.get("retry", "0")) != "0" and str(item.get("created_at", "")) >= since
    }
    return count_alarm(
        "gpu-restarts-per-hour", "gpu", restarts, limits_.gpu_restarts_hour_max, "GPU job restart(s) in the last hour"
    )


def figures(window: Window) -> Figures:
    """GPU jobs that ended in the window."""
    return Figures(
        Outcomes.of(
            "gpu",
            "jobs",
            gpu.list_jobs(),
            "job_status",
            gpu.JOB_COMPLETE,
            gpu.JOB_FAILED,
            ended_since(window, "updated_at", "created_at"),
        )
    )


CHECKS = {gpu_stuck_jobs: ("gpu-stuck-jobs",), gpu_nodes_out: ("gpu-nodes-out-of-service",)}
SERVICE_CHECKS = {gpu_restarts: ("gpu-restarts-per-hour",)}
