"""Sample GPU job for the demo: a 2-node job of real subprocesses on the local backend's nodes."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

DEPLOYMENT = "gpu-job/local"  # the demo starts it (seed 002 has no data arrival)
TRAIN = """\
import os, sys, time
print(f"node {os.environ['NODE_NAME']} index {os.environ['NODE_INDEX']} of {os.environ['GPU_JOB_NUM_NODES']}, "
      f"job {os.environ['GPU_JOB_ID']} retry {os.environ['GPU_JOB_RETRY']}")
time.sleep(1)
if "--fail-first-attempt" in sys.argv and os.environ["NODE_INDEX"] == "0" and os.environ["GPU_JOB_RETRY"] == "0":
    sys.exit("injected failure: rank 0 dies on the first attempt")  # exit 1, like a GPU fault
"""


def make(workdir: Path, inject_failure: bool = True) -> dict:
    """A tiny 'training' script; the gpu-job parameters that run it on 2 nodes (rank 0 failing once)."""
    script = Path(workdir) / "gpu" / "train.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(TRAIN)
    return {
        "command": f"{shlex.quote(sys.executable)} {shlex.quote(str(script.resolve()))}"
        + (" --fail-first-attempt" if inject_failure else ""),
        "num_nodes": 2,
        "job_id": f"demo-gpu-{time.strftime('%Y%m%d-%H%M%S')}",
        # the failed node's health check says "unhealthy": it is rebooted and the job restarts on a spare node
        "health_check": "command",
        "health_command": f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(1)'",
    }


def report(job_id: str | None = None, **_: object) -> str:
    """The job, its tasks and the nodes, read back by key (job row -> task ids -> task rows)."""
    from tasks.gpu import jobs as gpu

    job = gpu.get_job(job_id) if job_id else (gpu.list_jobs() or [None])[-1]
    if job is None:
        return "gpu: no job"
    lines = [
        f"gpu job {job['job_id']}: {job['job_status']} retry {job['retry']} on {job['assigned_nodes']}"
        + (f" ({job['failure_reason']})" if job.get("failure_reason") else "")
    ]
    lines += [
        f"  task {t['ecs_task_id']}: {t['task_status']} node {t['node_name']} exit {t.get('exit_code')}"
        for t in gpu.job_tasks(job)
    ]
    lines += [
        f"  node {n['node_name']}: {n['node_status']} health {n.get('health_status', '-')}" for n in gpu.list_nodes()
    ]
    return "\n".join(lines)
