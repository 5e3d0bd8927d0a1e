"""Issue 52: `gpu-sweep` runs when it has work, not every minute. A gpu-job run that ends Crashed (Cancelled, Failed,
TimedOut) starts a sweep through prefect.yaml's trigger; a sweep that leaves a job in flight with no live watcher
schedules the next one on the half minute; the schedule every 10 minutes is the backstop."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid

import pytest

from flows import gpu as gpu_flows
from tasks.gpu import jobs as gpu
from tests.helpers.gpu import running_job
from tests.helpers.prefect_runs import Worker, deploy_from_prefect_yaml, wait_for

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


def _runs(deployment: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        found = client.read_deployment_by_name(deployment)
        return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[found.id])))


def _gpu_job_run_ending(final) -> str:
    """A flow run of a flow named gpu-job (as the deployment's would be) that ran and ended in ``final``: its id."""
    from prefect import flow as prefect_flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(prefect_flow(name="gpu-job")(lambda: None))
        client.set_flow_run_state(run.id, Running(), force=True)
        client.set_flow_run_state(run.id, final, force=True)
    return str(run.id)


def test_a_crashed_gpu_job_run_starts_a_sweep_and_a_completed_one_none(tables, tmp_path):
    """prefect.yaml's gpu-sweep trigger, as `prefect deploy` makes it: a gpu-job run ending Completed starts nothing;
    one ending Crashed (its process killed: nothing watches its job any more) starts one sweep within seconds."""
    from prefect.states import Completed, Crashed

    name = f"gsweep-{uuid.uuid4().hex[:6]}"
    sweep = deploy_from_prefect_yaml(tmp_path, {"gpu-sweep"}, f"pool-{name}", name)["gpu-sweep"]
    _gpu_job_run_ending(Completed())
    time.sleep(5)  # what the trigger would have made by now
    assert _runs(sweep) == []
    _gpu_job_run_ending(Crashed(message="its process was killed"))
    (started,) = wait_for(lambda: _runs(sweep), 60, "a gpu-sweep run started by the crash")
    assert started.parameters == {} and started.state.is_scheduled()


def test_a_sweep_leaving_a_job_without_a_watcher_schedules_one_more_on_the_half_minute(gpu_env, tmp_path, monkeypatch):
    """A job in flight whose driver is gone (here: launched outside any Prefect run) is unwatched: the sweep asks for
    the next one on its own deployment, about a minute on, on the half minute; asked twice, one run. A job whose
    tasks ended leaves nothing to follow up."""
    from prefect import flow as prefect_flow
    from prefect.client.orchestration import get_client

    name = f"gfollow-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(prefect_flow(name="gpu-sweep")(lambda: None))
        client.create_deployment(flow_id=flow_id, name=name)
    deployment = f"gpu-sweep/{name}"
    monkeypatch.setattr(gpu_flows, "own_deployment", lambda: deployment)  # as a run of that deployment finds it

    gpu.launch_job(gpu_env, "job-unwatched", 1, f"{sys.executable} -c 'import time; time.sleep(600)'")
    assert gpu_flows.unwatched(gpu_env, ["job-unwatched"]) == ["job-unwatched"]
    before = time.time()
    first = gpu_flows.follow_up(["job-unwatched"])
    assert gpu_flows.follow_up(["job-unwatched"]) == first  # the same half minute: the same run
    (run,) = _runs(deployment)
    at = run.state.state_details.scheduled_time
    assert str(run.id) == first and run.state.is_scheduled() and (at.second, at.microsecond) == (30, 0)
    assert 30 <= at.timestamp() - before <= 91
    assert gpu_flows.follow_up([]) is None

    gpu.user_stop(gpu_env, "job-unwatched")
    assert gpu_flows.unwatched(gpu_env, ["job-unwatched"]) == []


@pytest.mark.sweep  # a worker, a gpu-job run and two or three sweeps: `make test-sweep`
@pytest.mark.timeout(600)
def test_a_killed_gpu_job_run_is_finished_by_the_sweeps_its_crash_starts(gpu_env, tmp_path):
    """As deployed, nobody running a sweep by hand: the gpu-job run's process is killed while its tasks run; the
    worker reports it Crashed, the trigger starts a sweep, which finds the tasks still running and schedules the
    next; the job ends COMPLETE within a few sweeps, and none is left scheduled after."""
    from prefect.deployments import run_deployment

    name = f"gkill-{uuid.uuid4().hex[:6]}"
    deployed = deploy_from_prefect_yaml(tmp_path, {"gpu-job", "gpu-sweep"}, f"pool-{name}", name)
    worker = Worker(f"pool-{name}", tmp_path / "worker.log", {"PIPELINES_USE_BLOCKS": "0"})
    try:
        command = f"{sys.executable} -c 'import time; time.sleep(20)'"
        run_deployment(
            deployed["gpu-job"], parameters={"job_id": "job-killed", "num_nodes": 2, "command": command}, timeout=0
        )
        job = wait_for(lambda: running_job("job-killed"), 180, "the deployed job's tasks to run")
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(job["owner_pid"]), signal.SIGKILL)  # the gpu-job flow run's process
        killed_at = time.monotonic()
        wait_for(lambda: gpu.get_job("job-killed")["job_status"] == "COMPLETE", 300, "the job COMPLETE")
        took = time.monotonic() - killed_at
        sweeps = _runs(deployed["gpu-sweep"])
        print(f"killed gpu-job run -> job COMPLETE through {len(sweeps)} triggered/follow-up sweeps in {took:.0f} s")
        # the sweep that saw it end scheduled no other: every sweep ends, the last follow-up finding nothing
        wait_for(lambda: all(r.state.is_final() for r in _runs(deployed["gpu-sweep"])), 180, "the last sweep ended")
        assert {r.state_name for r in _runs(deployed["gpu-sweep"])} == {"Completed"}, worker.tail()
        assert took < 200, f"{took:.0f} s\n{worker.tail()}"
    finally:
        worker.stop()
