"""Seed 002: GPU jobs on the local backend with real subprocesses, real DynamoDB Local and real Prefect."""

from __future__ import annotations

import json
import threading
import time

import pytest

from flows.gpu import PLAIN, advance, watch
from tasks.core import keys
from tasks.core.errors import RefusedInput
from tasks.gpu import jobs as gpu
from tasks.gpu.backends import BackendError, CommandRefused
from tests.helpers.gpu import EXIT0, FAIL_FIRST, FAIL_ONE_HANG_OTHERS, HANG, alive, statuses

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


def test_all_tasks_exit_0_job_complete(gpu_env):
    from flows.gpu import gpu_job

    summary = gpu_job(command=EXIT0, num_nodes=2, job_id="job-ok")
    assert summary == {
        "job_id": "job-ok",
        "job_status": "COMPLETE",
        "retry": "0",
        "assigned_nodes": ["local-0", "local-1"],
        "failure_reason": None,
    }
    job = gpu.get_job("job-ok")
    assert job["num_nodes"] == "2" and job["submitted_ecs_task_ids"] == ["job-ok-r0-n0", "job-ok-r0-n1"]
    assert job["submitted_container_inst_ids"] == ["local-0", "local-1"] and job["prefect_flow_run_id"]
    tasks = gpu.job_tasks(job)
    assert [
        (t["task_status"], t["exit_code"], t["node_index_in_job"], t["job_num_nodes"], t["retry"]) for t in tasks
    ] == [("COMPLETE", "0", "0", "2", "0"), ("COMPLETE", "0", "1", "2", "0")]
    assert all(t["prefect_task_run_id"] and t["prefect_flow_run_id"] == job["prefect_flow_run_id"] for t in tasks)
    assert statuses("node", ["local-0", "local-1", "local-2"]) == dict.fromkeys(
        ["local-0", "local-1", "local-2"], "AVAILABLE"
    )
    assert "job_id" not in gpu.get_node("local-0")


def test_failure_on_a_healthy_node_is_an_application_failure(gpu_env):
    from flows.gpu import gpu_job

    state = gpu_job(command=FAIL_ONE_HANG_OTHERS, num_nodes=2, job_id="job-app", return_state=True)
    assert state.is_failed() and "application failure" in state.message
    job = gpu.get_job("job-app")
    assert job["job_status"] == "FAILED" and job["retry"] == "0"
    assert job["failure_reason"].startswith(
        "application failure: task job-app-r0-n0 exited with code 1; node(s) healthy"
    )
    assert statuses("task", job["submitted_ecs_task_ids"]) == {
        "job-app-r0-n0": "TERMINATED",
        "job-app-r0-n1": "TERMINATED",
    }
    other = gpu.get_task("job-app-r0-n1")
    assert other["stop_reason"] == "stopped: task job-app-r0-n0 of the job failed" and not alive(other["pid"])
    assert statuses("node", ["local-0", "local-1"]) == {"local-0": "AVAILABLE", "local-1": "AVAILABLE"}
    node = gpu.get_node("local-0")
    assert node["health_status"] == "healthy" and json.loads(node["last_health_check"])["method"] == "command"


def test_unhealthy_node_restarts_on_a_spare_node(gpu_env):
    from flows.gpu import gpu_job

    gpu_env.backend.inject_health_command("local-0", "false")
    summary = gpu_job(command=FAIL_FIRST, num_nodes=2, job_id="job-spare")
    assert summary["job_status"] == "COMPLETE" and summary["retry"] == "1"
    assert summary["assigned_nodes"] == ["local-2", "local-1"]  # the spare took node 0's place
    job = gpu.get_job("job-spare")
    assert statuses("task", job["submitted_ecs_task_ids"]) == {
        "job-spare-r1-n0": "COMPLETE",
        "job-spare-r1-n1": "COMPLETE",
    }
    assert (
        gpu.get_task("job-spare-r0-n0")["task_status"] == "TERMINATED"
        and gpu.get_task("job-spare-r0-n0")["exit_code"] == "1"
    )
    # node 1's first task exits 0 at once: seen in the same poll it is COMPLETE, else stopped with the job
    assert gpu.get_task("job-spare-r0-n1")["task_status"] in ("COMPLETE", "TERMINATED")
    bad = gpu.get_node("local-0")
    assert bad["node_status"] == "REBOOTING" and bad["health_status"] == "unhealthy"
    assert json.loads(bad["last_health_check"])["readings"]["exit_code"] == 1
    assert statuses("node", ["local-1", "local-2"]) == {"local-1": "AVAILABLE", "local-2": "AVAILABLE"}
    artifact = latest_artifact("gpu-health-local-0")
    assert artifact.description == "local-0: unhealthy" and "**unhealthy** (command)" in artifact.data


def latest_artifact(key: str):
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    async def read():
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                sort=ArtifactSort.CREATED_DESC,
                limit=1,
            )
            return found[0]

    return asyncio.run(read())


def test_unhealthy_node_restart_waits_for_the_rebooted_node(gpu_env):
    from flows.gpu import gpu_job

    gpu_env.backend.inject_health_command("local-0", "false")
    summary = gpu_job(command=FAIL_FIRST, num_nodes=3, job_id="job-reboot")  # no spare node
    assert summary["job_status"] == "COMPLETE" and summary["retry"] == "1"
    assert summary["assigned_nodes"] == ["local-0", "local-1", "local-2"]  # node 0 again, after its reboot
    node = gpu.get_node("local-0")
    assert node["node_status"] == "AVAILABLE" and node["health_status"] == "unhealthy" and node["rebooted_at"]


def test_retries_exhausted_fail_the_job_and_notify(gpu_env):
    messages: list[str] = []
    gpu_env.config = gpu_env.config.model_copy(update={"max_retries": 0})
    gpu_env.notify = messages.append
    gpu_env.backend.inject_health_command("local-0", "false")
    gpu.launch_job(gpu_env, "job-spent", 2, FAIL_FIRST)
    job = watch(gpu_env, "job-spent", PLAIN, timeout_s=30)
    assert job["job_status"] == "FAILED" and job["retry"] == "0"
    assert job["failure_reason"].startswith(
        "retries exhausted (retry 0 of max 0); unhealthy node(s) {'local-0': 'unhealthy"
    )
    assert messages == [f"GPU job job-spent FAILED: {job['failure_reason']}"]
    assert statuses("node", ["local-0", "local-1"]) == {"local-0": "REBOOTING", "local-1": "AVAILABLE"}


def test_the_same_failure_event_ten_times_restarts_once(gpu_env):
    gpu_env.backend.inject_health_command("local-0", "false")
    gpu.launch_job(gpu_env, "job-dup", 2, FAIL_FIRST)
    while gpu_env.backend.poll("job-dup-r0-n0") is None:
        time.sleep(0.05)
    barrier = threading.Barrier(10)
    actions: list[str] = []

    def deliver():
        barrier.wait()
        actions.append(gpu.handle_task_stopped("job-dup-r0-n0", 1, "exited with code 1", gpu_env)["action"])

    threads = [threading.Thread(target=deliver) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(actions) == ["duplicate"] * 9 + ["recovery_started"]
    assert gpu.get_job("job-dup")["job_status"] == "PENDING_HEALTHCHECK"
    advance(gpu_env, "job-dup", PLAIN)  # the handler's next steps: health check, reboot, restart
    job = gpu.get_job("job-dup")
    assert job["retry"] == "1" and job["submitted_ecs_task_ids"] == ["job-dup-r1-n0", "job-dup-r1-n1"]
    assert watch(gpu_env, "job-dup", PLAIN, timeout_s=30)["job_status"] == "COMPLETE"
    # late events: neither the old failure nor a repeated success moves the finished job
    assert gpu.handle_task_stopped("job-dup-r0-n0", 1, "late", gpu_env)["action"] == "duplicate"
    assert gpu.handle_task_stopped("job-dup-r1-n1", 1, "late", gpu_env)["action"] == "duplicate"
    assert gpu.get_job("job-dup")["job_status"] == "COMPLETE" and gpu.get_job("job-dup")["retry"] == "1"
    assert gpu.handle_task_stopped("no-such-task", 1, "?", gpu_env)["action"] == "unknown_task"


def test_two_jobs_racing_for_the_last_node_one_gets_it(gpu_env):
    assert gpu.assign_nodes("holder", 2, "local") == ["local-0", "local-1"]
    for round_ in range(5):
        barrier = threading.Barrier(2)
        won: dict[str, object] = {}

        def race(job_id, barrier=barrier, won=won):
            barrier.wait()
            try:
                won[job_id] = gpu.assign_nodes(job_id, 1, "local")
            except gpu.NotEnoughNodes as error:
                won[job_id] = str(error)

        threads = [threading.Thread(target=race, args=(f"r{round_}-{j}",)) for j in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [j for j, v in won.items() if v == ["local-2"]]
        assert len(winners) == 1, won
        loser = next(j for j in won if j not in winners)
        assert won[loser] == "job needs 1 nodes, 0 AVAILABLE in cluster 'local' (node_wait='fail')"
        assert gpu.get_node("local-2")["job_id"] == winners[0]
        assert gpu.release_nodes(winners[0], ["local-2"]) == ["local-2"]


def test_not_enough_nodes_fail_or_wait(gpu_env):
    with pytest.raises(gpu.NotEnoughNodes, match="cluster 'local' has only 3"):
        gpu.launch_job(gpu_env, "job-big", 5, EXIT0)
    assert gpu.get_job("job-big")["job_status"] == "FAILED"
    assert gpu.get_job("job-big")["failure_reason"] == "job needs 5 nodes but cluster 'local' has only 3"
    gpu.assign_nodes("holder", 2, "local")
    with pytest.raises(gpu.NotEnoughNodes, match="after waiting 0.5 s"):
        gpu.launch_job(gpu_env, "job-wait-timeout", 2, EXIT0, wait=True, timeout_s=0.5)
    assert statuses("node", ["local-0", "local-1", "local-2"]) == {
        "local-0": "ASSIGNED",
        "local-1": "ASSIGNED",
        "local-2": "AVAILABLE",
    }
    threading.Timer(0.5, gpu.release_nodes, args=("holder", ["local-1"])).start()
    job = gpu.launch_job(gpu_env, "job-waited", 2, EXIT0, wait=True, timeout_s=10)
    assert job["job_status"] == "IN_PROGRESS" and sorted(job["assigned_nodes"]) == ["local-1", "local-2"]
    assert watch(gpu_env, "job-waited", PLAIN, timeout_s=30)["job_status"] == "COMPLETE"


def test_bad_input_gets_a_clear_reason_and_consistent_rows(gpu_env):
    with pytest.raises(LookupError, match=r"unknown node\(s\) \['local-9'\]"):
        gpu.launch_job(gpu_env, "job-unknown", 1, EXIT0, nodes=["local-9"])
    assert gpu.get_job("job-unknown")["job_status"] == "FAILED"
    with pytest.raises(BackendError, match="command cannot start on local-0: .*No such file"):
        gpu.launch_job(gpu_env, "job-nocmd", 2, "/nonexistent/bin/train --epochs 1")
    job = gpu.get_job("job-nocmd")
    assert job["job_status"] == "FAILED" and job["failure_reason"].startswith("task cannot start: command cannot start")
    assert statuses("node", ["local-0", "local-1"]) == {"local-0": "AVAILABLE", "local-1": "AVAILABLE"}
    with pytest.raises(keys.InvalidKey):
        gpu.launch_job(gpu_env, "../etc", 1, EXIT0)
    with pytest.raises(ValueError, match="exists already"):
        gpu.launch_job(gpu_env, "job-nocmd", 1, EXIT0)


def test_a_command_that_cannot_parse_is_refused_before_any_node_is_held_or_waited_for(gpu_env):
    gpu.assign_nodes("holder", 3, "local")  # every node busy: a wait would last the whole timeout
    started = time.monotonic()
    with pytest.raises(CommandRefused, match="command cannot be parsed: No closing quotation") as refused:
        gpu.launch_job(gpu_env, "job-open-quote", 1, "python3 -c 'print(1)", wait=True, timeout_s=30)
    assert isinstance(refused.value, RefusedInput) and time.monotonic() - started < 5
    job = gpu.get_job("job-open-quote")
    assert job["job_status"] == "FAILED" and job["assigned_nodes"] == []
    assert job["failure_reason"] == "command cannot be parsed: No closing quotation"
    assert statuses("node", ["local-0", "local-1", "local-2"]) == dict.fromkeys(
        ["local-0", "local-1", "local-2"], "ASSIGNED"
    )
    assert gpu.release_nodes("holder", ["local-0", "local-1", "local-2"]) == ["local-0", "local-1", "local-2"]
    with pytest.raises(CommandRefused, match="command is empty"):
        gpu.launch_job(gpu_env, "job-empty", 1, "   ")
    job = gpu.get_job("job-empty")
    assert job["job_status"] == "FAILED" and job["failure_reason"].startswith("task cannot start: command is empty")
    assert statuses("node", ["local-0"]) == {"local-0": "AVAILABLE"}


def test_user_stop_from_the_cli_ends_a_hanging_job(gpu_env):
    from deployments.cli import main
    from flows.gpu import gpu_job

    result = {}
    flow_thread = threading.Thread(
        target=lambda: result.setdefault(
            "state", gpu_job(command=HANG, num_nodes=2, job_id="job-stop", return_state=True)
        )
    )
    flow_thread.start()
    deadline = time.monotonic() + 60
    while not ((job := gpu.get_job("job-stop")) and job["submitted_ecs_task_ids"]):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    pids = [t["pid"] for t in gpu.job_tasks(job)]
    assert all(alive(p) for p in pids)
    assert main(["gpu", "stop", "job-stop"]) == 0
    flow_thread.join(timeout=60)
    assert result["state"].is_cancelled()
    job = gpu.get_job("job-stop")
    assert job["job_status"] == "USER_STOPPED" and job["stop_requested"] == "true"
    assert statuses("task", job["submitted_ecs_task_ids"]) == {
        "job-stop-r0-n0": "TERMINATED",
        "job-stop-r0-n1": "TERMINATED",
    }
    assert not any(alive(p) for p in pids)
    assert statuses("node", ["local-0", "local-1"]) == {"local-0": "AVAILABLE", "local-1": "AVAILABLE"}
    assert main(["gpu", "stop", "job-stop"]) == 2  # nothing to stop any more


def test_flow_cancellation_hook_stops_the_job(gpu_env):
    from types import SimpleNamespace

    from flows.gpu import _stop_on_cancel

    gpu.launch_job(gpu_env, "job-cancel", 2, HANG)
    pids = [t["pid"] for t in gpu.job_tasks(gpu.get_job("job-cancel"))]
    # the hook runs in another process in production: it finds the tasks by their pid files
    _stop_on_cancel(None, SimpleNamespace(parameters={"job_id": "job-cancel"}, id="run"), None)
    job = gpu.get_job("job-cancel")
    assert (job["job_status"], job["stop_reason"]) == ("USER_STOPPED", "flow run cancelled")
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids):  # the SIGKILLed orphan is reaped by nobody: check it is a zombie or gone
        zombie = [p for p in pids if alive(p) and open(f"/proc/{p}/stat").read().split()[2] == "Z"]
        if len(zombie) == len([p for p in pids if alive(p)]):
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert statuses("node", ["local-0", "local-1"]) == {"local-0": "AVAILABLE", "local-1": "AVAILABLE"}


def test_scheduled_node_check_takes_bad_nodes_out_and_back(gpu_env):
    from flows.gpu import gpu_node_healthcheck

    gpu_env.backend.inject_health_command("local-1", "false")
    outcome = gpu_node_healthcheck(health_check="command", health_command="true")
    assert outcome == {
        "local-0": "healthy: health command exited 0",
        "local-1": "unhealthy: health command exited 1",
        "local-2": "healthy: health command exited 0",
    }
    assert statuses("node", ["local-0", "local-1"]) == {"local-0": "AVAILABLE", "local-1": "REBOOTING"}
    time.sleep(0.6)
    assert gpu_node_healthcheck()["local-1"] == "back: AVAILABLE"
    assert gpu.get_node("local-1")["node_status"] == "AVAILABLE"


def test_cli_and_sample_read_back_the_rows(gpu_env, tmp_path, capsys):
    from deployments.cli import main
    from deployments.samples import gpu as sample

    params = sample.make(tmp_path, inject_failure=False)
    gpu.launch_job(gpu_env, "job-cli", params["num_nodes"], params["command"])
    assert watch(gpu_env, "job-cli", PLAIN, timeout_s=30)["job_status"] == "COMPLETE"
    capsys.readouterr()
    assert main(["gpu", "job", "job-cli"]) == 0
    assert json.loads(capsys.readouterr().out)["job_status"] == "COMPLETE"
    assert main(["gpu", "tasks", "--job", "job-cli"]) == 0
    assert [t["task_status"] for t in json.loads(capsys.readouterr().out)] == ["COMPLETE", "COMPLETE"]
    assert main(["gpu", "register-nodes", "--nodes", "4"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "local-0": "exists (AVAILABLE)",
        "local-1": "exists (AVAILABLE)",
        "local-2": "exists (AVAILABLE)",
        "local-3": "registered",
    }
    assert main(["gpu", "nodes", "--status", "AVAILABLE"]) == 0
    assert [n["node_name"] for n in json.loads(capsys.readouterr().out)] == ["local-0", "local-1", "local-2", "local-3"]
    assert main(["gpu", "job", "nope"]) == 2 and "no job nope" in capsys.readouterr().err
    report = sample.report("job-cli")
    assert report.splitlines()[:3] == [
        "gpu job job-cli: COMPLETE retry 0 on ['local-0', 'local-1']",
        "  task job-cli-r0-n0: COMPLETE node local-0 exit 0",
        "  task job-cli-r0-n1: COMPLETE node local-1 exit 0",
    ]
    log = (tmp_path / "slots" / "logs" / "job-cli-r0-n1.log").read_text()
    assert log == "node local-1 index 1 of 2, job job-cli retry 0\n"
