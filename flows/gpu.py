"""Seed 002: GPU jobs with failure detection, node health checks and restarts.

    run ─────────────▶ assign AVAILABLE nodes, start one task per node                     (launch_job)
    detect failure ──▶ all exit 0: tasks COMPLETE, job COMPLETE, nodes AVAILABLE            (detect_failure)
                       a task exits ≠ 0: job PENDING_HEALTHCHECK, the other tasks stopped   (isolate_failure)
    health check ────▶ gpu-healthcheck (subflow) per failed node                            (health_check_nodes)
        healthy ─────▶ job FAILED (application), nodes AVAILABLE
    reboot ──────────▶ unhealthy node FAILED ─▶ REBOOTING; job PENDING_RESTART              (reboot_unhealthy)
        retry ≥ max ─▶ job FAILED + notification
    restart ─────────▶ a spare or the rebooted node; RESTARTING (retry+1) ─▶ IN_PROGRESS   (restart_job)
    user stop ───────▶ tasks TERMINATED, job USER_STOPPED, nodes AVAILABLE                 (gpu stop, cancel)

Whoever sees a task stop first moves the job on through the same guarded transitions: the job's own watcher
(``gpu-job``), ``gpu-sweep`` (every in-flight job, even one whose flow run is gone, and nodes nobody will move any
more), ``gpu stop`` and ``records-reconcile``. ``advance`` is one pass of the steps above over one job; both flows
run it. ``gpu-node-healthcheck`` (scheduled) checks idle nodes.

A sweep runs when it has work (issue 52: a run costs ~30 Prefect API calls): a gpu-job run that ends Crashed,
Cancelled, Failed or TimedOut triggers one (prefect.yaml), and a sweep that leaves a job in flight with no live
watcher schedules the next (``FOLLOW_UP_S``) until none is left; its schedule every 10 minutes is the backstop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.states import Cancelled

from blocks import load_config
from blocks.gpu import GpuCompute
from flows.policies import pipeline_flow
from tasks import reconcile
from tasks.core.runtime import artifact_key, own_deployment, prefect_ids, start_deployment_run, utc_now
from tasks.gpu import jobs as gpu
from tasks.gpu import keys
from tasks.gpu.backends import make_backend
from tasks.gpu.health import HealthResult

DEFAULT_COMMAND = "python3 -c \"import os; print('hello from', os.environ['NODE_NAME'])\""

start_gpu_task = task(gpu.start_one_task, name="start-gpu-task", cache_policy=NO_CACHE)
register_nodes_task = task(gpu.register_nodes, name="register-nodes", cache_policy=NO_CACHE)


@dataclass(frozen=True)
class Steps:
    """The seed's steps after "run", each a function of tasks/gpu/jobs.py (records and guarded transitions)."""

    detect_failure: Callable[..., Any]
    isolate_failure: Callable[..., Any]
    health_check: Callable[..., Any]
    reboot: Callable[..., Any]
    restart: Callable[..., Any]
    resume_start: Callable[..., Any]


# plain functions: tests and benchmarks drive a job without Prefect runs
PLAIN = Steps(
    gpu.detect_failure,
    gpu.isolate_failure,
    gpu.health_check_nodes,
    gpu.reboot_unhealthy,
    gpu.restart_job,
    gpu.resume_start,
)
# in the flows: every step that changes the job is a Prefect task run (polling for stops stays plain: it runs
# every poll interval); the health check of each node is the gpu-healthcheck subflow (see _flow_runner)
TASKS = Steps(
    gpu.detect_failure,
    task(gpu.isolate_failure, name="stop-other-tasks", cache_policy=NO_CACHE),
    gpu.health_check_nodes,
    task(gpu.reboot_unhealthy, name="reboot-unhealthy-nodes", cache_policy=NO_CACHE),
    task(gpu.restart_job, name="restart-job", cache_policy=NO_CACHE),
    task(gpu.resume_start, name="start-tasks", cache_policy=NO_CACHE),
)


def advance(runner: gpu.Runner, job_id: str, steps: Steps = TASKS, wait: bool = True) -> dict[str, Any] | None:
    """One pass over one job in the seed's order: detect failure → health check → reboot → restart.

    A step between two statuses is resumed only by its owner, or by whoever takes over from an owner that is
    gone (``take_over``); ``wait``: a restart waits for nodes (the job's watcher) or tries once (the sweep). A job
    row that is not as its launch sealed it is FAILED first (``gpu.seal_holds``): a row is data, not an order.
    """
    job = gpu.get_job(job_id)
    if job is None or job["job_status"] in gpu.JOB_TERMINAL:
        return job
    if not gpu.seal_holds(runner, job):  # a row its launch did not write as it is now: FAILED, nothing resumed
        return gpu.get_job(job_id)
    if gpu.needs_owner(job):
        job = gpu.take_over(runner, job)
    else:
        job = steps.detect_failure(runner, job)  # detect failure
    if job is None:
        return gpu.get_job(job_id)
    if job["job_status"] == gpu.JOB_PENDING_HEALTHCHECK:
        failed_nodes = steps.isolate_failure(runner, job)
        verdicts = steps.health_check(runner, job, failed_nodes)  # health check
        if not steps.reboot(runner, job, verdicts):  # reboot (none unhealthy: an application failure)
            return gpu.get_job(job_id)
        job = gpu.get_job(job_id)
    if job["job_status"] == gpu.JOB_PENDING_RESTART:
        runner.events.append(steps.restart(runner, job, wait))  # restart
    elif gpu.needs_owner(job):  # RESTARTING, or IN_PROGRESS whose tasks were not all started
        runner.events.append(steps.resume_start(runner, job))
    return gpu.get_job(job_id)


def watch(runner: gpu.Runner, job_id: str, steps: Steps = TASKS, timeout_s: float | None = None) -> dict[str, Any]:
    """The job's own watcher: ``advance`` every poll interval until the job ends (``gpu-sweep`` does the same once
    its run ended, so a watcher that stops early loses nothing)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        job = advance(runner, job_id, steps)
        if job["job_status"] in gpu.JOB_TERMINAL:
            return job
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {job['job_status']} after {timeout_s} s (gpu-sweep carries on)")
        time.sleep(runner.config.poll_interval_s)


def sweep(runner: gpu.Runner, steps: Steps = TASKS) -> dict[str, Any]:
    """One sweep: ``advance`` every in-flight job once (a restart tries once, no waiting), then put back the
    nodes nobody will move any more and stop tasks recorded TERMINATED that still run."""
    jobs = {}
    for job in gpu.list_jobs(gpu.JOB_ACTIVE):
        jobs[job["job_id"]] = advance(runner, job["job_id"], steps, wait=False)["job_status"]
    return {"jobs": jobs, "nodes": gpu.free_stranded_nodes(runner), "stopped_tasks": gpu.stop_terminated_tasks(runner)}


def unwatched(runner: gpu.Runner, job_ids: list[str]) -> list[str]:
    """The jobs of ``job_ids`` still in flight whose driver (the flow run that launched the job or last took over
    its step) ended, is unknown, or is this run: no loop of theirs will see their tasks stop."""
    me = prefect_ids().get("prefect_flow_run_id")
    left = []
    for job_id in job_ids:
        job = gpu.get_job(job_id)
        if job is None or job["job_status"] in gpu.JOB_TERMINAL:
            continue
        driver = job.get("prefect_flow_run_id")
        if not driver or driver == me or (runner.run_ended is not None and runner.run_ended(str(driver))):
            left.append(job_id)
    return left


# a job with no watcher is swept again this soon (30-90 s: on the half minute, so two sweeps' follow-ups are one run
# and none is due with the backstop schedule's, on the minute)
FOLLOW_UP_S = 60.0


def follow_up(jobs: list[str]) -> str | None:
    """A run of this sweep's own deployment on the half minute about ``FOLLOW_UP_S`` from now, when ``jobs`` (in
    flight, unwatched) is not empty; one per deployment and half minute (its idempotency key). Its id, or None."""
    deployment = own_deployment()
    if not jobs or deployment is None:
        return None
    at = (utc_now() + timedelta(seconds=FOLLOW_UP_S)).replace(second=30, microsecond=0)
    return start_deployment_run(deployment, {}, f"gpu-sweep-{deployment}-{at.isoformat()}", at=at)


def run_ended(flow_run_id: str) -> bool:
    """Whether Prefect says the flow run ended (Completed, Failed, Crashed, Cancelled)."""
    state = reconcile.prefect_states([flow_run_id], []).get(flow_run_id)
    return state is not None and state.type in reconcile.TERMINAL


def _config(**overrides: Any) -> GpuCompute:
    """The GpuCompute block (or defaults and env) with the flow's non-None parameters on top."""
    config = load_config(GpuCompute)
    return config.model_copy(update={k: v for k, v in overrides.items() if v is not None})


def _health_artifact(node_name: str, result: HealthResult) -> None:
    rows = [f"| {k} | {v} |" for k, v in sorted(result.readings.items()) if k != "devices"]
    devices = result.readings.get("devices") or []
    for device in devices:
        rows.append(
            f"| GPU {device.get('index')} | {', '.join(f'{k}={v}' for k, v in device.items() if k != 'index')} |"
        )
    create_markdown_artifact(
        key=artifact_key("gpu-health", node_name),
        markdown=(
            f"## Health check of {node_name}: **{result.status}** ({result.method})\n\n{result.reason}\n\n"
            f"checked at {result.checked_at}, {result.duration_s} s\n\n| reading | value |\n|---|---|\n"
            + "\n".join(rows)
        ),
        description=f"{node_name}: {result.status}",
    )


@pipeline_flow("gpu-healthcheck", alert=None)  # a subflow: the flow that calls it alerts
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
        """The node's health, checked by the gpu-healthcheck subflow."""
        return HealthResult(**gpu_healthcheck(node_name, config.health_check, config.health_command))

    return gpu.Runner(make_backend(config), config, health_check=check, run_ended=run_ended)


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
        key=artifact_key("gpu-job", job["job_id"]),
        table=[
            {
                k: t.get(k)
                for k in (
                    "ecs_task_id",
                    "node_name",
                    "node_index_in_job",
                    "retry",
                    "task_status",
                    "exit_code",
                    "stop_reason",
                )
            }
            for t in tasks
        ],
        description=f"job {job['job_id']}: {job['job_status']} (retry {job['retry']}) {job.get('failure_reason', '')}",
    )


# a failed run has already sent its own, more detailed alert
@pipeline_flow("gpu-job", alert="crashed", on_cancellation=[_stop_on_cancel])
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
    env: dict[str, str] | None = None,
):
    """Run ``command`` on ``num_nodes`` nodes (one task each, with ``env`` and the node's variables) and see
    it through failures and restarts."""
    config = _config(
        max_retries=max_retries,
        node_wait=node_wait,
        node_wait_timeout_s=node_wait_timeout_s,
        poll_interval_s=poll_interval_s,
        health_check=health_check,
        health_command=health_command,
    )
    runner = _flow_runner(config)
    job_id = keys.gpu_job_id(job_id) if job_id else _job_id()
    gpu.launch_job(
        runner,
        job_id,
        num_nodes,
        command,
        nodes,
        config.node_wait == "wait",
        config.node_wait_timeout_s,
        start_task=start_gpu_task,
        env=env,
    )  # run
    job = watch(runner, job_id, TASKS, timeout_s)  # detect failure → health check → reboot → restart, until it ends
    _job_artifact(job)
    summary = {k: job.get(k) for k in ("job_id", "job_status", "retry", "assigned_nodes", "failure_reason")}
    if job["job_status"] == gpu.JOB_FAILED:
        raise RuntimeError(f"GPU job {job_id} FAILED: {job.get('failure_reason')}")
    if job["job_status"] == gpu.JOB_USER_STOPPED:
        return Cancelled(message=f"GPU job {job_id} USER_STOPPED", data=summary)
    return summary


@pipeline_flow("gpu-sweep")
def gpu_sweep() -> dict[str, Any]:
    """Ask the backend about every in-flight job's tasks and move each job on (also one whose flow run is gone);
    resume steps whose owner is gone; put back nodes nobody will move any more. Started when a gpu-job run ended
    (prefect.yaml's trigger), by the sweep before it while a job has no watcher (``follow_up``), and every 10
    minutes (the backstop)."""
    runner = _flow_runner(_config())
    result = sweep(runner, TASKS)
    jobs, nodes, stopped = result["jobs"], result["nodes"], result["stopped_tasks"]
    result["unwatched"] = unwatched(runner, sorted(jobs))
    result["follow_up"] = follow_up(result["unwatched"])
    create_table_artifact(
        key="gpu-sweep",
        table=[{"record": f"job {j}", "now": s} for j, s in sorted(jobs.items())]
        + [{"record": f"node {n}", "now": o} for n, o in sorted(nodes.items())]
        + [{"record": f"task {t}", "now": "stopped (its record said TERMINATED)"} for t in stopped]
        or [{"record": "-", "now": "nothing in flight"}],
        description=f"{len(jobs)} job(s) in flight, {len(nodes)} node(s) put back, {len(stopped)} task(s) stopped",
    )
    return result


@pipeline_flow("gpu-node-healthcheck")
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
