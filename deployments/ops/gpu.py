"""`pipelines gpu …`: register nodes, look at nodes/jobs/tasks, stop a job (seed 002)."""

from __future__ import annotations

import json

from deployments.ops import key_argument
from tasks.gpu import jobs as gpu
from tasks.gpu import keys


def register_local_nodes(count: int | None = None) -> dict[str, str]:
    """Register the configured backend's nodes (local: ``local-0``..``local-{n-1}``) as AVAILABLE (`make up`)."""
    from blocks import load_config
    from blocks.gpu import GpuCompute

    config = load_config(GpuCompute)
    if count is not None:
        config = config.model_copy(update={"local_nodes": count})
    runner = gpu.make_runner(config)
    return gpu.register_nodes(runner.backend, config.cluster_name)


def local_setup() -> dict[str, dict[str, str]]:
    """What `make up` prints for this pipeline (``deployments.local_stack.register_extras``): the nodes registered."""
    return {"gpu nodes": register_local_nodes()}


def _register_nodes(args) -> dict:
    return register_local_nodes(args.nodes)


def _nodes(args) -> list[dict]:
    rows = gpu.list_nodes(args.cluster, args.status)
    for row in rows:
        if "last_health_check" in row:
            row["last_health_check"] = json.loads(row["last_health_check"])
    return rows


def _jobs(args) -> list[dict]:
    return gpu.list_jobs(args.status)


def _job(args) -> dict:
    job = gpu.get_job(keys.gpu_job_id(args.job_id))
    if job is None:
        raise LookupError(f"no job {args.job_id}")
    return job


def _tasks(args) -> list[dict]:
    job = _job(args)
    return gpu.job_tasks(job)


def _stop(args) -> dict:
    job = gpu.stop_job(gpu.make_runner(), args.job_id)
    return {"job_id": job["job_id"], "job_status": job["job_status"], "stop_requested": True}


def register(subparsers) -> None:
    """Add the ``gpu`` subcommands: register-nodes, nodes, jobs, job, tasks, stop."""
    group = subparsers.add_parser("gpu", help="GPU jobs, tasks and nodes (seed 002)")
    commands = group.add_subparsers(dest="command", required=True)

    p = commands.add_parser("register-nodes", help="register the backend's nodes as AVAILABLE (local: local-0..)")
    p.add_argument(
        "--nodes", type=int, default=None, help="local backend: how many slots (default: block's local_nodes)"
    )
    p.set_defaults(handler=_register_nodes)

    p = commands.add_parser("nodes", help="list nodes")
    p.add_argument("--cluster", default=None)
    p.add_argument("--status", default=None)
    p.set_defaults(handler=_nodes)

    p = commands.add_parser("jobs", help="list jobs")
    p.add_argument("--status", default=None)
    p.set_defaults(handler=_jobs)

    p = commands.add_parser("job", help="one job's row")
    key_argument(p, "job_id", "--job-id")
    p.set_defaults(handler=_job)

    p = commands.add_parser("tasks", help="the tasks of a job's current attempt")
    key_argument(p, "job_id", "--job")
    p.set_defaults(handler=_tasks)

    p = commands.add_parser(
        "stop",
        help=(
            "user stop: tasks TERMINATED and stopped, job USER_STOPPED, nodes AVAILABLE "
            "(now, with or without a watcher)"
        ),
    )
    key_argument(p, "job_id", "--job-id")
    p.set_defaults(handler=_stop)
