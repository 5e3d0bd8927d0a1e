"""The local stack: DynamoDB Local, a Prefect server, one process-pool worker, tables, blocks, deployments.

    python -m deployments.local_stack up|down|status

Idempotent: `up` twice starts nothing twice; `down` twice is fine. DynamoDB data lives in .data/dynamodb,
so state survives `down && up`. Processes are tracked by pid files in .data/run and log to .data/logs.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from deployments import dynamodb_local
from deployments.dynamodb_local import StackError, port_open

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = REPO_ROOT / ".data"
RUN = DATA / "run"
LOGS = DATA / "logs"
HOST = "127.0.0.1"
DYNAMODB_PORT = int(os.environ.get("DYNAMODB_LOCAL_PORT", "8000"))
PREFECT_PORT = int(os.environ.get("PREFECT_SERVER_PORT", "4200"))
WORK_POOL = os.environ.get("LOCAL_WORK_POOL", "local-process")
ECS_WORK_POOL = os.environ.get("ECS_WORK_POOL", "aws-ecs")
ENV_FILE = DATA / "local.env"


def local_env() -> dict[str, str]:
    """What every local process needs: the endpoints and dummy credentials for DynamoDB Local."""
    return {
        "AWS_ENDPOINT_URL_DYNAMODB": f"http://{HOST}:{DYNAMODB_PORT}",
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "local"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "local"),
        "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        "PREFECT_API_URL": f"http://{HOST}:{PREFECT_PORT}/api",
        "PREFECT_HOME": str(DATA / "prefect"),
        "OBJECT_STORE_BASE_URL": os.environ.get("OBJECT_STORE_BASE_URL", (DATA / "objects").as_uri()),
        "PIPELINES_ROOT": str(REPO_ROOT),  # prefect.yaml's pull step: where the local worker runs flows
    }


def _pid(name: str) -> int | None:
    path = RUN / f"{name}.pid"
    try:
        pid = int(path.read_text())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        path.unlink(missing_ok=True)
        return None


def _spawn(name: str, args: list[str], env: dict[str, str]) -> int:
    RUN.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    log = open(LOGS / f"{name}.log", "ab")
    process = subprocess.Popen(
        args, cwd=REPO_ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    (RUN / f"{name}.pid").write_text(str(process.pid))
    return process.pid


def _wait_port(name: str, port: int, pid: int, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if port_open(HOST, port):
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise StackError(f"{name} exited at start; see {LOGS / (name + '.log')}") from None
        time.sleep(0.3)
    raise StackError(f"{name} did not listen on {HOST}:{port} within {seconds:.0f} s; see {LOGS / (name + '.log')}")


def _check_port_free(name: str, port: int) -> None:
    if port_open(HOST, port):
        raise StackError(
            f"port {port} is already taken by another program, so {name} cannot start: "
            f"stop it (`ss -ltnp 'sport = :{port}'` shows who) or set {'DYNAMODB_LOCAL_PORT' if name == 'dynamodb' else 'PREFECT_SERVER_PORT'}."
        )


def start_dynamodb() -> str:
    if _pid("dynamodb") and port_open(HOST, DYNAMODB_PORT):
        return "running"
    _check_port_free("dynamodb", DYNAMODB_PORT)
    LOGS.mkdir(parents=True, exist_ok=True)
    process = dynamodb_local.start(DYNAMODB_PORT, db_path=DATA / "dynamodb", log_path=LOGS / "dynamodb.log")
    RUN.mkdir(parents=True, exist_ok=True)
    (RUN / "dynamodb.pid").write_text(str(process.pid))
    return "started"


def _prefect(*args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, **local_env()}
    result = subprocess.run(
        [sys.executable, "-m", "prefect", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    if check and result.returncode != 0:
        raise StackError(f"`prefect {' '.join(args)}` failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    if not quiet and result.stdout.strip():
        print(result.stdout.strip()[-1500:])
    return result


def start_prefect_server() -> str:
    if _pid("prefect-server") and port_open(HOST, PREFECT_PORT):
        return "running"
    _check_port_free("prefect-server", PREFECT_PORT)
    (DATA / "prefect").mkdir(parents=True, exist_ok=True)
    pid = _spawn(
        "prefect-server",
        [sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(PREFECT_PORT)],
        local_env(),
    )
    _wait_port("prefect-server", PREFECT_PORT, pid, 120)
    _wait_healthy()
    return "started"


def _wait_healthy(seconds: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{PREFECT_PORT}/api/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise StackError("the Prefect server does not answer /api/health; see .data/logs/prefect-server.log")


def ensure_work_pools() -> None:
    """The local process pool (served by `make up`'s worker) and an ECS pool for the AWS deployments."""
    os.environ.update(local_env())
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        for pool, kind in ((WORK_POOL, "process"), (ECS_WORK_POOL, "ecs")):
            try:
                client.read_work_pool(pool)
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=pool, type=kind))


def start_worker() -> str:
    if _pid("worker"):
        return "running"
    _spawn(
        "worker",
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", WORK_POOL, "--type", "process"],
        {**local_env(), "PREFECT_WORKER_QUERY_SECONDS": "2"},  # pick up `deployment run`s quickly
    )
    return "started"


def ensure_tables_and_blocks() -> dict[str, str]:
    os.environ.update(local_env())
    from blocks import DynamoTables, ObjectStorage, load_config
    from tasks import state_store
    from tasks.tables import ensure_tables

    state_store.reset_clients()
    result = ensure_tables(load_config(DynamoTables).names())
    _prefect("block", "register", "-m", "blocks", quiet=True)
    # save the defaults so the UI shows (and a person can edit) the configuration the flows use
    load_config(DynamoTables).save("default", overwrite=True)
    ObjectStorage(base_url=local_env()["OBJECT_STORE_BASE_URL"]).save("default", overwrite=True)
    return result


def deploy_all() -> str:
    if not (REPO_ROOT / "prefect.yaml").exists():
        return "skipped (no prefect.yaml)"
    _prefect("--no-prompt", "deploy", "--all", quiet=True)
    return "deployed (prefect deploy --all)"


def write_env_file() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    ENV_FILE.write_text("".join(f"export {k}={v}\n" for k, v in local_env().items()))


def up() -> None:
    dynamodb_local.java()
    dynamodb_local.jar_path()
    print(f"dynamodb-local   {start_dynamodb():8} http://{HOST}:{DYNAMODB_PORT}  (data in .data/dynamodb)")
    print(f"prefect-server   {start_prefect_server():8} http://{HOST}:{PREFECT_PORT}")
    ensure_work_pools()
    for table, state in ensure_tables_and_blocks().items():
        print(f"table            {state:8} {table}")
    register_extras()
    print(f"deployments      {deploy_all()}")
    print(f"worker           {start_worker():8} pool {WORK_POOL}")
    write_env_file()
    print(f"\nUse it from a shell with:  source {ENV_FILE.relative_to(REPO_ROOT)}")
    print(f"Prefect UI: http://{HOST}:{PREFECT_PORT}")


def register_extras() -> None:
    """Pipeline-specific setup for the local stack (e.g. the GPU pipeline's local nodes)."""
    try:
        from deployments.ops import gpu
    except ImportError:
        return
    register = getattr(gpu, "register_local_nodes", None)
    if register is not None:
        print(f"gpu nodes        {register()}")


def _stop(name: str) -> str:
    pid = _pid(name)
    if pid is None:
        return "stopped"
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(pid, signal.SIGKILL)
    (RUN / f"{name}.pid").unlink(missing_ok=True)
    return "stopped now"


def down() -> None:
    for name in ("worker", "prefect-server", "dynamodb"):
        print(f"{name:16} {_stop(name)}")


def status() -> None:
    for name, port in (("dynamodb", DYNAMODB_PORT), ("prefect-server", PREFECT_PORT), ("worker", None)):
        pid = _pid(name)
        state = "running" if pid and (port is None or port_open(HOST, port)) else "stopped"
        print(f"{name:16} {state}{f' (pid {pid})' if pid else ''}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    args = parser.parse_args()
    try:
        {"up": up, "down": down, "status": status}[args.command]()
    except StackError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
