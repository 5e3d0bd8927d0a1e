"""The engine fork server preloads the pipelines' own code (`flows`, `tasks`, `blocks`) and a run still executes the
code on disk now: a preloaded run sees its own environment; a module edited, added or removed since the preload is
imported anew by the next run (and preloaded again for the one after); a run whose path finds the packages in another
checkout imports that checkout's. Module-level code in those packages reads no environment and makes no client,
thread or socket, so what the server imported is the same in every run."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from deployments import local_stack
from deployments.engine_forkserver import PROJECT_PACKAGES
from tests.helpers.prefect_runs import api_url, flow_run_state, fork_server_process, wait_for_json

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

REPO = local_stack.REPO_ROOT

PROBE_FLOW = """
import importlib, json, os
from pathlib import Path
from prefect import flow
from tasks import probe_task


@flow
def probe(out: str) -> int:
    try:
        extra = importlib.import_module("tasks.probe_extra").VALUE
    except ImportError:
        extra = None
    Path(out).write_text(json.dumps({
        "pid": os.getpid(), "mark": os.environ.get("PIPELINES_ENGINE_FORK"), "env": probe_task.seen_env(),
        "version": probe_task.VERSION, "imported_in": probe_task.IMPORTED_IN, "extra": extra,
    }))
    return 1
"""
PROBE_TASK = """
import os

VERSION = {version!r}
IMPORTED_IN = os.getpid()  # the process that imported this module: the server when it was preloaded


def seen_env():
    return os.environ.get("FORK_PROBE")
"""


def make_project(root: Path, version: str) -> Path:
    """A checkout of its own: the fork server's file beside `flows`, `tasks` and `blocks` packages with a probe flow
    whose task module records where it was imported (the server preloads this checkout's packages)."""
    for package in PROJECT_PACKAGES:
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "deployments").mkdir()
    shutil.copy(REPO / "deployments" / "engine_forkserver.py", root / "deployments")
    (root / "tasks" / "core").mkdir()
    (root / "tasks" / "core" / "__init__.py").write_text("")
    for name in ("private_folder.py", "errors.py"):  # the socket's checks, loaded by path from the server's checkout
        shutil.copy(REPO / "tasks" / "core" / name, root / "tasks" / "core")
    (root / "flows" / "probe.py").write_text(PROBE_FLOW)
    (root / "tasks" / "probe_task.py").write_text(PROBE_TASK.format(version=version))
    return root


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path / "checkout", "v1")


@pytest.fixture
def project_server(project, tmp_path):
    """The project's own fork server (its path: the project alone); its pid and socket."""
    sock = str(tmp_path / "engine.sock")
    with fork_server_process(project / "deployments" / "engine_forkserver.py", sock, PYTHONPATH=str(project)) as server:
        yield server.pid, sock


@pytest.fixture
def deploy():
    """A function deploying a checkout's probe flow on a process pool of its own; it returns a function making a
    run of that deployment."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    def deploy_from(checkout: Path):
        pool = f"preload-{uuid.uuid4().hex[:8]}"
        with get_client(sync_client=True) as client:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        deployment_id = flow.from_source(str(checkout), "flows/probe.py:probe").deploy(
            name="preload", work_pool_name=pool, print_next_steps=False
        )

        def new_run(out: Path) -> str:
            with get_client(sync_client=True) as client:
                return str(client.create_flow_run_from_deployment(deployment_id, parameters={"out": str(out)}).id)

        return new_run

    return deploy_from


def run_probe(server, new_run, project: Path, out: Path, **env: str) -> dict:
    """One run of the probe as the process worker starts it (the pool's command, the stack's PYTHONPATH: the
    server's checkout); what the run saw."""
    _, sock = server
    flow_run_id = new_run(out)
    run_env = {
        **os.environ,
        "PREFECT_API_URL": api_url(),
        "PREFECT__FLOW_RUN_ID": flow_run_id,
        "PYTHONPATH": str(project),
        **env,
    }
    command = subprocess.run(
        [sys.executable, str(project / "deployments" / "engine_forkserver.py"), "run", sock],
        env=run_env,
        cwd=out.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert command.returncode == 0, command.stderr[-3000:]
    assert flow_run_state(flow_run_id).is_completed()
    return wait_for_json(out)


def test_a_preloaded_run_sees_its_own_environment(project_server, project, deploy, tmp_path):
    """Fails on the code before the preload: the mark is missing and the task module is imported by the run."""
    server_pid, _ = project_server
    seen = run_probe(project_server, deploy(project), project, tmp_path / "one.json", FORK_PROBE="run-42")
    assert seen["mark"] == "preloaded" and seen["imported_in"] == server_pid != seen["pid"]  # preloaded, forked
    assert seen["env"] == "run-42"  # the run's environment, set only in the run's


def test_an_edit_between_two_runs_is_executed_by_the_second_and_preloaded_for_the_third(
    project_server, project, deploy, tmp_path
):
    """Fails on the code before the preload (no mark, the module never preloaded); the versions alone would pass
    there, as every run imported anew."""
    server_pid, _ = project_server
    new_run = deploy(project)
    assert run_probe(project_server, new_run, project, tmp_path / "1.json")["version"] == "v1"
    (project / "tasks" / "probe_task.py").write_text(PROBE_TASK.format(version="v2 edited"))
    second = run_probe(project_server, new_run, project, tmp_path / "2.json")
    assert (second["version"], second["mark"]) == ("v2 edited", "fresh")
    assert second["imported_in"] == second["pid"]  # imported by the run itself
    third = run_probe(project_server, new_run, project, tmp_path / "3.json")
    assert (third["version"], third["mark"], third["imported_in"]) == ("v2 edited", "preloaded", server_pid)


def test_a_module_added_after_the_preload_is_importable(project_server, project, deploy, tmp_path):
    new_run = deploy(project)
    assert run_probe(project_server, new_run, project, tmp_path / "1.json")["extra"] is None
    (project / "tasks" / "probe_extra.py").write_text("VALUE = 'added'\n")
    seen = run_probe(project_server, new_run, project, tmp_path / "2.json")
    assert (seen["extra"], seen["mark"]) == ("added", "fresh")


def test_a_run_of_another_checkout_imports_that_checkouts_code(project_server, project, deploy, tmp_path):
    """The pull step puts another checkout first on the run's path: the preloaded modules (the server's checkout)
    are not the ones the run would import, so it imports its own. Fails without the entrypoint's check (the
    preloaded v1 would run) and on the code before the preload (no mark)."""
    other = make_project(tmp_path / "other", "the other checkout's")
    seen = run_probe(project_server, deploy(other), project, tmp_path / "other.json")
    assert (seen["version"], seen["mark"]) == ("the other checkout's", "fresh")


def test_a_run_whose_prefect_defaults_differ_imports_anew(project_server, project, deploy, tmp_path):
    """A ``@task`` decorator reads the default retries as it is applied: the preloaded tasks hold the server's, so a
    run with its own imports anew. Fails without the settings check (and on the code before the preload)."""
    seen = run_probe(project_server, deploy(project), project, tmp_path / "one.json", PREFECT_TASK_DEFAULT_RETRIES="3")
    assert seen["mark"] == "fresh" and seen["imported_in"] == seen["pid"]


# --------------------------------------------------------------------------- what preloading may share


def _module_level_nodes(tree: ast.Module):
    """The nodes a module runs at import: all but function bodies (their decorators and defaults do run) and the
    ``if __name__ == "__main__":`` block."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            stack.extend([*arguments.defaults, *(d for d in arguments.kw_defaults if d)])
            stack.extend(getattr(node, "decorator_list", []))
            continue
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


ENVIRONMENT_READS = {"environ", "getenv", "getenvb", "getcwd", "getcwdb", "cwd", "home", "expanduser", "gettempdir"}


def test_module_level_code_of_the_pipelines_reads_no_environment():
    """The fork server imports these packages once, in its own environment and folder; a read at import would hand
    every run the server's value. Read at call time instead. (Failed before: tasks/core/faults.py armed its plan
    from PIPELINES_FAULT at import.)"""
    found = []
    for package in PROJECT_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            source = path.read_text()
            for node in _module_level_nodes(ast.parse(source)):
                name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
                if isinstance(node, (ast.Attribute, ast.Name)) and name in ENVIRONMENT_READS:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.get_source_segment(source, node)}")
    assert not found, "module-level reads of the environment or folder:\n" + "\n".join(found)


def test_the_fault_injector_reads_the_environment_of_its_process_at_its_first_write():
    """Imported (as the fork server does) before the run's environment is set, it still arms from that environment.
    Fails on the code before (armed at import, from the importing process's environment)."""
    script = textwrap.dedent("""
        import os
        from tasks.core import faults
        os.environ["PIPELINES_FAULT"] = "1:raise:before"
        try:
            faults.before("objects", "put_bytes", "a/key") if faults.armed else None
        except faults.InjectedFault:
            print("injected")
    """)
    env = {k: v for k, v in os.environ.items() if k != "PIPELINES_FAULT"}
    done = subprocess.run(
        [sys.executable, "-c", script], env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    assert done.stdout.strip() == "injected", done.stderr[-2000:]


def test_the_preloaded_server_holds_no_client_session_thread_or_socket():
    """A fork inherits what the server made: a boto3 session or client, an httpx client, a thread or a socket made
    at import would be shared by every run (a client's pool across processes, a lock held by a thread that is not
    there). The server's preload, then a look at what is alive."""
    script = textwrap.dedent("""
        import gc, importlib, json, socket, sys, threading
        from deployments import engine_forkserver as server
        for name in server.PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:
                pass
        server.preload_project()
        assert "flows.video" in sys.modules and "tasks.etl" in sys.modules, sorted(server.project_module_names())
        import boto3.session, botocore.client, httpx
        kinds = (boto3.session.Session, botocore.client.BaseClient, httpx.Client, httpx.AsyncClient, socket.socket)
        shared = sorted({type(o).__name__ for o in gc.get_objects() if isinstance(o, kinds)})
        print(json.dumps({"threads": [t.name for t in threading.enumerate()], "shared": shared}))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    alive = json.loads(done.stdout.splitlines()[-1])
    assert alive == {"threads": ["MainThread"], "shared": []}, alive
