"""GPU test helpers: three local node slots (``gpu_env``), job commands that pass, fail or hang, and what the
records say about nodes, tasks and jobs."""

from __future__ import annotations

import os
import sys

import pytest

from tasks.gpu import jobs as gpu

PY = sys.executable
EXIT0 = f"{PY} -c 'import sys; sys.exit(0)'"
HANG = f"{PY} -c 'import time; time.sleep(600)'"
# node 0 of the first attempt exits 1; every other task exits 0
FAIL_FIRST = (
    f'{PY} -c "import os, sys; '
    "sys.exit(1 if os.environ['GPU_JOB_RETRY'] == '0' and os.environ['NODE_INDEX'] == '0' else 0)\""
)
# node 0 exits 1 at once; the others hang until stopped
FAIL_ONE_HANG_OTHERS = (
    f"{PY} -c \"import os, sys, time; os.environ['NODE_INDEX'] == '0' and sys.exit(1); time.sleep(600)\""
)


@pytest.fixture
def gpu_env(tables, tmp_path, monkeypatch):
    """Three local node slots registered, fast polling, a health command that passes by default."""
    for name, value in {
        "GPU_LOCAL_STATE_DIR": str(tmp_path / "slots"),
        "GPU_LOCAL_NODES": "3",
        "GPU_POLL_INTERVAL_S": "0.1",
        "GPU_LOCAL_REBOOT_S": "0.5",
        "GPU_HEALTH_CHECK": "command",
        "GPU_HEALTH_COMMAND": "true",
        "GPU_NODE_WAIT_TIMEOUT_S": "10",
    }.items():
        monkeypatch.setenv(name, value)
    runner = gpu.make_runner()
    assert gpu.register_nodes(runner.backend, runner.config.cluster_name) == {
        "local-0": "registered",
        "local-1": "registered",
        "local-2": "registered",
    }
    return runner


def statuses(kind: str, ids) -> dict[str, str]:
    """The node or task status of each of ``ids`` (``kind``: node or task)."""
    getter, attr = {"node": (gpu.get_node, "node_status"), "task": (gpu.get_task, "task_status")}[kind]
    return {i: getter(i)[attr] for i in ids}


def alive(pid: str) -> bool:
    """Whether a process with this pid exists."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    return True


def running_job(job_id: str):
    """The job row once its tasks are all started and recorded, else None."""
    job = gpu.get_job(job_id)
    return job if job and job["job_status"] == "IN_PROGRESS" and job["submitted_ecs_task_ids"] else None
