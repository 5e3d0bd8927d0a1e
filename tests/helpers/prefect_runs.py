"""Prefect for the tests that run it as users do: a real server process, prefect.yaml's deployments on a work
pool, a process worker, waiting on runs, and the event that reports a crashed run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from deployments.local_stack import throwaway_prefect_server
from tests.helpers.crashpoints import REPO_ROOT, child_env


@contextlib.contextmanager
def prefect_server_process(tmp_path: Path, env: dict[str, str] | None = None):
    """A real ``prefect server start`` (with its UI and services) on a free port and its own database; its URL."""
    with throwaway_prefect_server(tmp_path / "prefect-home", env) as base:
        yield base


def flow_name(entrypoint: str) -> str:
    """The Prefect flow name of a prefect.yaml entrypoint (``flows/etl.py:ndjson_merge`` -> ``ndjson-merge``)."""
    return entrypoint.split(":")[1].replace("_", "-")


def prefect_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300):
    """``prefect --no-prompt ARGS`` against the test server (or with ``env``), as a user types it; must succeed."""
    from prefect.settings import PREFECT_API_URL

    env = env or {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PIPELINES_ROOT": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _to_copies(value, name: str):
    """``value`` (parameters, triggers) with every reference to a 'local' deployment pointed at the copy ``name``."""
    if isinstance(value, dict):
        return {
            k: name if k == "prefect.resource.name" and v == "local" else _to_copies(v, name) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_to_copies(v, name) for v in value]
    return value.replace("/local", f"/{name}") if isinstance(value, str) and value.endswith("/local") else value


# a deployed merge run stays for more manifests until this many seconds from its start (prefect.yaml: 60 s), over
# the launcher's 15 s margin so the stay is still trusted for a while
TEST_STAY_S = 20.0


def deploy_from_prefect_yaml(tmp_path: Path, flows: set[str], pool: str, name: str) -> dict[str, str]:
    """`prefect deploy` the 'local' deployments of ``flows`` from prefect.yaml as ``{flow}/{name}`` on ``pool``.

    Everything else (entrypoint, parameters, triggers, pull step) is prefect.yaml's own, but for a merge run's stay
    for more (``more_seconds``), cut to ``TEST_STAY_S`` so a test's merge run ends soon after its work; references
    from one deployment to another (``merge_deployment``, ``reassembly_deployment``, the triggers' deployment names)
    are pointed at the copies.
    """
    import yaml
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    config = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    chosen = []
    for deployment in config["deployments"]:
        if deployment["name"] != "local" or flow_name(deployment["entrypoint"]) not in flows:
            continue
        parameters = _to_copies(deployment.get("parameters") or {}, name)
        if parameters.get("stay_for_more"):
            parameters["more_seconds"] = min(float(parameters["more_seconds"]), TEST_STAY_S)
        chosen.append(
            {
                **deployment,
                "name": name,
                "work_pool": {"name": pool, "work_queue_name": "default"},
                "parameters": parameters,
                "schedules": [],
                "triggers": _to_copies(deployment.get("triggers") or [], name),
            }
        )
    assert {flow_name(d["entrypoint"]) for d in chosen} == flows
    document = {key: config[key] for key in ("name", "prefect-version", "build", "push", "pull")}
    path = tmp_path / "prefect-test.yaml"
    path.write_text(yaml.safe_dump({**document, "deployments": chosen}, sort_keys=False))
    from deployments.local_stack import process_base_job_template

    with get_client(sync_client=True) as client:
        try:  # as `make up` makes its pool: flow runs started by the engine command
            client.create_work_pool(
                WorkPoolCreate(name=pool, type="process", base_job_template=process_base_job_template())
            )
        except ObjectAlreadyExists:
            pass
    prefect_cli("deploy", "--all", "--prefect-file", str(path))
    return {flow: f"{flow}/{name}" for flow in flows}


class Worker:
    """A `prefect worker start` process on ``pool`` with this test's environment (tables, endpoints, store)."""

    def __init__(self, pool: str, log: Path, extra: dict[str, str] | None = None):
        env = child_env({"PREFECT_WORKER_QUERY_SECONDS": "1", "PIPELINES_ROOT": str(REPO_ROOT), **(extra or {})})
        self.log = log
        with open(log, "ab") as handle:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"],
                cwd=REPO_ROOT,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        """Stop the worker and whatever flow runs it still has (its process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def tail(self) -> str:
        """The end of the worker's log (for assertion messages)."""
        return self.log.read_text(errors="replace")[-4000:]


def wait_for_runs(deployment: str, count: int, timeout: float = 240, worker: Worker | None = None) -> list:
    """Wait until ``count`` runs of ``deployment`` exist and all are final; returns them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        deployment_id = client.read_deployment_by_name(deployment).id
        while True:
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            )
            if len(runs) >= count and all(r.state and r.state.is_final() for r in runs):
                return runs
            if time.monotonic() > deadline:
                states = [(r.name, r.state_name) for r in runs]
                raise AssertionError(
                    f"{deployment}: runs {states} not final in {timeout} s\n{worker.tail() if worker else ''}"
                )
            time.sleep(1)


def wait_for(predicate, timeout: float, what: str):
    """The first true value of ``predicate()``, polled every 0.2 s; fails after ``timeout`` s waiting for ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def task_run_state(task_run_id: str) -> str | None:
    """The state type of a task run on the server (``RUNNING``...), None while the server has no record of it."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        try:
            run = client.read_task_run(task_run_id)
        except Exception:  # noqa: BLE001 - not recorded yet (task run states arrive as events)
            return None
    return run.state.type.value if run.state else None


def crash_event(run_id) -> dict:
    """The event prefect.yaml's trigger hands `records-prefect-state` for a crashed flow run."""
    return {"event": "prefect.flow-run.Crashed", "resource": {"prefect.resource.id": f"prefect.flow-run.{run_id}"}}


def api_url() -> str:
    """The Prefect API this process talks to (the test server's)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def flow_run_state(flow_run_id: str):
    """A flow run's state on the server."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(uuid.UUID(flow_run_id)).state


def wait_for_json(path: Path, seconds: float = 60) -> dict:
    """The JSON a run writes to ``path``, once it is there (fails after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.05)
    return json.loads(path.read_text())


@contextlib.contextmanager
def fork_server_process(script: Path | str, sock: str, **env: str):
    """An engine fork server (``script serve sock``) with no worker beside it, started with the environment a worker
    has (the test server's API, ``env`` on top); the process, once its socket exists."""
    env = {**os.environ, "PREFECT_API_URL": api_url(), "PREFECT_LOGGING_LEVEL": "WARNING", **env}
    server = subprocess.Popen(
        [sys.executable, str(script), "serve", sock],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            assert server.poll() is None and time.monotonic() < deadline, (
                server.stdout.read() if server.poll() is not None else "no socket"
            )
            time.sleep(0.05)
        yield server
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
