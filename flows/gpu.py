"""Seed 002: GPU jobs with failure detection, node health checks and restarts.

    assign AVAILABLE nodes ─▶ start one task per node ─▶ watch
        all exit 0 ─────────▶ tasks COMPLETE, job COMPLETE, nodes AVAILABLE
        a task exits ≠ 0 ───▶ stop the others, job PENDING_HEALTHCHECK ─▶ gpu-healthcheck (subflow) per node
            healthy ────────▶ job FAILED (application), nodes AVAILABLE
            unhealthy ──────▶ node FAILED ─▶ REBOOTING; job PENDING_RESTART ─▶ RESTARTING (retry+1) ─▶ IN_PROGRESS
            retry ≥ max ────▶ job FAILED + notification
        user stop ──────────▶ tasks TERMINATED, job USER_STOPPED, nodes AVAILABLE

``gpu-node-healthcheck`` (scheduled) checks idle nodes and takes bad ones out of service.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.states import Cancelled

from blocks import load_config
from blocks.gpu import GpuCompute
from tasks import gpu, keys
from tasks.gpu_backends import make_backend
from tasks.gpu_health import HealthResult
from tasks.notify import notify_on_failure

DEFAULT_COMMAND = "python3 -c \"import os; print('hello from', os.environ['NODE_NAME'])\""

start_gpu_task = task(gpu.start_one_task, name="start-gpu-task", cache_policy=NO_CACHE)
handle_task_stopped_task = task(gpu.handle_task_stopped, name="handle-task-stopped", cache_policy=NO_CACHE)
register_nodes_task = task(gpu.register_nodes, name="register-nodes", cache_policy=NO_CACHE)


def _config(**overrides: Any) -> GpuCompute:
    """The GpuCompute block (or defaults and env) with the flow's non-None parameters on top."""
    config = load_config(GpuCompute)
    return config.model_copy(update={k: v for k, v in overrides.items() if v is not None})


def _health_artifact(node_name: str, result: HealthResult) -> None:
    rows = [f"| {k} | {v} |" for k, v in sorted(result.readings.items()) if k != "devices"]
    devices = result.readings.get("devices") or []
    for device in devices:
        rows.append(f"| GPU {device.get('index')} | {', '.join(f'{k}={v}' for k, v in device.items() if k != 'index')} |")
    create_markdown_artifact(
        key=f"gpu-health-{node_name.lower().replace('_', '-').replace('.', '-')}",
        markdown=(
            f"## Health check of {node_name}: **{result.status}** ({result.method})\n\n{result.reason}\n\n"
            f"checked at {result.checked_at}, {result.duration_s} s\n\n| reading | value |\n|---|---|\n" + "\n".join(rows)
        ),
        description=f"{node_name}: {result.status}",
    )


@flow(name="gpu-healthcheck", log_prints=True)
def gpu_healthcheck(
    node_name: str,
    health_check: Literal["nvml", "dcgmi", "command"] | None = None,
    health_command: str | None = None,
) -> dict[str, Any]:
    """Run the node's health check; store the result and readings on the node row; show them as an artifact."""
    config = _config(health_check=health_check, health_command=health_command)
    runner = gpu.Runner(make_backend(config), config)
    result = gpu.check_node(keys.gpu_node_name(node_name), runner)
    _health_artifact(node_name, result)
    return result.to_dict()


def _flow_runner(config: GpuCompute) -> gpu.Runner:
    """A Runner whose health checks run as the gpu-healthcheck subflow."""

    def check(node_name: str) -> HealthResult:
        return HealthResult(**gpu_healthcheck(node_name, config.health_check, config.health_command))

    return gpu.Runner(make_backend(config), config, health_check=check)


def _job_id() -> str:
    return keys.gpu_job_id_for_run(str(flow_run.id))


def _stop_on_cancel(flow_obj, run, state) -> None:
    """Cancellation hook: the job ends USER_STOPPED, its tasks stopped, its nodes AVAILABLE."""
    job_id = (run.parameters or {}).get("job_id") or keys.gpu_job_id_for_run(str(run.id))
    if gpu.get_job(job_id) is not None:
        gpu.user_stop(gpu.make_runner(), job_id, "flow run cancelled")


def _job_artifact(job: dict[str, Any]) -> None:
    tasks = gpu.job_tasks(job)
    create_table_artifact(
        key=f"gpu-job-{job['job_id'].lower().replace('_', '-').replace('.', '-')}"[:64],
        table=[
            {k: t.get(k) for k in ("ecs_task_id", "node_name", "node_index_in_job", "retry", "task_status", "exit_code", "stop_reason")}
            for t in tasks
        ],
        description=f"job {job['job_id']}: {job['job_status']} (retry {job['retry']}) {job.get('failure_reason', '')}",
    )


# on_crashed only: a failed run has already sent its own, more detailed alert
@flow(name="gpu-job", log_prints=True, on_cancellation=[_stop_on_cancel], on_crashed=[notify_on_failure])
def gpu_job(
    command: str = DEFAULT_COMMAND,
    num_nodes: int = 2,
    job_id: str | None = None,
    nodes: list[str] | None = None,
    max_retries: int | None = None,
    node_wait: Literal["wait", "fail"] | None = None,
    node_wait_timeout_s: float | None = None,
    poll_interval_s: float | None = None,
    health_check: Literal["nvml", "dcgmi", "command"] | None = None,
    health_command: str | None = None,
    timeout_s: float | None = None,
):
    """Run ``command`` on ``num_nodes`` nodes (one task each) and see it through failures and restarts."""
    config = _config(
        max_retries=max_retries, node_wait=node_wait, node_wait_timeout_s=node_wait_timeout_s,
        poll_interval_s=poll_interval_s, health_check=health_check, health_command=health_command,
    )
    runner = _flow_runner(config)
    job_id = keys.gpu_job_id(job_id) if job_id else _job_id()
    gpu.launch_job(runner, job_id, num_nodes, command, nodes, config.node_wait == "wait", config.node_wait_timeout_s,
                   start_task=start_gpu_task)

    def on_stopped(task_id: str, exit_code: int | None, reason: str) -> dict[str, Any]:
        return handle_task_stopped_task(task_id, exit_code, reason, runner)

    job = gpu.watch_job(runner, job_id, on_stopped, timeout_s)
    _job_artifact(job)
    summary = {k: job.get(k) for k in ("job_id", "job_status", "retry", "assigned_nodes", "failure_reason")}
    if job["job_status"] == gpu.JOB_FAILED:
        raise RuntimeError(f"GPU job {job_id} FAILED: {job.get('failure_reason')}")
    if job["job_status"] == gpu.JOB_USER_STOPPED:
        return Cancelled(message=f"GPU job {job_id} USER_STOPPED", data=summary)
    return summary


@flow(name="gpu-node-healthcheck", log_prints=True, on_failure=[notify_on_failure], on_crashed=[notify_on_failure])
def gpu_node_healthcheck(
    health_check: Literal["nvml", "dcgmi", "command"] | None = None,
    health_command: str | None = None,
    register_missing: bool = False,
) -> dict[str, str]:
    """Check every idle AVAILABLE node; take unhealthy ones out of service; bring rebooted ones back."""
    config = _config(health_check=health_check, health_command=health_command)
    runner = _flow_runner(config)
    if register_missing:
        register_nodes_task(runner.backend, config.cluster_name)
    outcome = gpu.sweep_nodes(runner)
    create_table_artifact(
        key="gpu-node-healthcheck",
        table=[{"node_name": n, "outcome": o} for n, o in sorted(outcome.items())],
        description=f"{len(outcome)} node(s) checked",
    )
    return outcome


if __name__ == "__main__":
    gpu_job()
