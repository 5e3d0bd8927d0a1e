"""Seed 002 through the deployments, as a user runs them: `prefect deploy`, a process worker, `prefect deployment
run 'gpu-job/local'`; `prefect deployment run 'records-reconcile/local'` while the job's tasks run leaves them
alone; the job's flow process is SIGKILLed while its tasks run, the worker reports the run Crashed, and
`prefect deployment run 'gpu-sweep/local'` ends the job COMPLETE. The job's commands saw their own variables and
none of the worker's secrets. A job whose command fails (no train.py) on nodes without a GPU fails without
taking the nodes out of service.

About a minute (a worker and three flow-run processes): marker `sweep`, run by `make test-sweep` (and CI).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from tasks.gpu import jobs as gpu
from tests.helpers.crashpoints import REPO_ROOT, report
from tests.helpers.gpu import running_job, statuses
from tests.helpers.prefect_runs import prefect_cli, wait_for

pytestmark = pytest.mark.sweep  # slow (a worker and flow-run processes): `make test-sweep`, which CI runs
NODES = ["local-0", "local-1", "local-2"]


def _flow_run_state(flow_run_id: str) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state.type.value


@pytest.mark.timeout(600)
def test_gpu_job_deployment_survives_its_killed_flow_process(gpu_env, monkeypatch, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.settings import PREFECT_API_URL

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name="local-process", type="process"))
        except ObjectAlreadyExists:
            pass
    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PIPELINES_ROOT": str(REPO_ROOT),
        "PIPELINES_USE_BLOCKS": "0",
        "PYTHONPATH": str(REPO_ROOT),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "1",
        "GPU_HEALTH_CHECK": "nvml",
    }  # the default check: "unknown" here (no GPU), "healthy" on a GPU machine
    prefect_cli(
        "deploy", "--name", "gpu-job/local", "--name", "gpu-sweep/local", "--name", "records-reconcile/local", env=env
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", "local-process"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # the command records its environment, then runs long enough for a reconcile to see it live
        command = f"sh -c 'env > {tmp_path}/$NODE_NAME.env; sleep 30'"
        prefect_cli(
            "deployment",
            "run",
            "gpu-job/local",
            "--param",
            "job_id=job-deployed",
            "--param",
            "num_nodes=2",
            "--param",
            f"command={command}",
            "--param",
            'env={"EPOCHS": "3"}',
            env=env,
        )
        job = wait_for(lambda: running_job("job-deployed"), 120, "the deployed job's tasks to run")
        started_at = time.monotonic()
        tasks = job["submitted_ecs_task_ids"]
        prefect_cli("deployment", "run", "records-reconcile/local", "--param", 'pipelines=["gpu"]', "--watch", env=env)
        assert statuses("task", tasks) == dict.fromkeys(tasks, "IN_PROGRESS")  # live tasks are never TERMINATED
        assert gpu.get_job("job-deployed")["job_status"] == "IN_PROGRESS"
        os.kill(int(job["owner_pid"]), signal.SIGKILL)  # the flow-run process the worker started
        killed_at = time.monotonic()
        wait_for(lambda: _flow_run_state(job["prefect_flow_run_id"]) == "CRASHED", 60, "the worker to report Crashed")
        assert gpu.get_job("job-deployed")["job_status"] == "IN_PROGRESS"
        # nobody runs anything: the Crashed run triggers gpu-sweep (prefect.yaml), which schedules its next look while
        # the job has no watcher (a run by hand meanwhile is cancelled by the deployment's concurrency limit)
        wait_for(
            lambda: gpu.get_job("job-deployed")["job_status"] == "COMPLETE",
            240,
            "gpu-sweep, started by the Crashed run's trigger, to complete the job",
        )
        still_running = max(0.0, 30 - (killed_at - started_at))  # the tasks' own time left at the kill
        report(
            f"gpu-job/local deployment: killed gpu-job flow process -> job COMPLETE through the triggered gpu-sweep "
            f"in {time.monotonic() - killed_at:.1f} s, of which ~{still_running:.0f} s the tasks still ran"
        )
        # an application failure (no train.py) on nodes without a GPU: the job fails, the nodes stay in service
        prefect_cli(
            "deployment",
            "run",
            "gpu-job/local",
            "--param",
            "job_id=job-appfail",
            "--param",
            "num_nodes=2",
            "--param",
            f"command={sys.executable} train.py",
            env=env,
        )
        failed = wait_for(
            lambda: (gpu.get_job("job-appfail") or {}).get("job_status") == "FAILED" and gpu.get_job("job-appfail"),
            120,
            "the failing job to end",
        )
        assert failed["retry"] == "0" and failed["failure_reason"].startswith("application failure"), failed
        assert statuses("node", NODES) == dict.fromkeys(NODES, "AVAILABLE")
    finally:
        # SIGKILL, as prefect_runs.Worker.stop does: a SIGTERMed worker waits for its runs (seen > 30 s loaded)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    job = gpu.get_job("job-deployed")
    assert statuses("task", job["submitted_ecs_task_ids"]) == {
        "job-deployed-r0-n0": "COMPLETE",
        "job-deployed-r0-n1": "COMPLETE",
    }
    assert statuses("node", NODES) == dict.fromkeys(NODES, "AVAILABLE")
    for node in job["assigned_nodes"]:
        seen = dict(line.split("=", 1) for line in (tmp_path / f"{node}.env").read_text().splitlines() if "=" in line)
        assert seen["EPOCHS"] == "3" and seen["GPU_JOB_ID"] == "job-deployed", sorted(seen)
        assert not {"AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "PREFECT_API_URL"} & set(seen), sorted(seen)
