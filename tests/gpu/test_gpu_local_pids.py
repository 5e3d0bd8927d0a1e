"""Seed 002, local backend: a task's process is its pid *and* its start time, so a reused pid is not the task."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from blocks.gpu import GpuCompute
from tasks.gpu.backends import LocalBackend, TaskExit, TaskSpec, process_identity
from tests.helpers.prefect_runs import wait_for

PY = sys.executable


def test_a_task_whose_pid_now_belongs_to_another_process_is_gone(tmp_path):
    backend = LocalBackend(GpuCompute(local_state_dir=str(tmp_path)))
    ready = tmp_path / "ready"
    command = f'{PY} -c \'import time; open("{ready}", "w"); time.sleep(60)\''
    task_id = backend.start_task(TaskSpec("job-pid", 0, {"node_name": "local-0"}, 0, 1, command)).task_id
    wait_for(ready.exists, 30, "the command to start")  # the launcher runs the command: it records how a stop ends it
    record_file = tmp_path / "pids" / task_id
    record = json.loads(record_file.read_text())
    assert record["process"] == process_identity(record["pid"])
    assert backend.poll(task_id) is None and backend.running_on("local-0") == [task_id]  # its own process: running
    backend.stop(task_id, "test")
    assert backend.poll(task_id) == TaskExit(-15, "killed by signal SIGTERM")

    # the launcher died without recording its exit (SIGKILL), and the kernel gave its pid to an unrelated process
    (tmp_path / "exits" / task_id).unlink()
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        record_file.write_text(json.dumps({**record, "pid": stranger.pid}))
        assert backend.poll(task_id) == TaskExit(None, "task process was killed before it could record its exit code")
        assert backend.running_on("local-0") == []
        backend.stop(task_id, "test")  # never signals the stranger's process group
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
