"""A local worker started again (by the engine fork server, after it was killed) first marks Crashed the runs its
predecessor left without a process, so their triggers replace them and no dead run holds a deployment's slot."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from deployments import local_stack

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_restarted_worker_crashes_the_runs_whose_process_is_gone_and_only_those(monkeypatch):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.states import Pending, Running

    pool = f"local-{uuid.uuid4().hex[:6]}"
    monkeypatch.setattr(local_stack, "WORK_POOL", pool)

    @flow(name="worker-restart-probe")
    def probe() -> None:
        """Never run: the test sets its runs' states."""

    host = socket.gethostname()
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        deployment_id = probe.to_deployment(name=pool, work_pool_name=pool).apply()

        def run(state, pid: int | None):
            created = client.create_flow_run_from_deployment(deployment_id)
            client.set_flow_run_state(created.id, state, force=True)
            if pid is not None:
                client.update_flow_run(created.id, infrastructure_pid=f"{host}:{pid}")
            return created.id

        gone_running = run(Running(), _dead_pid())
        live_running = run(Running(), os.getpid())
        claimed_never_started = run(Pending(), None)
        scheduled = client.create_flow_run_from_deployment(deployment_id).id
        other_pool = client.create_flow_run(probe, state=Running())  # no deployment: not the local pool's

        marked = local_stack.crash_runs_of_gone_processes(client)
        states = {
            i: client.read_flow_run(i).state
            for i in (gone_running, live_running, claimed_never_started, scheduled, other_pool.id)
        }
    assert len(marked) == 2
    assert states[gone_running].is_crashed() and states[claimed_never_started].is_crashed()
    assert states[live_running].is_running() and states[scheduled].is_scheduled() and states[other_pool.id].is_running()
    assert "gone with the worker" in states[gone_running].message


@pytest.fixture
def probe_runs(monkeypatch):
    """A fresh local pool with one deployment; ``make(state, infrastructure_pid)`` a run of it in that state."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    pool = f"local-{uuid.uuid4().hex[:6]}"
    monkeypatch.setattr(local_stack, "WORK_POOL", pool)

    @flow(name="worker-restart-probe")
    def probe() -> None:
        """Never run: the test sets its runs' states."""

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        deployment_id = probe.to_deployment(name=pool, work_pool_name=pool).apply()

        def make(state, infrastructure_pid: str):
            created = client.create_flow_run_from_deployment(deployment_id)
            client.set_flow_run_state(created.id, state, force=True)
            client.update_flow_run(created.id, infrastructure_pid=infrastructure_pid)
            return created.id

        yield client, make


def _process_started_after(moment: float) -> subprocess.Popen:
    """A live process that began later than ``moment`` by more than the pid-reuse slack."""
    time.sleep(max(0.0, moment + local_stack.PID_REUSE_SLACK_S + 0.2 - time.time()))
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _process_with_pid(pid: int, after: float) -> subprocess.Popen:
    """A live process given ``pid`` (a dead one's) by the kernel, begun later than ``after`` by more than the slack:
    what a dead run's pid names once the kernel hands it out again (root sets the next pid, ``ns_last_pid``)."""
    time.sleep(max(0.0, after + local_stack.PID_REUSE_SLACK_S + 0.2 - time.time()))
    for _ in range(50):  # another process on the machine may take the pid first
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
                handle.write(str(pid - 1))
        except OSError as error:
            pytest.skip(f"cannot choose the next pid here ({error}): the test runs as root on Linux")
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        if process.pid == pid:
            return process
        process.kill()
        process.wait()
    pytest.fail(f"pid {pid} was never handed out again")


def test_a_run_whose_pid_now_names_a_later_process_is_crashed_and_one_on_another_host_is_left_alone(probe_runs):
    from prefect.states import Pending, Running

    client, make = probe_runs
    host = socket.gethostname()
    running_pid_reused = make(Running(), "0")  # its pid set below, once a process that started after it runs
    began = client.read_flow_run(running_pid_reused).state.timestamp.timestamp()
    newcomer = _process_started_after(began)
    try:
        client.update_flow_run(running_pid_reused, infrastructure_pid=f"{host}:{newcomer.pid}")
        dead = _dead_pid()
        pending_pid_reused = make(Pending(), str(dead))  # the worker records the pid once its process started
        later = _process_with_pid(dead, after=client.read_flow_run(pending_pid_reused).updated.timestamp())
        try:
            # a run recorded on another machine: a pid here says nothing about it, dead or not
            elsewhere_dead = make(Running(), f"another-host.example:{_dead_pid()}")
            elsewhere_reused = make(Running(), f"another-host.example:{newcomer.pid}")
            bare_live = make(Running(), str(os.getpid()))  # Prefect 3.8's process worker records a bare pid

            marked = local_stack.crash_runs_of_gone_processes(client)
            states = {
                i: client.read_flow_run(i).state
                for i in (running_pid_reused, elsewhere_dead, elsewhere_reused, bare_live)
            }
            pending_state = client.read_flow_run(pending_pid_reused).state
        finally:
            later.kill()
    finally:
        newcomer.kill()
    assert len(marked) == 2
    assert states[running_pid_reused].is_crashed() and pending_state.is_crashed()
    assert states[elsewhere_dead].is_running() and states[elsewhere_reused].is_running()
    assert states[bare_live].is_running()


def test_make_up_replaces_a_listener_whose_pid_now_names_another_process(probe_runs, monkeypatch):
    from prefect.states import Running

    client, make = probe_runs
    monkeypatch.setattr(local_stack, "listener_deployments", lambda: (f"worker-restart-probe/{local_stack.WORK_POOL}",))
    listener = make(Running(), "0")
    newcomer = _process_started_after(client.read_flow_run(listener).state.timestamp.timestamp())
    try:
        client.update_flow_run(listener, infrastructure_pid=str(newcomer.pid))
        states = local_stack.start_listeners(client, worker_restarted=False)
        assert newcomer.poll() is None  # the process that took the pid over is not the listener's: untouched
    finally:
        newcomer.kill()
    assert states == {f"worker-restart-probe/{local_stack.WORK_POOL}": "restarted"}
    assert client.read_flow_run(listener).state.is_crashed()
