"""Seed 002, issue 13: task stops are handled by whoever sees them first (watcher, gpu-sweep, gpu stop, the
reconciler), a job outlives its flow process, rebooted nodes come back by themselves, no GPU is no fault, and
job commands never see the worker's secrets. Real processes, DynamoDB Local, a real Prefect server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from flows.gpu import PLAIN, advance, watch
from tasks.gpu import jobs as gpu
from tests.helpers.crashpoints import REPO_ROOT, child_env
from tests.helpers.gpu import EXIT0, FAIL_FIRST, FAIL_ONE_HANG_OTHERS, HANG, alive, running_job, statuses
from tests.helpers.prefect_runs import task_run_state, wait_for

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

PY = sys.executable
SLEEP = f"{PY} -c 'import time; time.sleep(3)'"
NODES = ["local-0", "local-1", "local-2"]


@pytest.mark.sweep  # slow for make test; CI runs it in make test-sweep
def test_killed_flow_process_job_completes_through_the_sweep(gpu_env):
    from flows.gpu import gpu_sweep

    child = subprocess.Popen(
        [
            PY,
            str(REPO_ROOT / "tests" / "helpers" / "crashpoints.py"),
            "flows.gpu:gpu_job",
            json.dumps({"command": SLEEP, "num_nodes": 2, "job_id": "job-orphan"}),
        ],
        env=child_env({"PIPELINES_USE_BLOCKS": "0"}),
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        job = wait_for(lambda: running_job("job-orphan"), 90, "the job's tasks to run")
    finally:
        child.send_signal(signal.SIGKILL)  # the watcher dies with its flow process; no hook runs
        child.wait(timeout=10)
    killed_at = time.monotonic()
    pids = [t["pid"] for t in gpu.job_tasks(job)]
    assert all(alive(p) for p in pids)  # the tasks outlive the flow process
    assert gpu.get_job("job-orphan")["job_status"] == "IN_PROGRESS"
    sweeps = 0
    while gpu.get_job("job-orphan")["job_status"] != "COMPLETE":  # gpu-sweep, as its schedule would run it
        assert time.monotonic() - killed_at < 60, gpu.get_job("job-orphan")
        gpu_sweep()
        sweeps += 1
        time.sleep(0.5)
    print(
        f"\nkilled watcher -> job COMPLETE through gpu-sweep in {time.monotonic() - killed_at:.1f} s "
        f"({sweeps} sweeps; tasks ran 3 s; scheduled every 60 s, so at most task time + 60 s)"
    )
    job = gpu.get_job("job-orphan")
    assert statuses("task", job["submitted_ecs_task_ids"]) == {
        "job-orphan-r0-n0": "COMPLETE",
        "job-orphan-r0-n1": "COMPLETE",
    }
    assert [gpu.get_task(t)["exit_code"] for t in job["submitted_ecs_task_ids"]] == ["0", "0"]
    assert statuses("node", NODES) == dict.fromkeys(NODES, "AVAILABLE")


def test_reconcile_during_a_running_job_leaves_its_tasks_alone(gpu_env):
    from flows.gpu import gpu_job
    from flows.records import records_reconcile
    from tasks import reconcile

    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault(
            "summary",
            gpu_job(command=f"{PY} -c 'import time; time.sleep(5)'", num_nodes=2, job_id="job-live", timeout_s=60),
        )
    )
    thread.start()
    job = wait_for(lambda: running_job("job-live"), 60, "the job's tasks to run")
    tasks = gpu.job_tasks(job)
    # the short Prefect task that started each process has Completed: what made the reconciler terminate them
    wait_for(lambda: all(task_run_state(t["prefect_task_run_id"]) == "COMPLETED" for t in tasks), 30, "start task runs")
    assert reconcile.disagreements(["gpu"]) == []
    assert [f for f in records_reconcile(dry_run=False) if f["pipeline"] == "gpu"] == []
    assert statuses("task", job["submitted_ecs_task_ids"]) == {
        "job-live-r0-n0": "IN_PROGRESS",
        "job-live-r0-n1": "IN_PROGRESS",
    }
    assert all(alive(t["pid"]) for t in tasks)
    thread.join(timeout=60)
    assert result["summary"]["job_status"] == "COMPLETE"
    assert statuses("task", job["submitted_ecs_task_ids"]) == {
        "job-live-r0-n0": "COMPLETE",
        "job-live-r0-n1": "COMPLETE",
    }


def test_a_rebooted_node_is_available_within_reboot_time_plus_one_poll(gpu_env):
    gpu_env.backend.inject_health_command("local-0", "false")
    assert gpu.sweep_nodes(gpu_env)["local-0"] == "unhealthy: health command exited 1"
    rebooted = time.monotonic()
    assert gpu.get_node("local-0")["node_status"] == "REBOOTING"
    # a job claiming every node right after the reboot: the claim asks the backend whether local-0 is back
    time.sleep(gpu_env.config.local_reboot_s + gpu_env.config.poll_interval_s - (time.monotonic() - rebooted))
    job = gpu.launch_job(gpu_env, "job-all-nodes", 3, EXIT0, wait=False)
    assert job["assigned_nodes"] == NODES and gpu.get_node("local-0")["rebooted_at"]
    assert watch(gpu_env, "job-all-nodes", PLAIN, timeout_s=30)["job_status"] == "COMPLETE"
    # and with no job at all, the sweep brings a rebooted node back
    gpu_env.backend.inject_health_command("local-1", "false")
    gpu.sweep_nodes(gpu_env)
    assert gpu.get_node("local-1")["node_status"] == "REBOOTING"
    assert gpu.free_stranded_nodes(gpu_env) == {}  # still rebooting
    time.sleep(gpu_env.config.local_reboot_s + gpu_env.config.poll_interval_s)
    assert gpu.free_stranded_nodes(gpu_env) == {"local-1": "back: AVAILABLE"}
    assert statuses("node", NODES) == dict.fromkeys(NODES, "AVAILABLE")


def test_an_application_failure_without_a_gpu_leaves_the_nodes_in_service(gpu_env, monkeypatch):
    monkeypatch.setenv("GPU_HEALTH_CHECK", "nvml")  # the default check: "unknown" on a machine without a GPU
    runner = gpu.make_runner()
    gpu.launch_job(runner, "job-nogpu", 2, FAIL_ONE_HANG_OTHERS)
    job = watch(runner, "job-nogpu", PLAIN, timeout_s=30)
    assert job["job_status"] == "FAILED" and job["retry"] == "0"
    assert job["failure_reason"].startswith(
        "application failure: task job-nogpu-r0-n0 exited with code 1; node(s) healthy"
    )
    assert statuses("node", NODES) == dict.fromkeys(NODES, "AVAILABLE")
    assert gpu.get_node("local-0")["health_status"] in ("unknown", "healthy")  # healthy where a GPU is present
    # the conservative rule stays where nodes have GPUs
    from types import SimpleNamespace

    assert gpu.Runner(SimpleNamespace(name="ecs"), runner.config).unknown_is_unhealthy is True
    assert runner.unknown_is_unhealthy is False
    forced = runner.config.model_copy(update={"unknown_is_unhealthy": True})
    assert gpu.Runner(runner.backend, forced).unknown_is_unhealthy is True


def test_watcher_and_sweep_on_one_failure_restart_once(gpu_env):
    gpu_env.backend.inject_health_command("local-0", "false")
    gpu.launch_job(gpu_env, "job-race", 2, FAIL_FIRST)
    wait_for(lambda: gpu_env.backend.poll("job-race-r0-n0"), 10, "task 0 to fail")
    sweep = gpu.make_runner()  # another runner, as the gpu-sweep flow run is
    barrier = threading.Barrier(2)
    outcome: dict[str, object] = {}

    def watcher():
        barrier.wait()
        outcome["watcher"] = watch(gpu_env, "job-race", PLAIN, timeout_s=30)["job_status"]

    def sweeper():
        barrier.wait()
        while (job := advance(sweep, "job-race", PLAIN, wait=False))["job_status"] not in gpu.JOB_TERMINAL:
            time.sleep(0.05)
        outcome["sweep"] = job["job_status"]

    threads = [threading.Thread(target=f) for f in (watcher, sweeper)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert outcome == {"watcher": "COMPLETE", "sweep": "COMPLETE"}
    restarts = [e for e in gpu_env.events + sweep.events if e.get("action") == "restarted"]
    assert len(restarts) == 1, gpu_env.events + sweep.events
    job = gpu.get_job("job-race")
    assert job["retry"] == "1" and job["submitted_ecs_task_ids"] == ["job-race-r1-n0", "job-race-r1-n1"]
    assert gpu.get_task("job-race-r2-n0") is None
    assert gpu.get_node("local-0")["node_status"] in ("REBOOTING", "AVAILABLE")


def test_job_commands_see_their_own_variables_not_the_workers_secrets(gpu_env, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-secret")
    monkeypatch.setenv("PREFECT_API_KEY", "pnu_worker")
    show = f"{PY} -c 'import json, os; print(json.dumps(dict(os.environ), sort_keys=True))'"
    gpu.launch_job(gpu_env, "job-env", 1, show, env={"EPOCHS": "3", "DATA_URL": "s3://bucket/data"})
    assert watch(gpu_env, "job-env", PLAIN, timeout_s=30)["job_status"] == "COMPLETE"
    seen = json.loads((tmp_path / "slots" / "logs" / "job-env-r0-n0.log").read_text())
    assert "AWS_SECRET_ACCESS_KEY" not in seen and "PREFECT_API_KEY" not in seen and "AWS_ACCESS_KEY_ID" not in seen
    assert seen["PATH"] == os.environ["PATH"] and seen["EPOCHS"] == "3" and seen["DATA_URL"] == "s3://bucket/data"
    assert {k: seen[k] for k in ("NODE_NAME", "NODE_INDEX", "GPU_JOB_ID", "GPU_JOB_RETRY", "GPU_JOB_NUM_NODES")} == {
        "NODE_NAME": "local-0",
        "NODE_INDEX": "0",
        "GPU_JOB_ID": "job-env",
        "GPU_JOB_RETRY": "0",
        "GPU_JOB_NUM_NODES": "1",
    }
    # odd input: a bad variable name is a FAILED job with the reason, no node taken
    with pytest.raises(ValueError, match=r"invalid environment variable name\(s\) \['1BAD', 'A B'\]"):
        gpu.launch_job(gpu_env, "job-bad-env", 1, EXIT0, env={"1BAD": "x", "A B": "y", "OK": "z"})
    assert gpu.get_job("job-bad-env")["failure_reason"].startswith("invalid environment variable name(s)")
    with pytest.raises(ValueError, match=r"\['NESTED'\] must have text values"):
        gpu.launch_job(gpu_env, "job-bad-value", 1, EXIT0, env={"NESTED": {"a": 1}})
    assert statuses("node", NODES) == dict.fromkeys(NODES, "AVAILABLE")


def test_gpu_stop_ends_a_job_whose_watcher_is_gone(gpu_env, capsys):
    from deployments.cli import main

    job = gpu.launch_job(gpu_env, "job-nowatch", 2, HANG)  # nobody watches this job
    pids = [t["pid"] for t in gpu.job_tasks(job)]
    assert main(["gpu", "stop", "job-nowatch"]) == 0
    assert json.loads(capsys.readouterr().out)["job_status"] == "USER_STOPPED"
    assert statuses("task", job["submitted_ecs_task_ids"]) == {
        "job-nowatch-r0-n0": "TERMINATED",
        "job-nowatch-r0-n1": "TERMINATED",
    }
    wait_for(lambda: not any(alive(p) for p in pids), 10, "the stopped tasks to end")
    assert statuses("node", NODES) == dict.fromkeys(NODES, "AVAILABLE")
