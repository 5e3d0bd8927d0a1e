"""Who can reach the local stack: DynamoDB Local answers on loopback and not on the machine's other addresses."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from deployments import dynamodb_local, local_stack
from tests.helpers.other_user import as_nobody_python, as_nobody_run


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than 127.0.0.0/8 (the one its default route uses), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing address
        except OSError:
            return None
        address = sock.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def answers(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is accepted within a second."""
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


def _stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=20)


@pytest.fixture
def address():
    found = non_loopback_address()
    if found is None:
        pytest.skip("this machine has no non-loopback IPv4 address to test from")
    return found


def test_dynamodb_local_answers_on_loopback_only(address, tmp_path, capsys):
    """``start_private``, as `make up`, the tests and the benchmarks start it; ``stop`` ends relay, namespace, jar."""
    port = dynamodb_local.free_port()
    process = dynamodb_local.start_private(port, db_path=None, log_path=tmp_path / "dynamodb.log")
    try:
        warning = capsys.readouterr().out
        if "cannot be kept to loopback here" in warning:
            pytest.skip(f"no private network namespace here: {warning.strip()}")
        assert warning == "" and dynamodb_local.isolated(process.pid)
        client = boto3.client(
            "dynamodb",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",  # signed with the session's key (the environment's): the relay checks it
        )
        client.create_table(
            TableName="reach",
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        assert client.list_tables()["TableNames"] == ["reach"]
        assert not answers(address, port), f"DynamoDB Local answers on {address}:{port}"
    finally:
        dynamodb_local.stop(process)
    assert not answers("127.0.0.1", port)  # stopping the relay stopped the jar and its namespace


def test_the_test_sessions_dynamodb_local_answers_on_loopback_only(address, dynamodb_endpoint, tmp_path):
    """The DynamoDB Local every other test uses (conftest's, or the one AWS_ENDPOINT_URL_DYNAMODB named)."""
    from urllib.parse import urlparse

    port = urlparse(dynamodb_endpoint).port
    assert answers("127.0.0.1", port)
    if answers(address, port):
        try:  # exposed: acceptable only where this machine cannot isolate it (start_private said so in a WARNING)
            dynamodb_local.stop(
                dynamodb_local.start(dynamodb_local.free_port(), None, tmp_path / "probe.log", loopback_only=True)
            )
        except dynamodb_local.CannotIsolate as error:
            pytest.skip(f"no private network namespace here: {error}")
        pytest.fail(f"the test session's DynamoDB Local answers on {address}:{port}")


def test_without_isolation_the_jar_answers_on_every_interface(address, tmp_path):
    """The control: what the test above guards against is real on this machine."""
    port = dynamodb_local.free_port()
    process = dynamodb_local.start(port, db_path=None, log_path=tmp_path / "dynamodb.log")
    try:
        assert answers(address, port) and not dynamodb_local.isolated(process.pid)
    finally:
        dynamodb_local.stop(process)


def test_make_up_says_plainly_when_it_cannot_isolate(monkeypatch, capsys):
    from deployments import loopback_ns

    monkeypatch.setattr(loopback_ns, "cannot_isolate", lambda: "unshare: EPERM")
    monkeypatch.setattr(local_stack, "server_database_env", lambda: {})
    programs = local_stack.stack_programs()  # what `make up` hands its supervisor
    out = capsys.readouterr().out
    assert "loopback_ns.py" not in programs["dynamodb"]["command"]
    assert "WARNING: DynamoDB Local cannot be kept to loopback here (loopback_ns: cannot make" in out
    assert "any host that reaches this machine can read and change every pipeline's state" in out
    monkeypatch.setattr(loopback_ns, "cannot_isolate", lambda: None)
    assert "loopback_ns.py" in local_stack.stack_programs()["dynamodb"]["command"]
    assert capsys.readouterr().out == ""


def test_the_prefect_servers_postgresql_answers_on_its_socket_only_and_refuses_another_local_user(address):
    import asyncio
    import shutil
    import tempfile

    from deployments import postgres_local

    try:
        postgres_local.bindir()
    except dynamodb_local.StackError as error:
        pytest.skip(str(error))
    folder = Path(tempfile.mkdtemp(prefix="pg-reach-"))  # under /tmp: the `postgres` user (as root) can reach it
    folder.chmod(0o755)
    port = dynamodb_local.free_port()
    data = folder / "pg"
    try:
        process = postgres_local.start(port, data, folder / "pg.log")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        import asyncpg

        async def one() -> int:
            connection = await asyncpg.connect(host=str(data), port=port, user="prefect", database="prefect")
            try:
                return await connection.fetchval("select 1")
            finally:
                await connection.close()

        assert asyncio.run(one()) == 1
        assert not answers("127.0.0.1", port) and not answers(address, port)  # no TCP address at all
        assert "host" not in (data / "pg_hba.conf").read_text().replace("#", "\n#").split("\n#")[0]
        socket_file = postgres_local.socket_path(port, data)
        knock = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(socket_file)!r})\nprint('connected')"
        assert "PermissionError" in as_nobody_python(knock).stderr  # refused at the 0700 folder, psql or not
        psql = shutil.which("psql")
        if psql:
            refused = as_nobody_run([psql, "-h", str(data), "-p", str(port), "-U", "prefect", "-c", "select 1"])
            assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
        with pytest.raises(dynamodb_local.StackError, match="already answers"):  # a second start is refused
            postgres_local.start(port, data, folder / "pg.log")
    finally:
        postgres_local.stop(data)
        process.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


def test_dynamodb_local_refuses_unsigned_requests_from_every_user(tmp_path, capsys):
    """Who sends decides nothing: an unsigned request is answered by the relay's door (400, never forwarded), from
    this user and from another alike; a signed one reaches the jar
    (tests/stack/test_neighbour_dynamodb.py: the attacks)."""
    port = dynamodb_local.free_port()
    process = dynamodb_local.start_private(port, db_path=None, log_path=tmp_path / "dynamodb.log")
    try:
        if "cannot be kept to loopback here" in capsys.readouterr().out:
            pytest.skip("no private network namespace here")
        ask = (
            "import urllib.request, urllib.error\n"
            f"request = urllib.request.Request('http://127.0.0.1:{port}/', data=b'{{}}', headers={{"
            "'X-Amz-Target': 'DynamoDB_20120810.ListTables', 'Content-Type': 'application/x-amz-json-1.0'})\n"
            "try:\n    urllib.request.urlopen(request, timeout=60)\n"
            "except urllib.error.HTTPError as error:\n    print('answered', error.code, error.read().decode())\n"
            "except OSError as error:\n    print('refused', type(error).__name__)\n"
        )
        for caller in (
            subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, timeout=90),
            as_nobody_python(ask),
        ):
            assert caller.stdout.startswith("answered 400"), caller
            assert "UnrecognizedClientException" in caller.stdout, caller
        assert boto3.client("dynamodb", endpoint_url=f"http://127.0.0.1:{port}").list_tables()["TableNames"] == []
        log = (tmp_path / "dynamodb.log").read_text()
        assert log.count("loopback_ns: refused a request from 127.0.0.1:") == 2, log
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in log
    finally:
        dynamodb_local.stop(process)
