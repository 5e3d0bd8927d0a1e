"""A local worker started again (by the engine fork server, after it was killed) first marks Crashed the runs its
predecessor left without a process, so their triggers replace them and no dead run holds a deployment's slot."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid

from deployments import local_stack


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
