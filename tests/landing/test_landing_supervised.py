"""A supervised listener, as `make up` runs it: a real `prefect server start` (its triggers service), the engine fork
server with a process worker beside it, and `records-listen/local` deployed from prefect.yaml with its trigger. The
listener's flow process is SIGKILLed mid-stream; the worker reports the run Crashed, the deployment's trigger starts
a new run, and every message file dropped before, during and after is written exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from deployments import local_stack
from tasks.core import state_store
from tasks.core.object_store import LocalStore
from tasks.records import keys
from tests.helpers.crashpoints import REPO_ROOT, child_env
from tests.helpers.landing import record_messages
from tests.helpers.prefect_runs import prefect_cli, prefect_server_process

pytestmark = pytest.mark.sweep  # a server, a worker and two listener runs: about two minutes on a loaded machine

FILES = 24  # 5 messages each


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def _wait(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def _drop(root: Path, first: int, count: int) -> list[str]:
    names = []
    for i in range(first, first + count):
        name = f"m-{i:02d}.json"
        staged = root / f".{name}.part"
        staged.write_text(json.dumps(record_messages(5 * i, 5)))
        target = root / keys.RECORDS_INCOMING_PREFIX / name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, target)  # renamed in, as uploads land
        names.append(name)
    return names


@pytest.mark.timeout(900)
def test_a_sigkilled_listener_is_back_within_a_minute_and_nothing_is_lost(tables, store_root, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv("PIPELINES_RUNTIME_DIR", str(tmp_path / "runtime"))
    pool = f"supervised-{uuid.uuid4().hex[:6]}"
    with prefect_server_process(tmp_path) as base, temporary_settings({PREFECT_API_URL: f"{base}/api"}):
        env = child_env(
            {
                "PREFECT_API_URL": f"{base}/api",
                "PIPELINES_ROOT": str(REPO_ROOT),
                "PIPELINES_USE_BLOCKS": "0",
                "PREFECT_WORKER_QUERY_SECONDS": "1",
                "PREFECT_WORKER_PREFETCH_SECONDS": "1",
            }
        )
        with get_client(sync_client=True) as client:
            client.create_work_pool(
                WorkPoolCreate(name=pool, type="process", base_job_template=local_stack.process_base_job_template())
            )
        prefect_cli("deploy", "--name", "records-listen/local", "--pool", pool, env=env)
        worker = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"]
        log = open(tmp_path / "worker.log", "wb")
        # the engine fork server and the worker beside it, two programs as `make up`'s supervisor runs them
        server, worker_process = (
            subprocess.Popen(
                command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            for command in ([sys.executable, str(local_stack.FORKSERVER), "serve", local_stack.engine_socket()], worker)
        )
        try:
            # a run the worker takes before the server listens runs the engine itself (the run command's fallback):
            # the first run starts once the server, preloading the pipelines' code, listens
            _wait(lambda: os.path.exists(local_stack.engine_socket()), 120, "the engine fork server to listen")
            with get_client(sync_client=True) as client:
                deployment = client.read_deployment_by_name("records-listen/local")
                only = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))

                def runs():
                    return client.read_flow_runs(deployment_filter=only)

                client.create_flow_run_from_deployment(deployment.id)
                names = _drop(store_root, 0, FILES // 2)
                granules = [f"LAND.G{i:03d}" for i in range(5 * FILES)]

                def written():
                    return len(state_store.get_many(tables["granules"], [{"granuleId": g} for g in granules]))

                _wait(lambda: written() > 0, 300, "the listener to write some records")

                # runs: forks of the server
                def forked():
                    return [p for p in _children(server.pid) if "engine_forkserver" in _cmdline(p)]

                (listener_pid,) = _wait(forked, 30, "the listener's process")
                (first,) = [r for r in runs() if r.state_type.value == "RUNNING"]
                os.kill(listener_pid, signal.SIGKILL)  # the flow process itself, mid-stream
                killed_at = time.monotonic()
                names += _drop(store_root, FILES // 2, FILES // 4)  # landing while no listener runs
                _wait(
                    lambda: client.read_flow_run(first.id).state_type.value == "CRASHED",
                    60,
                    "the worker to report Crashed",
                )
                second = _wait(
                    lambda: [r for r in runs() if r.id != first.id and r.state_type.value == "RUNNING"],
                    120,
                    "the trigger's new listener run",
                )
                back_after = time.monotonic() - killed_at
                names += _drop(store_root, FILES // 2 + FILES // 4, FILES - FILES // 2 - FILES // 4)
                _wait(lambda: written() == len(granules), 300, "every message to be written")
                store = LocalStore(store_root)
                _wait(lambda: not list(store.list(keys.RECORDS_INCOMING_PREFIX)), 120, "every file to be set aside")
        finally:
            for process in (worker_process, server):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
            log.close()
    assert len(second) == 1, second  # one listener again, never two
    assert back_after < 60, f"listening again {back_after:.0f} s after the kill"
    found = state_store.get_many(tables["granules"], [{"granuleId": g} for g in granules])
    assert Counter(g["status"] for g in found) == {"completed": len(granules)}  # none lost
    processed = sorted(k.rsplit("/", 1)[1] for k in store.list("records/processed/"))
    assert processed == sorted(names)  # each file written and set aside once
    assert list(store.list(keys.DEAD_LETTER_PREFIX)) == []
    print(f"supervised listener: SIGKILLed, Crashed, and a new run listening {back_after:.1f} s later")
