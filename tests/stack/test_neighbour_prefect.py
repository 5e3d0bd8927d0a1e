"""The Prefect API's door against another local user (``nobody``): the port is never free while the server restarts,
and a client of the stack sends its auth string only to a server that proves itself with the stack's certificate.

The whole-stack checks (the auth string rotated by `up`, the port held through a SIGKILL of the supervised server)
are in tests/stack/test_stack_service.py."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deployments import dynamodb_local, held_port, local_stack, stack_tls
from tests.helpers.other_user import as_nobody_python

REPO_ROOT = Path(__file__).resolve().parents[2]

# a server that answers each connection with its own pid (accepting on the socket the holder hands it)
ANSWER_PID = (
    "import os\n"
    "from deployments.held_port import listening_socket\n"
    "sock = listening_socket()\n"
    "while True:\n"
    "    conn, _ = sock.accept()\n"
    "    conn.sendall(str(os.getpid()).encode())\n"
    "    conn.close()\n"
)


def _ask_pid(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        return int(conn.recv(64))


def _nobody_binds(port: int) -> str:
    """What ``nobody`` gets when it tries to bind and listen on ``port``: 'bound' or the errno."""
    code = (
        "import socket\ntry:\n"
        f"    s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); print('bound')\n"
        "except OSError as error:\n    print(error.errno)\n"
    )
    return as_nobody_python(code).stdout.strip()


def _hold(port: int, server: str) -> subprocess.Popen:
    """A holder of ``port`` running ``server`` (python code), once it listens."""
    holder = subprocess.Popen(
        [sys.executable, "-m", "deployments.held_port", str(port), "--", sys.executable, "-c", server],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert holder.stdout.readline().strip() == f"held_port: listening on 127.0.0.1:{port}"
    return holder


def test_the_port_stays_held_while_its_server_restarts(tmp_path):
    port = dynamodb_local.free_port()
    holder = _hold(port, ANSWER_PID)
    try:
        first = _ask_pid(port)
        os.kill(first, signal.SIGKILL)
        # while no server runs, the port is still listened on: another user cannot take it, and a caller waits in
        # the backlog for the next server rather than being refused
        assert _nobody_binds(port) == "98"  # EADDRINUSE
        second = _ask_pid(port)
        assert second != first
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(timeout=30) == 0
        assert not dynamodb_local.port_open("127.0.0.1", port)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=30)


# a server that, told to stop, closes its listening socket at once and then takes its time (uvicorn's graceful
# shutdown: open connections finish)
SLOW_TO_STOP = (
    "import os, signal, time\n"
    "from deployments.held_port import listening_socket\n"
    "sock = listening_socket()\n"
    "def stop(*_):\n"
    "    sock.close(); time.sleep(8); os._exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "while True:\n"
    "    try:\n"
    "        conn, _ = sock.accept()\n"
    "    except OSError:\n"
    "        time.sleep(1); continue\n"
    "    conn.sendall(str(os.getpid()).encode())\n"
    "    conn.close()\n"
)


def test_a_restarted_holder_takes_its_port_back_at_once_and_still_shares_it_with_nobody():
    """An upgrade restarts the holder itself: the new one binds while the old server still shuts down and its closed
    connections sit in TIME_WAIT, and a neighbour's SO_REUSEADDR does not get it beside a listening holder."""
    port = dynamodb_local.free_port()
    old = _hold(port, SLOW_TO_STOP)
    new = None
    try:
        for _ in range(3):
            _ask_pid(port)  # each closed by the server: TIME_WAIT on the port's side
        code = (
            "import socket\ntry:\n"
            "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"    s.bind(('127.0.0.1', {port})); s.listen(); print('bound')\n"
            "except OSError as error:\n    print(error.errno)\n"
        )
        assert as_nobody_python(code).stdout.strip() == "98"  # EADDRINUSE beside the listening holder
        old.send_signal(signal.SIGTERM)
        time.sleep(1)
        assert old.poll() is None  # its server is still stopping
        new = _hold(port, ANSWER_PID)
        assert _ask_pid(port) != 0
        assert old.wait(timeout=30) == 0
    finally:
        for holder in (old, new):
            if holder is not None and holder.poll() is None:
                holder.kill()
            if holder is not None:
                holder.wait(timeout=30)


def test_a_port_taken_first_is_refused_not_shared():
    port = dynamodb_local.free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        result = subprocess.run(
            [sys.executable, "-m", "deployments.held_port", str(port), "--", "true"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == held_port.PORT_TAKEN
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


class Squatter:
    """A server another user might run on the API's port: TLS under a certificate of its own (``tls``), or plain
    TCP; it keeps every byte a client sends it."""

    def __init__(self, folder: Path, tls: bool) -> None:
        self.port = dynamodb_local.free_port()
        self.sock = held_port.bind_and_listen(self.port)
        self.received = b""
        self.context = None
        if tls:
            cert, key = stack_tls.certificate_files(folder)
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(cert, key)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                if self.context is not None:
                    conn = self.context.wrap_socket(conn, server_side=True)
                conn.settimeout(5)
                while data := conn.recv(65536):
                    self.received += data
            except (OSError, ssl.SSLError):
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("tls", [True, False], ids=["tls-own-certificate", "plain"])
def test_a_client_of_the_stack_sends_its_auth_string_only_to_the_stack(tmp_path, monkeypatch, tls):
    """A Prefect client configured as every process of the stack is (``local_env``) meets a squatter on the API's
    port: it refuses the squatter's TLS (or plain TCP) before sending anything the squatter could reuse."""
    squatter = Squatter(tmp_path / "squatter", tls)
    data = tmp_path / "data"
    monkeypatch.setattr(local_stack, "DATA", data)
    monkeypatch.setattr(local_stack, "PREFECT_PORT", squatter.port)
    local_stack.rotate_api_auth_string()
    stack_tls.certificate_files(local_stack.secrets_folder())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        **local_stack.local_env(),
        "PREFECT_CLIENT_MAX_RETRIES": "0",
        "PYTHONPATH": str(REPO_ROOT),
    }
    client = (
        "import asyncio\nfrom prefect.client.orchestration import get_client\n"
        "async def main():\n    async with get_client() as client:\n        await client.read_flow_runs(limit=1)\n"
        "asyncio.run(main())\n"
    )
    try:
        result = subprocess.run([sys.executable, "-c", client], env=env, capture_output=True, text=True, timeout=120)
    finally:
        squatter.close()
    assert result.returncode != 0
    assert "httpx.ConnectError" in result.stderr, result.stderr[-2000:]
    assert not tls or "CERTIFICATE_VERIFY_FAILED" in result.stderr, result.stderr[-2000:]
    secret = local_stack.api_auth_string().split(":", 1)[1]
    assert b"Authorization" not in squatter.received and secret.encode() not in squatter.received
    assert b"flow_runs" not in squatter.received


def test_each_up_rotates_the_auth_string(tmp_path, monkeypatch):
    monkeypatch.setattr(local_stack, "DATA", tmp_path / "data")
    seen = {local_stack.rotate_api_auth_string() for _ in range(3)}
    assert len(seen) == 3 and local_stack.api_auth_string() in seen
    secrets = local_stack.secrets_folder()
    assert {oct(path.stat().st_mode & 0o777) for path in secrets.iterdir()} == {"0o600"}
    assert oct(secrets.stat().st_mode & 0o777) == "0o700"


def test_the_stack_certificate_is_made_once_and_kept(tmp_path):
    first = [path.read_bytes() for path in stack_tls.certificate_files(tmp_path / "secrets")]
    time.sleep(0.01)
    again = [path.read_bytes() for path in stack_tls.certificate_files(tmp_path / "secrets")]
    assert first == again
    cert, key = stack_tls.certificate_files(tmp_path / "secrets")
    context = ssl.create_default_context(cafile=str(cert))  # the certificate is its own trust anchor
    assert context.cert_store_stats()["x509_ca"] == 1
    assert oct(key.stat().st_mode & 0o777) == "0o600"


def test_a_rotated_auth_string_restarts_the_server_and_stays_out_of_its_configuration(tmp_path, monkeypatch):
    """supervisord restarts a program whose configuration changed (`make up`'s `update`): a rotation changes the
    server's (by a digest), so the server comes back with the new string; the string itself is not written there."""
    monkeypatch.setattr(local_stack, "DATA", tmp_path / "data")
    configured = []
    for _ in range(2):
        auth = local_stack.rotate_api_auth_string()
        server = local_stack.stack_programs(without=("dynamodb", "postgres"))["prefect-server"]
        assert auth not in str(server) and auth.split(":", 1)[1] not in str(server)
        configured.append(server)
    assert configured[0] != configured[1]
