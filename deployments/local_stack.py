"""The local stack: DynamoDB Local, a Prefect server, one process-pool worker, tables, blocks, deployments.

    python -m deployments.local_stack up|down|status

Idempotent: `up` twice starts nothing twice; `down` twice is fine. DynamoDB data lives in .data/dynamodb,
so state survives `down && up`. One supervisord (``deployments/supervisor.py``) runs DynamoDB Local, PostgreSQL, the
Prefect server, the engine fork server and the worker, starts any that dies again, and keeps their logs in
.data/logs; `status` lists them with their state and uptime. `up` starts the stores (DynamoDB Local, PostgreSQL, the
Prefect server) first, makes the tables, blocks, migrations and deployments current, and only then starts the
programs that run the code on them (the engine fork server, the worker, the listeners' keeper).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from deployments import dynamodb_keys, dynamodb_local, postgres_local, releases, stack_tls
from deployments.dynamodb_local import StackError, port_open
from deployments.settings import DynamoDbLocal, PrefectPostgres, PrefectServer, StackSettings
from deployments.supervisor import Supervisor, uptime
from deployments.supervisor import socket_for as supervisor_socket
from tasks.core.settings import MachineSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
_STACK, _DYNAMODB, _SERVER = StackSettings.read(), DynamoDbLocal.read(), PrefectServer.read()  # read once, at import
DATA = Path(MachineSettings.read().data_dir or REPO_ROOT / ".data")  # another folder: a second stack (load test)
RUN = DATA / "run"
LOGS = DATA / "logs"
HOST = "127.0.0.1"
DYNAMODB_PORT = _DYNAMODB.port
PREFECT_PORT = _SERVER.port
# the port the stack's clients call where it is not the server's own: a counting proxy's in front of it
# (benchmarks/api_budget.py); None: the server's
API_CLIENT_PORT = _STACK.api_client_port
WORK_POOL = _STACK.local_work_pool
ECS_WORK_POOL = _STACK.ecs_work_pool
# the AWS stack's process pool of the frequent maintenance flows (its worker runs in the stack's maintenance service)
MAINTENANCE_WORK_POOL = _STACK.maintenance_work_pool
ENV_FILE = DATA / "local.env"
FORKSERVER = REPO_ROOT / "deployments" / "engine_forkserver.py"
# the long-running listener deployments `up` starts, one run each (a name not deployed yet is skipped)
# the Prefect server's database: "postgres" (Debian's postgresql; the default where its binaries are) or "sqlite"
# (embedded; "database is locked" under the pipelines' load, see benchmarks/server_load.py). PREFECT_SERVER_DB chooses.
SERVER_DB = _SERVER.db.strip().lower()
POSTGRES_PORT = PrefectPostgres.read().port


def secrets_folder() -> Path:
    """The stack's secrets: .data/secrets (0700), each file in it 0600."""
    return DATA / "secrets"


def api_auth_file() -> Path:
    """Where the stack's Prefect API auth string lives: .data/secrets (0700) / prefect-api-auth (0600)."""
    return secrets_folder() / "prefect-api-auth"


def api_auth_string() -> str | None:
    """The Prefect API's auth string (``user:password``; the server refuses a request without it, 401); None before
    the first `make up`."""
    try:
        return api_auth_file().read_text().strip()
    except FileNotFoundError:
        return None


def rotate_api_auth_string() -> str:
    """A new auth string in place of the last (every `make up` makes one: a string seen once stops working at the
    next start); written whole (0600, then renamed) so no reader sees half of it."""
    import secrets

    from tasks.core.private_folder import write_secret

    write_secret(api_auth_file(), f"pipelines:{secrets.token_urlsafe(32)}\n")
    return api_auth_string()


def dynamodb_keys_file() -> Path:
    """Where the stack's DynamoDB key lives (made afresh at every `make up`, the previous one kept for its grace
    period): .data/secrets (0700) / dynamodb-keys.json (0600)."""
    return secrets_folder() / "dynamodb-keys.json"


def dynamodb_key_env() -> dict[str, str]:
    """AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY of the stack's current DynamoDB key ({} before `make up` made
    one): DynamoDB Local's relay forwards only requests signed with it."""
    key = dynamodb_keys.current(dynamodb_keys_file())
    if key is None:
        return {}
    return {"AWS_ACCESS_KEY_ID": key.access_key_id, "AWS_SECRET_ACCESS_KEY": key.secret_access_key}


def api_certificate() -> Path:
    """The certificate the stack's Prefect API serves and its clients pin (``stack_tls``)."""
    return secrets_folder() / stack_tls.CERT_NAME


def api_url() -> str:
    """The stack's Prefect API: TLS on loopback, under the stack's own certificate."""
    return f"https://{HOST}:{API_CLIENT_PORT or PREFECT_PORT}/api"


def launch_key(create: bool = False) -> str | None:
    """The key a launch seals what a row says to run with (``tasks.core.seal``): ``PIPELINES_LAUNCH_KEY`` where set,
    else .data/secrets (0700) / launch-key (0600), made on the first `make up` (``create``) and kept (rows in flight
    carry seals made with it; a rotation is the operator's, by key id); None where none was made."""
    path = secrets_folder() / "launch-key"
    try:
        configured = MachineSettings.read().launch_key
        return (configured.get_secret_value() if configured else "") or path.read_text().strip()
    except FileNotFoundError:
        if not create:
            return None
    import secrets

    from tasks.core.private_folder import write_secret

    write_secret(path, secrets.token_hex(32) + "\n")
    return launch_key()


def local_env() -> dict[str, str]:
    """What every local process needs: the endpoints and the stack's key for DynamoDB Local, and the Prefect API's
    auth string and the launch key once `make up` made them."""
    from blocks.settings import read_env
    from tasks.core import limits

    auth = api_auth_string()
    return {
        **({"PREFECT_API_AUTH_STRING": auth} if auth else {}),
        **({"PIPELINES_LAUNCH_KEY": key} if (key := launch_key()) else {}),
        "AWS_ENDPOINT_URL_DYNAMODB": f"http://{HOST}:{DYNAMODB_PORT}",
        **dynamodb_key_env(),
        "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),  # boto3's, kept where set
        "PREFECT_API_URL": api_url(),
        "PREFECT_API_SSL_CERT_FILE": str(api_certificate()),  # the one certificate a client of the stack trusts
        # a request the server (or its database) cannot answer is retried after 2, 4 ... 128 s: about four minutes,
        # so a client rides out the server's restart by the supervisor (Prefect's default, 5, gives up after a minute)
        "PREFECT_CLIENT_MAX_RETRIES": "7",
        # the server's CSRF protection is off (Prefect's default): without this every new client asks for a token
        # first (GET /csrf-token, answered 422), one request more per flow run and per `get_client`
        "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED": "false",
        **limits.PREFECT_CLIENT_ENV,
        "PREFECT_HOME": str(DATA / "prefect"),
        # ObjectStorage's base_url, read without importing Prefect: Prefect reads its settings once, at its import,
        # and the caller points them at the stack with what this returns
        "OBJECT_STORE_BASE_URL": read_env("OBJECT_STORE_BASE_URL") or (DATA / "objects").as_uri(),
        "PIPELINES_ROOT": str(REPO_ROOT),  # prefect.yaml's pull step: where the local worker runs flows
    }


def server_retention_env() -> dict[str, str]:
    """The server's database vacuum: ended flow runs (logs, artifacts with them) and events age out after 3 days.

    Seed 001 kept CloudWatch logs 3 days (``PIPELINES_PREFECT_RETENTION_DAYS`` overrides); runs still active are
    never vacuumed (the rule reads ``end_time``). DynamoDB records age out by their own TTL attributes.
    """
    from tasks.core import limits

    seconds = str(int((StackSettings.read().prefect_retention_days or limits.PREFECT_RETENTION_DAYS) * 86400))
    return {
        "PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED": "events,flow_runs,orphans",
        "PREFECT_SERVER_SERVICES_DB_VACUUM_RETENTION_PERIOD": seconds,
        "PREFECT_SERVER_EVENTS_RETENTION_PERIOD": f"PT{seconds}S",  # a plain timedelta here: ISO 8601
    }


def supervisor() -> Supervisor:
    """The supervisord that runs this data folder's stack."""
    return Supervisor(DATA, supervisor_socket(DATA))


def _pid(name: str) -> int | None:
    """The running process of the stack's ``name``: the supervisor's, else (a stack an older `make up` started) the
    one its pid file in .data/run names."""
    pid = supervisor().pid(name)
    if pid is not None:
        return pid
    path = RUN / f"{name}.pid"
    try:
        pid = int(path.read_text())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        path.unlink(missing_ok=True)
        return None


def _wait_port(name: str, port: int, seconds: float = 120) -> None:
    """Wait until ``name`` answers: on ``HOST:port``, or PostgreSQL on its socket."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if postgres_local.answers(port, DATA / "postgres") if name == "postgres" else port_open(HOST, port):
            return
        time.sleep(0.3)
    raise StackError(
        f"{name} did not answer on port {port} within {seconds:.0f} s; see {LOGS / (name + '.log')} and "
        f"{LOGS / 'supervisord.log'}"
    )


PORT_SETTINGS = {  # the setting that moves each program's port
    "dynamodb": "DYNAMODB_LOCAL_PORT",
    "prefect-server": "PREFECT_SERVER_PORT",
    "postgres": "PREFECT_POSTGRES_PORT",
}


def port_holder(port: int) -> int | None:
    """The uid of the socket listening on TCP ``port`` (any address), from the kernel's tables; None if none shows.
    For an error message only: it decides nothing."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                return int(fields[7])
    return None


def _check_port_free(name: str, port: int) -> None:
    """StackError naming the port and the uid that holds it when something already answers on ``port``."""
    if not port_open(HOST, port):
        return
    uid = port_holder(port)
    if uid is None:
        holder = "a program whose user the kernel's tables do not show"
    elif uid == os.getuid():
        holder = f"a program of this user (uid {uid}; an older stack?)"
    else:
        holder = f"another local user (uid {uid})"
    raise StackError(
        f"port {port} is already taken by {holder}, so {name} cannot start: stop it "
        f"(`ss -ltnp 'sport = :{port}'` shows it) or set {PORT_SETTINGS.get(name, 'another port')}."
    )


def dynamodb_reach() -> str:
    """Who can reach the running DynamoDB Local: 'loopback only' or 'every interface'."""
    pid = _pid("dynamodb")
    if pid is None:
        return "not running"
    try:
        isolated = dynamodb_local.isolated(pid)
    except OSError:
        return "reach unknown"
    return "loopback only" if isolated else f"every interface: *:{DYNAMODB_PORT}"


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


def server_db() -> str:
    """The Prefect server's database: ``PREFECT_SERVER_DB`` if set; else the running server's; else "postgres" where
    this machine can run it, "sqlite" otherwise."""
    if SERVER_DB:
        return SERVER_DB
    if _pid("prefect-server"):  # a running server keeps its database (one started before the record: by its postgres)
        recorded = RUN / "prefect-server.database"  # written when it started
        return recorded.read_text().strip() if recorded.exists() else ("postgres" if _pid("postgres") else "sqlite")
    return "sqlite" if postgres_local.missing() else "postgres"


def server_database_env() -> dict[str, str]:
    """The Prefect server's database setting: none for SQLite (its default), the PostgreSQL URL otherwise."""
    database = server_db()
    if database in ("", "sqlite"):
        return {}
    if database in ("postgres", "postgresql"):
        return {"PREFECT_SERVER_DATABASE_CONNECTION_URL": postgres_local.url(POSTGRES_PORT, DATA / "postgres")}
    raise StackError(f"PREFECT_SERVER_DB={database!r}: use 'postgres' (the default where installed) or 'sqlite'")


def start_postgres() -> str:
    """Make the project's PostgreSQL cluster (data in .data/postgres) if the server should use it, for the supervisor
    to run; 'not used', 'ready' or 'failed'. Chosen by default and unable to start (not installed, a private folder as
    root), the server falls back to SQLite, with a WARNING line."""
    global SERVER_DB
    if not server_database_env():
        if not SERVER_DB and (reason := postgres_local.missing()):
            print(
                f'WARNING: the Prefect server runs on SQLite, which reports "database is locked" under the pipelines\' '
                f"load: {reason}"
            )
        return "not used"
    if not SERVER_DB and not (DATA / "postgres").exists() and (DATA / "prefect" / "prefect.db").exists():
        print(
            "note: the Prefect server moves to PostgreSQL (the default where installed); its history so far stays in "
            ".data/prefect/prefect.db (PREFECT_SERVER_DB=sqlite make up to keep using it)"
        )
    from tasks.core.private_folder import open_private_log, private_logs

    try:
        with open_private_log(private_logs(LOGS) / "postgres.log") as log:
            postgres_local.init(DATA / "postgres", log)
    except StackError as error:
        if SERVER_DB:  # asked for by name: no quiet fallback
            raise
        print(
            f"WARNING: PostgreSQL could not start ({error}); the Prefect server runs on SQLite, which reports "
            '"database is locked" under the pipelines\' load'
        )
        SERVER_DB = "sqlite"
        return "failed"
    return "ready"


def prefect_server_env() -> dict[str, str]:
    """What the Prefect server runs with: the stack's endpoints, its database, the retention settings and the auth
    string every API request must carry."""
    auth = api_auth_string()
    return {
        **local_env(),
        **server_database_env(),
        **server_retention_env(),
        **({"PREFECT_SERVER_API_AUTH_STRING": auth} if auth else {}),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # nothing leaves the machine
        # Prefect migrates its own database (PostgreSQL or SQLite) as it starts: an upgrade's new schema, whatever a
        # profile says
        "PREFECT_SERVER_DATABASE_MIGRATE_ON_START": "true",
    }


def serve_prefect_server() -> None:
    """The Prefect server as the supervisor runs it, under ``held_port`` (which keeps the port across restarts): once
    its PostgreSQL answers, the database made if new, then Prefect's app on the handed socket with the stack's TLS
    certificate (what ``prefect server start`` runs in the foreground, with TLS and a socket it did not bind)."""
    env = prefect_server_env()
    if "PREFECT_SERVER_DATABASE_CONNECTION_URL" in env:
        _wait_port("postgres", POSTGRES_PORT)
        postgres_local.ensure_database(POSTGRES_PORT, DATA / "postgres")
    (DATA / "prefect").mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    import uvicorn
    from prefect.server.api.server import create_app
    from prefect.settings import get_current_settings

    from deployments import held_port

    sock = held_port.listening_socket()
    cert, key = stack_tls.certificate_files(secrets_folder())
    server = get_current_settings().server
    config = uvicorn.Config(
        create_app(final=True),
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
        timeout_keep_alive=server.api.keepalive_timeout,
        timeout_graceful_shutdown=10,  # open websockets do not hold a restart past supervisord's stop wait
        log_level=server.logging_level.lower(),
    )
    uvicorn.Server(config).run(sockets=[sock])


def _digest(secret: str) -> str:
    """A short digest of ``secret`` that says whether it changed, and nothing of it."""
    return hashlib.sha256(b"pipelines-config\0" + secret.encode()).hexdigest()[:16]


def _environment(env: dict[str, str]) -> str:
    """``env`` as a supervisord ``environment=`` value (``%`` doubled: the file's interpolation)."""
    return ",".join(f'{key}="{value}"'.replace("%", "%%") for key, value in env.items())


def _command(args: list[str]) -> str:
    return shlex.join(args).replace("%", "%%")


def stack_programs(without: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """The supervisor's programs, in start order: DynamoDB Local, PostgreSQL (when the server uses it), the Prefect
    server, the engine fork server, the worker and the listeners' keeper; ``without`` leaves some out (a benchmark's
    own DynamoDB)."""
    # what each program's own code reads to find this stack (the folder, the ports, the database chosen)
    identity = {
        "PIPELINES_DATA_DIR": str(DATA),
        "DYNAMODB_LOCAL_PORT": str(DYNAMODB_PORT),
        "PREFECT_SERVER_PORT": str(PREFECT_PORT),
        # a counting proxy's port where one is in front (a changed program's environment: restarted by `up`)
        **({"PIPELINES_API_CLIENT_PORT": str(API_CLIENT_PORT)} if API_CLIENT_PORT else {}),
        "PREFECT_POSTGRES_PORT": str(POSTGRES_PORT),
        "PREFECT_SERVER_DB": server_db(),
        "LOCAL_WORK_POOL": WORK_POOL,
        "PYTHONPATH": str(REPO_ROOT),
        # the code's version and commit: new code is a changed program, which `update` restarts on it
        "PIPELINES_CODE": releases.code_identity(),
    }
    programs: dict[str, dict[str, str]] = {}
    if "dynamodb" not in without:
        programs["dynamodb"] = {
            "command": _command(dynamodb_local.private_command(DYNAMODB_PORT, (DATA / "dynamodb").resolve())),
            "directory": str(dynamodb_local.jar_path().parent),
            # the relay's key: the file, re-read at each rotation (a path that never changes, so no restart)
            "environment": _environment(
                {dynamodb_keys.KEYS_FILE_ENV: str(dynamodb_keys_file()), "PIPELINES_CODE": identity["PIPELINES_CODE"]}
            ),
        }
    if server_database_env() and "postgres" not in without:
        programs["postgres"] = {
            "command": _command(postgres_local.command(POSTGRES_PORT, DATA / "postgres")),
            "stopsignal": "INT",  # a fast shutdown: SIGTERM would wait for every client to leave
            **({"user": "postgres"} if os.geteuid() == 0 else {}),  # it refuses to run as root
        }
    # the port is held by a process of its own that starts the server again when it dies: never free for another
    # user while the server restarts
    serve = [sys.executable, "-m", "deployments.local_stack", "serve-server"]
    programs["prefect-server"] = {
        "command": _command([sys.executable, "-m", "deployments.held_port", str(PREFECT_PORT), "--", *serve]),
        # the server reads its auth string from the secrets folder at start; a digest of it here makes a rotation a
        # changed program, which supervisord's `update` restarts (the string itself stays out of the configuration)
        "environment": _environment({**identity, "PIPELINES_API_AUTH_DIGEST": _digest(api_auth_string() or "")}),
        "startsecs": "10",
    }
    # flow runs are forks of the engine fork server (not of the worker): a worker that dies leaves them running
    programs["engine"] = {
        "command": _command([sys.executable, str(FORKSERVER), "serve", engine_socket()]),
        "environment": _environment({**identity, **local_env(), **WORKER_ENV}),
        "startsecs": "5",
    }
    programs["worker"] = {
        "command": _command([sys.executable, "-m", "deployments.local_stack", "worker"]),
        "environment": _environment({**identity, **local_env(), **WORKER_ENV}),
        "startsecs": "10",
        "stopasgroup": "false",  # its flow runs' commands end with their runs, not with the worker
        "killasgroup": "false",
    }
    # the listeners' keeper: a listener run lost in an outage is replaced within LISTENER_CHECK_S
    programs["listeners"] = {
        "command": _command([sys.executable, "-m", "deployments.local_stack", "keep-listeners"]),
        "environment": _environment({**identity, **local_env()}),
        "startsecs": "5",
    }
    return programs


# the programs that hold the stack's data and answer its clients; the others (the engine fork server, the worker, the
# listeners' keeper) run the release's code against them, so `up` starts those only once the data is migrated
STORES = ("dynamodb", "postgres", "prefect-server")


def start_stores(without: tuple[str, ...] = ()) -> dict[str, str]:
    """Start the stores under the stack's supervisor (idempotent; a changed one restarted) and wait until each
    answers. The other programs are taken out meanwhile (stopped where an earlier `up` started them: new code never
    runs on data not yet migrated, old code never during the migration); ``start_consumers`` brings them back. Every
    program -> 'started', or 'running' when it ran before this call."""
    stop_unsupervised()
    stack_tls.certificate_files(secrets_folder())  # the server serves it, `_wait_healthy` and every client pin it
    programs = stack_programs(without)
    before = {info["name"]: info["statename"] for info in supervisor().statuses()}
    for name, port in (("dynamodb", DYNAMODB_PORT), ("prefect-server", PREFECT_PORT)):
        if name in programs and before.get(name) != "RUNNING":
            _check_port_free(name, port)
    RUN.mkdir(parents=True, exist_ok=True)
    (DATA / "dynamodb").mkdir(parents=True, exist_ok=True)
    (RUN / "prefect-server.database").write_text(server_db())
    supervisor().ensure({name: options for name, options in programs.items() if name in STORES})
    if "dynamodb" in programs:
        _wait_port("dynamodb", DYNAMODB_PORT)
    if "postgres" in programs:
        _wait_port("postgres", POSTGRES_PORT)
    _wait_healthy(180)
    return {name: "running" if before.get(name) == "RUNNING" else "started" for name in programs}


def start_consumers(without: tuple[str, ...] = ()) -> None:
    """Put every program back under the supervisor: the engine fork server, the worker and the listeners' keeper
    start on the code of this checkout (the stores, unchanged since ``start_stores``, keep running)."""
    supervisor().ensure(stack_programs(without))


def start_processes(without: tuple[str, ...] = ()) -> dict[str, str]:
    """The stores, then the other programs, with nothing between (a benchmark's stack; `up` migrates between them);
    program -> 'started' or 'running'."""
    states = start_stores(without)
    start_consumers(without)
    return states


def stop_unsupervised() -> None:
    """Stop the processes an older `make up` started without a supervisor (pid files in .data/run)."""
    for name in ("worker", "prefect-server", "postgres", "dynamodb"):
        if (RUN / f"{name}.pid").exists() and supervisor().pid(name) is None:
            _stop_pid_file(name)


@contextlib.contextmanager
def throwaway_prefect_server(home: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A real ``prefect server start`` (UI and services) on a free port with its own SQLite database in ``home``
    (``env`` on top), for tests and benchmarks; its base URL once healthy, and the server stopped on exit."""
    home.mkdir(parents=True, exist_ok=True)
    port = dynamodb_local.free_port()
    server_env = {**os.environ}
    for inherited in (
        "PREFECT_API_URL",
        "PREFECT_API_KEY",
        "PREFECT_API_AUTH_STRING",
        "PREFECT_SERVER_API_AUTH_STRING",
        "PREFECT_SERVER_DATABASE_CONNECTION_URL",
    ):
        server_env.pop(inherited, None)  # the stack's or the user's server is not this one
    server_env |= {
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_API_URL": f"http://{HOST}:{port}/api",  # else the UI asks the default port 4200
        **(env or {}),
    }
    log_path = home / "server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port)],
            env=server_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise StackError(f"the Prefect server did not start: {log_path.read_text()[-2000:]}") from None
                time.sleep(0.5)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def api_ssl_context():
    """An SSL context that trusts the stack's own certificate only (a client's check before it sends the auth
    string)."""
    import ssl

    return ssl.create_default_context(cafile=str(api_certificate()))


def _wait_healthy(seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    context = api_ssl_context()
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{api_url()}/health", timeout=2, context=context) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise StackError("the Prefect server does not answer /api/health; see .data/logs/prefect-server.log")


def ecs_base_job_template() -> dict:
    """prefect-aws's ECS worker default base job template (what `prefect work-pool create --type ecs` gives)."""
    from prefect_aws.workers.ecs_worker import ECSWorker

    return ECSWorker.get_default_base_job_template()


def maintenance_base_job_template() -> dict:
    """The process worker's default base job template, as the AWS maintenance service's worker runs it: flow runs
    start with the image's own interpreter (no local fork server), configured by the service container's env."""
    from prefect.workers.process import ProcessWorker

    return ProcessWorker.get_default_base_job_template()


def aws_work_pools() -> dict[str, tuple[str, dict]]:
    """The pools of the AWS set, which no local worker serves: name -> (type, base job template)."""
    return {
        ECS_WORK_POOL: ("ecs", ecs_base_job_template()),
        MAINTENANCE_WORK_POOL: ("process", maintenance_base_job_template()),
    }


def engine_socket() -> str:
    """The worker's engine fork server socket: in this user's private runtime folder (0700; a Unix socket path is
    at most 107 bytes, so not under the checkout), one per data folder, so two stacks on a machine keep apart."""
    import hashlib

    from tasks.core.private_folder import runtime_folder

    digest = hashlib.sha256(str(DATA.resolve()).encode()).hexdigest()[:12]
    return str(runtime_folder() / f"engine-{digest}.sock")


def engine_command() -> str:
    """How the local worker starts a flow run: a fork of the fork server beside the worker (Prefect imported once,
    ``deployments/engine_forkserver.py``), else this interpreter's Prefect engine directly.

    With no command, Prefect 3.8's process worker starts a workspace supervisor that runs the pull steps and then
    execs a second interpreter for the engine: two Python starts and two imports of Prefect before the flow runs
    (seconds a user waits for every `deployment run`). The engine runs the pull steps itself.
    """
    return shlex.join([sys.executable, str(FORKSERVER), "run", engine_socket()])


def process_base_job_template() -> dict:
    """The process worker's default base job template, with ``engine_command()`` as the default command."""
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    template["variables"]["properties"]["command"]["default"] = engine_command()
    return template


def _command_default(template: dict) -> str | None:
    return ((template or {}).get("variables", {}).get("properties", {}).get("command") or {}).get("default")


def create_work_pools(client) -> dict[str, str]:
    """The local process pool (its flow runs started by ``engine_command()``) and the AWS set's pools (the ECS
    worker's template, the maintenance pool's process template; no worker locally, so `prefect deploy --name ecs`
    finds them); a pool an older `make up` made gets the template."""
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    states = {}
    for pool, (kind, template) in {WORK_POOL: ("process", process_base_job_template()), **aws_work_pools()}.items():
        try:
            existing = client.read_work_pool(pool)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=pool, type=kind, base_job_template=template))
            states[pool] = "created"
            continue
        outdated = pool == WORK_POOL and _command_default(existing.base_job_template) != engine_command()
        if not existing.base_job_template or outdated:  # made by an older `make up` (or another interpreter)
            client.update_work_pool(pool, WorkPoolUpdate(base_job_template=template))
            states[pool] = "template set"
        else:
            states[pool] = "exists"
    return states


def ensure_work_pools() -> dict[str, str]:
    """The local process pool (served by `make up`'s worker) and the AWS set's pools (ECS, maintenance)."""
    os.environ.update(local_env())
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return create_work_pools(client)


def drop_stale_tag_limits() -> list[str]:
    """Delete the task concurrency limits a server may hold for tags the flows do not use (CPU-heavy work holds
    the machine's CPU slots, ``limits.cpu_slot``); the tags deleted."""
    os.environ.update(local_env())
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from tasks.core import limits

    dropped = []
    with get_client(sync_client=True) as client:
        for tag in (limits.CPU_HEAVY_TAG,):
            try:
                client.delete_concurrency_limit_by_tag(tag)
            except ObjectNotFound:
                continue
            dropped.append(tag)
    return dropped


# the worker asks for due runs every second (Prefect's default: 10 s), so a `deployment run` starts within one
WORKER_ENV = {"PREFECT_WORKER_QUERY_SECONDS": "1"}


def crash_runs_of_gone_processes(client) -> list[str]:
    """Mark Crashed the local pool's runs whose process is gone: Running or Pending with a recorded pid that no
    longer runs here, or Pending with none (claimed by a worker that died before starting it). Nobody else reports
    them once their worker is dead, and a Running listener holds its deployment's one slot, so without this no
    trigger would replace it. The names of the runs marked."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    live = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING]))
    )
    runs = client.read_flow_runs(
        flow_run_filter=live, work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[WORK_POOL]))
    )
    marked = []
    for run in runs:
        if run.deployment_id is None:
            continue  # an in-process subflow: it lives and dies with its parent's process
        process = run_process(run)
        gone = process == "gone" or (process == "unknown" and run.state_type == StateType.PENDING)
        if not gone:
            continue
        crashed = Crashed(
            message="its process is gone with the worker that ran it (found when the worker started again)"
        )
        if client.set_flow_run_state(run.id, crashed).status.value != "ACCEPT":
            client.set_flow_run_state(run.id, crashed, force=True)
        marked.append(run.name)
    return marked


def run_worker() -> None:
    """The local worker as the supervisor starts it, first or again: the runs the last worker left without
    a process are marked Crashed (their triggers replace the listeners among them), then ``prefect worker start``
    takes this process over."""
    os.environ.update(local_env())
    try:
        from prefect.client.orchestration import get_client

        _wait_healthy(120)  # the supervisor starts it beside the server
        with get_client(sync_client=True) as client:
            marked = crash_runs_of_gone_processes(client)
        if marked:
            print(f"worker: marked Crashed, their processes gone: {', '.join(marked)}", flush=True)
    except Exception as error:  # noqa: BLE001 - the worker starts anyway; the next start looks again
        print(f"worker: could not look for runs without a process ({type(error).__name__}: {error})", flush=True)
    worker = [sys.executable, "-m", "prefect", "worker", "start", "--pool", WORK_POOL, "--type", "process"]
    os.execv(sys.executable, worker)


def _run_pid(infrastructure_pid: str | None) -> int | None:
    """The process id a worker recorded for a run (``[host:]pid``), or None."""
    try:
        return int(str(infrastructure_pid).rsplit(":", 1)[-1])
    except ValueError:
        return None


def _recorded_elsewhere(infrastructure_pid: str | None) -> bool:
    """Whether a run's ``host:pid`` names another machine (a bare pid is this machine's: Prefect 3.8's process
    worker records one)."""
    host = str(infrastructure_pid or "").rpartition(":")[0]
    return bool(host) and host not in {socket.gethostname(), socket.gethostname().split(".")[0], "localhost"}


# a run's process starts before its Running state (or its recorded pid) is written; this much later (clocks read
# in 10 ms steps) and it is another process that reuses the pid
PID_REUSE_SLACK_S = 0.5


def run_process(run) -> str:
    """What became of a Pending or Running run's process, judged from this machine: 'alive', 'gone' (no such
    process, or its pid now names a process that started after the run did), 'elsewhere' (recorded on another
    host: not this machine's to judge) or 'unknown' (no pid recorded)."""
    from prefect.client.schemas.objects import StateType

    from tasks.core.processes import pid_alive, process_started_at

    if _recorded_elsewhere(run.infrastructure_pid):
        return "elsewhere"
    pid = _run_pid(run.infrastructure_pid)
    if pid is None:
        return "unknown"
    if not pid_alive(pid):
        return "gone"
    started_at = process_started_at(pid)
    # Running: the process set that state, so it started before; Pending: the worker recorded its pid (the run's
    # last update at the latest) after starting it
    run_began = run.state.timestamp if run.state_type == StateType.RUNNING and run.state else run.updated
    if started_at is not None and run_began is not None and started_at > run_began.timestamp() + PID_REUSE_SLACK_S:
        return "gone"
    return "alive"


def listener_deployments() -> tuple[str, ...]:
    """The local listener deployments, one per registered landing (``flow/local``)."""
    from tasks.core import registry

    return tuple(f"{landing.flow}/local" for landing in registry.landings().values())


def _listener_runs(client, state_types: list) -> dict[str, tuple]:
    """Each deployed listener -> (its deployment, its runs in ``state_types``); names not deployed are left out.
    Three API calls for every listener together (the keeper asks every 30 s: Prefect Cloud counts each request)."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        DeploymentFilterName,
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )

    wanted = {tuple(name.split("/", 1)): name for name in listener_deployments()}
    flows = {
        flow.id: flow.name
        for flow in client.read_flows(flow_filter=FlowFilter(name=FlowFilterName(any_=[f for f, _ in wanted])))
    }
    deployments = {
        name: deployment
        for deployment in client.read_deployments(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=sorted({d for _, d in wanted}))),
            flow_filter=FlowFilter(name=FlowFilterName(any_=[f for f, _ in wanted])),
        )
        if (name := wanted.get((flows.get(deployment.flow_id), deployment.name)))
    }
    runs = (
        client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[d.id for d in deployments.values()])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=state_types))),
        )
        if deployments
        else []
    )
    return {
        name: (deployment, [run for run in runs if run.deployment_id == deployment.id])
        for name, deployment in deployments.items()
    }


def start_listeners(client, worker_restarted: bool) -> dict[str, str]:
    """One run of each deployed listener unless one is scheduled, pending or running (never two at once);
    a run whose process is gone (or, with no pid, whose worker was just restarted) is marked Crashed and
    replaced. Listener -> 'started', 'running', 'restarted' or 'not deployed'."""
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    found = _listener_runs(client, [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING])
    states = {name: "not deployed" for name in listener_deployments()}
    for name, (deployment, runs) in found.items():
        processes = {r.id: run_process(r) if r.state_type != StateType.SCHEDULED else "alive" for r in runs}
        dead = [r for r in runs if processes[r.id] == "gone" or (processes[r.id] == "unknown" and worker_restarted)]
        for run in dead:
            crashed = Crashed(message="the listener's process is gone (found by `make up`); a new run replaces it")
            if client.set_flow_run_state(run.id, crashed).status.value != "ACCEPT":
                client.set_flow_run_state(run.id, crashed, force=True)
        if len(runs) > len(dead):
            states[name] = "running"
            continue
        client.create_flow_run_from_deployment(deployment.id)
        states[name] = "restarted" if dead else "started"
    return states


def ensure_listeners(worker_restarted: bool) -> dict[str, str]:
    """``start_listeners`` against the local server."""
    os.environ.update(local_env())
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return start_listeners(client, worker_restarted)


# how often the supervisor's `listeners` program makes sure every listener has a run
LISTENER_CHECK_S = 30.0


def keep_listeners() -> None:
    """The listeners' keeper, as the supervisor runs it: every ``LISTENER_CHECK_S`` s, ``ensure_listeners`` (a run of
    each listener deployment unless one is scheduled, pending or running; one whose process is gone replaced). A
    listener run that died while the server was down (its Crashed event lost with it, so no trigger fired) is
    replaced without a person typing `make up`; an unreachable server is waited out."""
    last: dict[str, str] = {}
    while True:
        try:
            _wait_healthy(LISTENER_CHECK_S)
            states = ensure_listeners(worker_restarted=False)
            changed = {name: state for name, state in states.items() if state != "running" and last.get(name) != state}
            if changed:
                print(f"listeners: {', '.join(f'{n} {s}' for n, s in sorted(changed.items()))}", flush=True)
            last = states
        except Exception as error:  # noqa: BLE001 - the next round looks again; the keeper never dies of an outage
            print(f"listeners: not checked ({type(error).__name__}: {error})", flush=True)
        time.sleep(LISTENER_CHECK_S)


def stop_listeners() -> dict[str, str]:
    """Stop the listeners' processes (their runs marked Cancelled) before the worker goes: a flow process may
    outlive its worker. Listener -> 'stopped' or 'not running'; {} when the server is already down."""
    if not (_pid("prefect-server") and port_open(HOST, PREFECT_PORT)):
        return {}
    os.environ.update(local_env())
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled

    states = {}
    with get_client(sync_client=True) as client:
        for name, (_deployment, runs) in _listener_runs(client, [StateType.PENDING, StateType.RUNNING]).items():
            states[name] = "stopped" if runs else "not running"
            for run in runs:
                if run_process(run) == "alive":  # never a process that took over a dead run's pid
                    os.kill(_run_pid(run.infrastructure_pid), signal.SIGTERM)
                client.set_flow_run_state(run.id, Cancelled(message="stopped by `make down`"), force=True)
    return states


def register_block_types() -> list[str]:
    """What `prefect block register -m blocks` does, in this process (no second Prefect import): the block types and
    schemas of ``blocks``; their names."""
    import inspect

    from prefect.blocks.core import Block, InvalidBlockRegistration

    import blocks

    registered = []
    for _, cls in inspect.getmembers(blocks):
        if cls is not None and Block.is_block_class(cls):
            try:
                cls.register_type_and_schema()
            except InvalidBlockRegistration:  # an abstract base: the CLI skips it too
                continue
            registered.append(cls.get_block_type_name())
    return registered


def ensure_tables_and_blocks() -> dict[str, str]:
    """Create or check every table, register the blocks and save their defaults; table -> 'created'/'exists'."""
    os.environ.update(local_env())
    from blocks import DynamoTables, ObjectStorage, load_config
    from tasks.core import registry, state_store
    from tasks.core.config import table_names
    from tasks.core.tables import ensure_tables

    state_store.reset_clients()
    result = ensure_tables(registry.table_specs(), table_names())
    register_block_types()
    # save the defaults so the UI shows (and a person can edit) the configuration the flows use
    load_config(DynamoTables).save("default", overwrite=True)
    from blocks.health import HealthThresholds

    load_config(HealthThresholds).save("default", overwrite=True)  # the alarms' thresholds, editable in the UI
    ObjectStorage(base_url=local_env()["OBJECT_STORE_BASE_URL"]).save("default", overwrite=True)
    return result


# The set `make up`'s worker serves: every deployment named "local" (the AWS set: "ecs"). Not the pattern '*/local':
# prefect 3.8 deploys each deployment a pattern matches once per match (24 x 24 deploys, ~4 min instead of ~13 s).
LOCAL_DEPLOYMENTS = "local"


def retire_unserved_deployments(client) -> tuple[int, int]:
    """Delete the AWS pools' deployments (ECS, maintenance) an older `make up` put on this local server, and their
    waiting runs.

    Nothing serves those pools locally, so their schedules and triggers only piled up Late runs; runs that
    already started or ended stay (their history is the UI's). Returns (deployments, runs) deleted.
    """
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
    )
    from prefect.client.schemas.objects import StateType

    unserved = client.read_deployments(
        work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[*aws_work_pools()]))
    )
    waiting = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED, StateType.PENDING]))
    )
    runs = 0
    for deployment in unserved:
        only_this = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
        while batch := client.read_flow_runs(deployment_filter=only_this, flow_run_filter=waiting, limit=200):
            for run in batch:
                client.delete_flow_run(run.id)
            runs += len(batch)
        client.delete_deployment(deployment.id)
    return len(unserved), runs


# what the last deploy was made from; `up` deploys again only when it changed (or the server lost a deployment)
DEPLOYED = RUN / "deployed.json"
DEPLOYED_FROM = ("flows", "tasks", "blocks")  # the code a deployment's parameter schema and entrypoint come from


def deployment_fingerprint() -> str:
    """A digest of what `prefect deploy` reads: prefect.yaml, the Python files of ``DEPLOYED_FROM``, the stack's env."""
    # not the secrets `make up` rotates each time (no deployment carries them)
    rotated = {"PREFECT_API_AUTH_STRING", *dynamodb_key_env()}
    deployed_env = {name: value for name, value in local_env().items() if name not in rotated}
    digest = hashlib.sha256(json.dumps(deployed_env, sort_keys=True).encode())
    files = [REPO_ROOT / "prefect.yaml"] + sorted(p for part in DEPLOYED_FROM for p in (REPO_ROOT / part).rglob("*.py"))
    for path in files:
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def deployed_unchanged(client, fingerprint: str) -> bool:
    """The last deploy was made from ``fingerprint`` and every deployment it made is still on the server."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    try:
        recorded = json.loads(DEPLOYED.read_text())
    except (OSError, ValueError):
        return False
    ids = recorded.get("deployment_ids") or []
    if recorded.get("fingerprint") != fingerprint or not ids:
        return False
    found = client.read_deployments(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=ids)), limit=len(ids) + 1
    )
    return len(found) == len(ids)


def record_deployed(client, fingerprint: str) -> None:
    """Remember ``fingerprint`` and the ids of the deployments on the local pool, for the next `up`."""
    from prefect.client.schemas.filters import WorkPoolFilter, WorkPoolFilterName

    deployments = client.read_deployments(work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[WORK_POOL])))
    RUN.mkdir(parents=True, exist_ok=True)
    DEPLOYED.write_text(
        json.dumps({"fingerprint": fingerprint, "deployment_ids": sorted(str(d.id) for d in deployments)})
    )


def deploy_all() -> str:
    """Deploy the local set from prefect.yaml unless nothing it is made from changed, and retire AWS deployments
    an older version left; says what was done."""
    if not (REPO_ROOT / "prefect.yaml").exists():
        return "skipped (no prefect.yaml)"
    os.environ.update(local_env())
    from prefect.client.orchestration import get_client

    fingerprint = deployment_fingerprint()
    with get_client(sync_client=True) as client:
        if deployed_unchanged(client, fingerprint):
            return (
                f"unchanged (prefect.yaml and the code as deployed; delete {DEPLOYED.name} in {RUN} to deploy anyway)"
            )
    DEPLOYED.unlink(missing_ok=True)  # a deploy cut short is done again next time
    _prefect("--no-prompt", "deploy", "--name", LOCAL_DEPLOYMENTS, quiet=True)
    with get_client(sync_client=True) as client:
        retired, runs = retire_unserved_deployments(client)
        record_deployed(client, fingerprint)
    note = f"; retired {retired} AWS deployment(s) and {runs} waiting run(s) an older version left" if retired else ""
    return f"deployed (prefect deploy --name '{LOCAL_DEPLOYMENTS}'){note}"


def write_env_file() -> None:
    """Write .data/local.env (0600: it holds the API's auth string): ``export`` lines of ``local_env()`` for a shell
    to source."""
    DATA.mkdir(parents=True, exist_ok=True)
    fd = os.open(ENV_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # one an older `make up` wrote readable
    with os.fdopen(fd, "w") as handle:
        handle.write("".join(f"export {k}={shlex.quote(v)}\n" for k, v in local_env().items()))


def up() -> None:
    """Start the whole local stack under its supervisor (idempotent) and print each part's state."""
    dynamodb_local.java()
    dynamodb_local.jar_path()
    for line in releases.upgrade_notice(DATA):  # data another release wrote: which, and the CHANGELOG's steps
        print(line, flush=True)
    # a new API auth string and DynamoDB key at every `make up`: the programs whose environment holds them restart
    # with them; flow runs in flight finish their DynamoDB work with the previous key (accepted for its grace period)
    rotate_api_auth_string()
    dynamodb_keys.rotate(dynamodb_keys_file())
    launch_key(create=True)  # kept: rows in flight carry seals made with it
    database = start_postgres()
    # the stores first, then the data made current (tables and their indexes, blocks, migrations, deployments), and
    # only then the programs that run this code against it
    processes = start_stores()
    print(
        f"dynamodb-local   {processes['dynamodb']:8} http://{HOST}:{DYNAMODB_PORT}  (data in .data/dynamodb; "
        f"{dynamodb_reach()})"
    )
    print(
        f"postgres         {processes.get('postgres', database):8} "
        + (
            f"socket only, in .data/postgres (0700; port {POSTGRES_PORT})"
            if server_database_env()
            else "(the server runs on SQLite)"
        )
    )
    print(
        f"prefect-server   {processes['prefect-server']:8} {api_url()}  (TLS, {api_certificate()}; database: "
        f"{'PostgreSQL' if server_database_env() else 'SQLite'})"
    )
    for pool, state in ensure_work_pools().items():
        print(f"work pool        {state:8} {pool}")
    for table, state in ensure_tables_and_blocks().items():
        print(f"table            {state:8} {table}")
    from tasks.core.migrations import upgrade_data  # after the tables: the release's migrations, the store's layout

    print("\n".join(upgrade_data()))
    register_extras()
    for tag in drop_stale_tag_limits():
        print(f"task limit       dropped  tag {tag!r} (CPU-heavy tasks hold this machine's CPU slots instead)")
    print(f"deployments      {deploy_all()}")
    start_consumers()
    print(f"engine           {processes['engine']:8} {engine_socket()}")
    print(f"worker           {processes['worker']:8} pool {WORK_POOL}")
    for listener, state in ensure_listeners(worker_restarted=processes["worker"] == "started").items():
        print(f"listener         {state:8} {listener}")
    print(f"listener keeper  {processes['listeners']:8} (a run of each listener, checked every {LISTENER_CHECK_S:g} s)")
    write_env_file()
    releases.write_stamp(DATA)
    print(f"release          v{releases.VERSION} (stamped in {DATA / releases.STAMP_NAME})")
    print(
        "\nUse it from a shell with:  source "
        f"{os.path.relpath(ENV_FILE, REPO_ROOT) if ENV_FILE.is_relative_to(REPO_ROOT) else ENV_FILE}"
    )
    print(f"Prefect UI: https://{HOST}:{PREFECT_PORT} (the stack's own certificate: {api_certificate()})")
    print(f"Supervised by supervisord: `make status`; logs in {LOGS}")


def register_extras() -> None:
    """Each registered pipeline's own setup for the local stack: ``local_setup()`` in its ``deployments/ops/<name>.py``
    where it defines one (the GPU pipeline's local nodes), each result printed on its own line."""
    from deployments import pipeline_module
    from tasks.core import registry

    for declared in registry.pipelines():
        setup = getattr(pipeline_module("deployments.ops", declared.name), "local_setup", None)
        for label, result in (setup() if setup is not None else {}).items():
            print(f"{label:16} {result}")


def _stop_pid_file(name: str) -> str:
    """Stop a process an older `make up` started and recorded in .data/run (its process group)."""
    path = RUN / f"{name}.pid"
    try:
        pid = int(path.read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        path.unlink(missing_ok=True)
        return "stopped"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return "stopped now"


def _stop(name: str) -> str:
    """Stop the stack's ``name``: the supervisor's program, or a process an older `make up` recorded."""
    supervised = supervisor().stop(name)
    return "stopped now" if "stopped now" in (supervised, _stop_pid_file(name)) else "stopped"


def down() -> None:
    """Stop the listeners (their keeper first), then every process of the stack and its supervisor, printing each
    one's state."""
    print(f"{'listeners':16} {_stop('listeners')} (the keeper)")
    for listener, state in stop_listeners().items():
        print(f"{listener:16} {state}")
    for name in ("worker", "engine", "prefect-server", "postgres", "dynamodb"):
        state = _stop(name)
        # its lock file names the postmaster that runs, whoever started it and however often
        if name == "postgres" and postgres_local.stop(DATA / "postgres") == "stopped now":
            state = "stopped now"
        print(f"{name:16} {state}")
    print(f"{'supervisord':16} {'stopped now' if supervisor().shutdown() else 'stopped'}")


def status() -> None:
    """Print each process of the stack with its state, pid and uptime (the supervisor's word)."""
    statuses = supervisor().statuses()
    if not statuses:
        print("supervisord      stopped (`make up` starts the stack)")
        return
    print(f"supervisord      running  (socket {supervisor().socket_path}; log {LOGS / 'supervisord.log'})")
    for info in statuses:
        name, state = info["name"], info["statename"]
        detail = f"pid {info['pid']}, up {uptime(info)}" if state == "RUNNING" else info["description"]
        reach = f" ({dynamodb_reach()})" if name == "dynamodb" and state == "RUNNING" else ""
        print(f"{name:16} {state.lower():8} {detail}{reach}")


def main() -> int:
    """The ``up|down|status|worker|serve-server|keep-listeners`` command line (the last three: what the supervisor
    runs); exit code 2 on a StackError."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", "worker", "serve-server", "keep-listeners"])
    args = parser.parse_args()
    try:
        commands = {
            "up": up,
            "down": down,
            "status": status,
            "worker": run_worker,
            "serve-server": serve_prefect_server,
            "keep-listeners": keep_listeners,
        }
        commands[args.command]()
    except StackError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
