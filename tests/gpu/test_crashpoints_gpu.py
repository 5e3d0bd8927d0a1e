"""GPU crash points (seed 002): a small 2-node job dies at each chosen write; the product's own machinery ends it.

The child runs the ``gpu-job`` flow on a job whose node-0 task fails on the first attempt on an unhealthy node,
so every step writes: run, detect failure, health check, reboot, restart, completion. After the child is
SIGKILLed at write N (before or after it lands), only what the product runs is run: what a process worker does
(``report_crashed_runs``), ``records-reconcile``, ``gpu-node-healthcheck`` and ``gpu-sweep`` (scheduled). Then
docs/design.md's GPU invariants must hold: the job COMPLETE / FAILED / USER_STOPPED (or never created), every node
AVAILABLE, no task left IN_PROGRESS, no live task marked TERMINATED, and ``records-reconcile`` finds nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tasks.core import state_store
from tasks.gpu import jobs as gpu
from tests.helpers.crashpoints import REPO_ROOT, Write, child_env, crash_points, report, report_crashed_runs
from tests.helpers.gpu import FAIL_FIRST
from tests.helpers.prefect_runs import wait_for

pytestmark = pytest.mark.crashpoints  # `make test-sweep` takes every write; by hand 3 sampled points

CALL = "flows.gpu:gpu_job"
NODES = ["local-0", "local-1", "local-2"]


# Each child is forked from one process that imported the flow once (about 4 s of imports per child saved):
# the fork arms the crash-point injector as PIPELINES_FAULT would, runs the flow, and dies at write N.
FORK_SERVER = r"""
import importlib, json, os, sys, traceback
sys.path.insert(0, os.getcwd())
importlib.import_module("flows.gpu")
from tasks.core import faults
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        faults.arm(faults.Plan.parse(request["fault"], request["log"]))
        try:
            module, function = request["call"].split(":")
            getattr(importlib.import_module(module), function)(**request["kwargs"])
            code = 0
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": status}), flush=True)
"""


class Children:
    """A fork server for crash-point children (same environment as ``tests.helpers.crashpoints.run_child``)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", FORK_SERVER],
            env=child_env(env),
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, call: str, kwargs: dict, fault: str, log: Path | None = None) -> int:
        """Run ``call(**kwargs)`` in a forked child with the fault plan; its wait status."""
        self.process.stdin.write(
            json.dumps({"call": call, "kwargs": kwargs, "fault": fault, "log": str(log) if log else None}) + "\n"
        )
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())["status"]

    def count(self, call: str, kwargs: dict, log: Path) -> list[Write]:
        """``tests.helpers.crashpoints.count_writes`` through the fork server."""
        log.unlink(missing_ok=True)
        assert self.run(call, kwargs, "count", log) == 0, "counting run failed"
        rows = [line.split("\t") for line in log.read_text().splitlines()]
        return [Write(int(n), store, operation, target) for n, store, operation, target in rows]

    def close(self) -> None:
        """Stop the fork server."""
        self.process.stdin.close()
        self.process.wait(timeout=30)


def _killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _kwargs(job_id: str) -> dict:
    return {"command": FAIL_FIRST, "num_nodes": 2, "job_id": job_id, "nodes": ["local-0", "local-1"], "timeout_s": 60}


def _tasks_of(job_id: str) -> list[dict]:
    return list(state_store.scan_all(gpu._tables()[0], keep=lambda t: t.get("job_id") == job_id))


def _settled(job_id: str) -> bool:
    job = gpu.get_job(job_id)
    nodes = {n["node_name"]: n["node_status"] for n in gpu.list_nodes()}
    return (job is None or job["job_status"] in gpu.JOB_TERMINAL) and set(nodes.values()) == {"AVAILABLE"}


def _recover(runner, job_id: str) -> None:
    """Only what the product runs after a crash, in the order its schedules would: what a process worker does,
    then the bodies of records-reconcile, gpu-node-healthcheck and gpu-sweep (the flows run once at the end)."""
    from flows.gpu import PLAIN, sweep
    from tasks import reconcile

    report_crashed_runs()
    reconcile.reconcile(["gpu"], dry_run=False)
    gpu.sweep_nodes(runner)
    deadline = time.monotonic() + 45
    while not _settled(job_id):
        assert time.monotonic() < deadline, (gpu.get_job(job_id), gpu.list_nodes())
        sweep(runner, PLAIN)
        if not _settled(job_id):
            time.sleep(runner.config.local_reboot_s)


def _check_invariants(runner, job_id: str) -> str:
    from tasks import reconcile

    job = gpu.get_job(job_id)
    outcome = "never created" if job is None else job["job_status"]
    assert outcome in ("never created", *gpu.JOB_TERMINAL), job
    assert {n["node_name"]: n["node_status"] for n in gpu.list_nodes()} == dict.fromkeys(NODES, "AVAILABLE")
    for task in _tasks_of(job_id):
        assert task["task_status"] in ("COMPLETE", "TERMINATED"), task
        if task["task_status"] == "TERMINATED":
            assert runner.backend.poll(task["ecs_task_id"]) is not None, f"live task marked TERMINATED: {task}"
    if job is not None and job["job_status"] == "COMPLETE":
        assert [t["task_status"] for t in gpu.job_tasks(job)] == ["COMPLETE", "COMPLETE"]
    assert reconcile.disagreements() == []
    return outcome


def _each_point(runner, children: Children, points: list[int], name: str, prepare, call: str, kwargs) -> Counter[str]:
    """For each point (before / after the write, alternately): ``prepare(job_id)``, run ``call`` in a child that
    dies at that write, let the product recover, check the invariants; the jobs' outcomes, plus ``not killed``:
    the points a run ended before reaching (a job's write count varies with when its tasks' stops are seen)."""
    outcomes: Counter[str] = Counter()
    for i, point in enumerate(points):
        when = "after" if i % 2 else "before"
        job_id = f"{name}-{point}-{when}"
        runner.backend.inject_health_command("local-0", "false")
        prepare(job_id)
        status = children.run(call, kwargs(job_id), f"{point}:kill:{when}")
        assert _killed(status) or status == 0, status
        if not _killed(status):
            outcomes["not killed"] += 1
        _recover(runner, job_id)
        outcomes[_check_invariants(runner, job_id)] += 1
    # the run's own count is the plan: all but the last few points must really have killed the child
    assert outcomes["not killed"] <= max(2, len(points) // 10), outcomes
    return outcomes


def _exercised(points: list[int], writes: list[Write], outcomes: Counter[str]) -> str:
    kinds = Counter(w.kind.split("-")[0] for w in writes if w.number in points)
    return f"{len(points) - outcomes['not killed']} of {len(writes)} writes exercised ({dict(kinds)})"


@pytest.mark.timeout(900)
def test_gpu_job_crash_points(gpu_env, tmp_path, monkeypatch):
    from flows.gpu import run_ended

    monkeypatch.setenv("PIPELINES_USE_BLOCKS", "0")
    gpu_env.run_ended = run_ended  # as the flows' runner: a Crashed flow run's steps are taken over
    gpu_env.backend.inject_health_command("local-0", "false")
    children = Children({"PIPELINES_USE_BLOCKS": "0"})
    writes = children.count(CALL, _kwargs("job-count"), tmp_path / "writes.log")
    assert gpu.get_job("job-count")["job_status"] == "COMPLETE" and gpu.get_job("job-count")["retry"] == "1"
    _recover(gpu_env, "job-count")  # local-0 was rebooted: back before the sweep starts
    points = crash_points(writes)
    outcomes = _each_point(gpu_env, children, points, "job-cp", lambda job_id: None, CALL, _kwargs)
    children.close()
    # the scheduled flows themselves find nothing left to do
    from flows.gpu import gpu_sweep
    from flows.records import records_reconcile

    assert gpu_sweep()["jobs"] == {} and records_reconcile(pipelines=["gpu"], dry_run=False) == []
    report(f"gpu-job: {_exercised(points, writes, outcomes)}; outcomes {dict(outcomes)}")


# the sweep's own writes (take over, resume the recovery, restart, put nodes back) are crash points too; each point
# needs a job abandoned mid-recovery first (about 15 s a point), so this runs with the full sweep only
# (marker `sweep`: `make test-sweep`, which CI runs)


def _abandon_in_recovery(runner, job_id: str) -> None:
    """A job left PENDING_HEALTHCHECK by an owner that died right after that write: what a crash of the job's
    flow there leaves (made in-process: the write numbers of a job vary with when its tasks' stops are seen)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    gpu.launch_job(runner, job_id, 2, FAIL_FIRST, nodes=["local-0", "local-1"])
    wait_for(lambda: runner.backend.poll(f"{job_id}-r0-n0"), 10, "task 0 to fail")
    ghost = gpu.Runner(runner.backend, runner.config)  # another owner, whose process is gone
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpu.os, "getpid", lambda: dead.pid)
        assert gpu.detect_failure(ghost, gpu.get_job(job_id))["job_status"] == "PENDING_HEALTHCHECK"


@pytest.mark.timeout(900)
@pytest.mark.sweep
def test_gpu_sweep_crash_points(gpu_env, tmp_path, monkeypatch):
    from flows.gpu import run_ended

    monkeypatch.setenv("PIPELINES_USE_BLOCKS", "0")
    gpu_env.run_ended = run_ended
    children = Children({"PIPELINES_USE_BLOCKS": "0"})
    gpu_env.backend.inject_health_command("local-0", "false")
    _abandon_in_recovery(gpu_env, "job-sweep-count")
    writes = children.count("flows.gpu:gpu_sweep", {}, tmp_path / "sweep.log")
    _recover(gpu_env, "job-sweep-count")
    points = crash_points(writes)
    outcomes = _each_point(
        gpu_env,
        children,
        points,
        "job-sweep",
        lambda job_id: _abandon_in_recovery(gpu_env, job_id),
        "flows.gpu:gpu_sweep",
        lambda job_id: {},
    )
    children.close()
    report(f"gpu-sweep: {_exercised(points, writes, outcomes)}; outcomes {dict(outcomes)}")
