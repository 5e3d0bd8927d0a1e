"""A hostile neighbour (``nobody``) at DynamoDB Local's door: what it sends reaches the jar only when signed with the
stack's key. Raw sockets, as an attacker sends them: a connect-send-close burst, a wrong key, a stale replay, a
second request on a kept-alive connection, and a squatter on the port before `make up`."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import boto3
import pytest

from deployments import dynamodb_local
from tests.helpers.other_user import SYSTEM_PATH, as_nobody_python
from tests.helpers.sigv4 import raw

TABLE = "neighbours"

# what `nobody` runs (the system's python3, no botocore): PORT, MODE and REQUESTS prepended as literals
SEND = r"""
import socket, threading
def burst(requests):  # connect, send a whole request, close at once: no answer awaited
    for request in requests:
        try:
            with socket.create_connection(("127.0.0.1", PORT), timeout=10) as sock:
                sock.sendall(request)
        except OSError:
            pass
if MODE == "burst":
    threads = [threading.Thread(target=burst, args=(REQUESTS,)) for _ in range(4)]
    for thread in threads: thread.start()
    for thread in threads: thread.join()
    print("sent")
else:  # every request on one connection, then read until the other end closes
    with socket.create_connection(("127.0.0.1", PORT), timeout=60) as sock:
        sock.sendall(b"".join(REQUESTS))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    print(answer.decode(errors="replace"))
"""


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    """A DynamoDB Local of this module's own behind the relay (its log read by the tests), with a table."""
    log = tmp_path_factory.mktemp("door") / "dynamodb.log"
    port = dynamodb_local.free_port()
    process = dynamodb_local.start_private(port, db_path=None, log_path=log)
    try:
        if not dynamodb_local.isolated(process.pid):
            pytest.skip("no private network namespace here: DynamoDB Local runs unguarded, with a WARNING")
        client = boto3.client("dynamodb", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1")
        client.create_table(
            TableName=TABLE,
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield port, client, log
    finally:
        dynamodb_local.stop(process)


def as_nobody(port: int, mode: str, requests: list[bytes]) -> str:
    result = as_nobody_python(f"PORT = {port}\nMODE = {mode!r}\nREQUESTS = {requests!r}\n{SEND}")
    assert result.returncode == 0, result
    return result.stdout


def stack_key() -> tuple[str, str]:
    return os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]


def put(name: str) -> dict:
    return {"TableName": TABLE, "Item": {"k": {"S": name}}}


def absent(client, *names: str) -> bool:
    return all("Item" not in client.get_item(TableName=TABLE, Key={"k": {"S": name}}) for name in names)


def test_a_connect_send_close_burst_reaches_nothing(door):
    """Unsigned and wrongly signed PutItem, GetItem and CreateTable, each sent whole and the socket closed at once,
    from four threads: no item and no table appear (the jar takes any key: the door is all that stops them)."""
    port, client, log = door
    wrong = ("AKIDNEIGHBOUR0000000", "not-the-stacks-secret")
    requests = []
    for n in range(10):
        for key in (None, wrong):
            requests += [
                raw(port, "PutItem", put(f"burst-{n}-{key is None}"), key, close=False),
                raw(port, "GetItem", {"TableName": TABLE, "Key": {"k": {"S": "x"}}}, key, close=False),
                raw(port, "CreateTable", _table(f"burst-table-{n}-{key is None}"), key, close=False),
            ]
    assert as_nobody(port, "burst", requests).strip() == "sent"
    names = [f"burst-{n}-{unsigned}" for n in range(10) for unsigned in (True, False)]
    assert absent(client, *names)
    assert not [name for name in client.list_tables()["TableNames"] if name.startswith("burst-table")]
    assert client.scan(TableName=TABLE, Select="COUNT")["Count"] == 0
    assert "loopback_ns: refused a request" in log.read_text()


def test_a_request_signed_with_a_wrong_key_is_answered_and_refused(door):
    port, client, log = door
    answer = as_nobody(port, "ask", [raw(port, "PutItem", put("wrong-id"), ("AKIDNEIGHBOUR0000000", "x"))])
    assert answer.startswith("HTTP/1.1 400") and "UnrecognizedClientException" in answer, answer
    key_id, _secret = stack_key()  # the right id with a guessed secret
    answer = as_nobody(port, "ask", [raw(port, "PutItem", put("wrong-secret"), (key_id, "guessed"))])
    assert answer.startswith("HTTP/1.1 400") and "InvalidSignatureException" in answer, answer
    assert absent(client, "wrong-id", "wrong-secret")
    text = log.read_text()
    assert stack_key()[1] not in text and "Signature=" not in text  # a refusal logs neither key nor signature


def test_a_replay_older_than_five_minutes_is_refused_a_fresh_signature_is_not(door):
    """A captured request signed with the stack's key six minutes ago is refused (AWS's skew rule); the same
    request signed now goes through: the signature decides, never who sends it."""
    port, client, _log = door
    stale = datetime.datetime.utcnow() - datetime.timedelta(minutes=6)
    answer = as_nobody(port, "ask", [raw(port, "PutItem", put("replayed"), stack_key(), when=stale)])
    assert answer.startswith("HTTP/1.1 400") and "Signature expired" in answer, answer
    assert absent(client, "replayed")
    answer = as_nobody(port, "ask", [raw(port, "PutItem", put("fresh"), stack_key())])
    assert answer.startswith("HTTP/1.1 200"), answer
    assert not absent(client, "fresh")


def test_every_request_on_a_kept_alive_connection_is_checked(door):
    """A signed request, then a wrongly signed one on the same connection: the first lands, the second is refused
    and the connection closed."""
    port, client, _log = door
    requests = [
        raw(port, "PutItem", put("alive-first"), stack_key(), close=False),
        raw(port, "PutItem", put("alive-second"), ("AKIDNEIGHBOUR0000000", "x"), close=False),
    ]
    answer = as_nobody(port, "ask", requests)
    assert answer.startswith("HTTP/1.1 200") and "HTTP/1.1 400 Bad Request" in answer, answer
    assert not absent(client, "alive-first") and absent(client, "alive-second")


def test_chunked_and_oversized_requests_are_refused_clearly(door):
    port, _client, _log = door
    chunked = f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".encode()
    answer = as_nobody(port, "ask", [chunked])
    assert answer.startswith("HTTP/1.1 400") and "Transfer-Encoding is not accepted" in answer, answer
    huge = f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {10**9}\r\n\r\n".encode()
    answer = as_nobody(port, "ask", [huge])
    assert answer.startswith("HTTP/1.1 413") and "request body over" in answer, answer


def test_make_up_refuses_a_port_another_user_holds_naming_port_and_uid(tmp_path):
    """A squatter (``nobody``) listens on the DynamoDB port before `make up`: `up` refuses, naming port and uid."""
    if os.geteuid() != 0:
        pytest.skip("running as another local user needs root (CI runs as root)")
    port = dynamodb_local.free_port()
    squat = (
        "import socket, sys, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('127.0.0.1', {port}))\ns.listen()\nprint('listening', flush=True)\ntime.sleep(120)\n"
    )
    squatter = subprocess.Popen(
        ["python3", "-c", squat],
        user="nobody",
        group="nogroup",
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": SYSTEM_PATH},
        cwd="/",
    )
    try:
        assert squatter.stdout.readline().strip() == "listening"
        env = {
            **os.environ,
            "PIPELINES_DATA_DIR": str(tmp_path / "data"),
            "PIPELINES_RUNTIME_DIR": str(tmp_path / "run"),
            "DYNAMODB_LOCAL_PORT": str(port),
            "PREFECT_SERVER_PORT": str(dynamodb_local.free_port()),
            "PREFECT_SERVER_DB": "sqlite",
        }
        result = subprocess.run(
            [sys.executable, "-m", "deployments.local_stack", "up"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            cwd=dynamodb_local.REPO_ROOT,
        )
        assert result.returncode == 2, result
        assert f"port {port} is already taken by another local user (uid 65534)" in result.stderr, result.stderr
        assert "dynamodb cannot start" in result.stderr
    finally:
        squatter.kill()
        squatter.wait()


def _table(name: str) -> dict:
    return {
        "TableName": name,
        "KeySchema": [{"AttributeName": "k", "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": "k", "AttributeType": "S"}],
        "BillingMode": "PAY_PER_REQUEST",
    }


def test_the_port_stays_held_while_dynamodb_local_restarts_inside_its_relay(tmp_path):
    """The jar SIGKILLed: its relay starts it again and keeps the port all along, so another user cannot listen
    there meanwhile; the stack's clients are answered again (a fresh, in-memory jar)."""
    port = dynamodb_local.free_port()
    process = dynamodb_local.start_private(port, db_path=None, log_path=tmp_path / "dynamodb.log")
    try:
        if not dynamodb_local.isolated(process.pid):
            pytest.skip("no private network namespace here: DynamoDB Local runs unguarded, with a WARNING")
        client = boto3.client("dynamodb", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1")
        assert client.list_tables()["TableNames"] == []
        jar = int(open(f"/proc/{process.pid}/task/{process.pid}/children").read().split()[0])
        os.kill(jar, 9)
        squat = as_nobody_python(
            "import socket\ntry:\n"
            f"    s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); print('bound')\n"
            "except OSError as error:\n    print(error.errno)\n"
        )
        assert squat.stdout.strip() == "98", squat  # EADDRINUSE: the relay still holds it
        assert client.list_tables()["TableNames"] == []  # waits in the relay for the jar started again
        again = int(open(f"/proc/{process.pid}/task/{process.pid}/children").read().split()[0])
        assert again != jar and process.poll() is None
    finally:
        dynamodb_local.stop(process)
