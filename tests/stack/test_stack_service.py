"""The local stack as a service, whole: `local_stack up` in a folder of its own on free ports, every door tried as
another local user (``nobody``), then DynamoDB Local, PostgreSQL and the Prefect server each SIGKILLed under a
stream of records messages. The supervisor brings each back within a minute, and every message file is written and
set aside exactly once; `local_stack down` leaves nothing running."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import boto3
import pytest

from benchmarks.server_load import stack
from deployments import dynamodb_local, postgres_local
from deployments.supervisor import Supervisor, socket_for
from tasks.core.processes import pid_alive
from tests.helpers.landing import record_messages
from tests.helpers.other_user import as_nobody_python, as_nobody_run
from tests.helpers.prefect_runs import wait_for
from tests.helpers.stack_probe import own_stack

pytestmark = pytest.mark.sweep  # a whole stack (a deploy of every pipeline) and three outages: ~10 minutes

BATCH = 6  # message files dropped before each kill and at the end, 5 messages each
KILLED = ("dynamodb", "postgres", "prefect-server")


def _drop(objects: Path, first: int, count: int) -> list[str]:
    names = []
    (objects / "records" / "incoming").mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        name = f"svc-{i:03d}.json"
        staged = objects / f".{name}.part"
        staged.write_text(json.dumps(record_messages(5 * i, 5)))
        os.rename(staged, objects / "records" / "incoming" / name)
        names.append(name)
    return names


def _answers(name: str, data: Path, ports: dict[str, int], auth: str) -> bool:
    if name == "postgres":
        return postgres_local.answers(ports["postgres"], data / "postgres")
    if name == "dynamodb":
        return dynamodb_local.port_open("127.0.0.1", ports["dynamodb"])
    import ssl
    import urllib.request

    request = urllib.request.Request(f"https://127.0.0.1:{ports['prefect-server']}/api/health")
    context = ssl.create_default_context(cafile=str(data / "secrets" / "prefect-api.crt"))
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return response.status == 200
    return False


def _api_status(data: Path, api: str, auth: str) -> int:
    """The status the stack's API answers a flow-run query sent with ``auth`` (the stack's certificate pinned)."""
    import base64
    import ssl
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{api}/flow_runs/filter",
        data=b"{}",
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(auth.encode()).decode(),
        },
    )
    context = ssl.create_default_context(cafile=str(data / "secrets" / "prefect-api.crt"))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _killed_process(supervisor: Supervisor, name: str) -> int:
    """The process a SIGKILL of ``name`` hits: DynamoDB Local's jar (inside its relay), the Prefect server (under the
    process that holds its port), else the program itself."""
    pid = supervisor.pid(name)
    if name in ("dynamodb", "prefect-server"):
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return int(children[0])
    return pid


@pytest.mark.timeout(1800)
def test_the_stack_answers_its_user_only_and_rides_out_each_process_killed():
    if os.geteuid() != 0:
        pytest.skip("trying the doors as another local user needs root (CI runs as root)")
    folder, data, env = own_stack("stack-svc-")
    ports = {
        "dynamodb": int(env["DYNAMODB_LOCAL_PORT"]),
        "prefect-server": int(env["PREFECT_SERVER_PORT"]),
        "postgres": int(env["PREFECT_POSTGRES_PORT"]),
    }
    try:
        stack("up", env)
        exported = dict(
            line.removeprefix("export ").split("=", 1) for line in (data / "local.env").read_text().splitlines()
        )
        auth = exported["PREFECT_API_AUTH_STRING"]
        api = exported["PREFECT_API_URL"]

        # every door, as another local user
        asked = as_nobody_python(
            "import ssl, urllib.request, urllib.error\n"
            f"request = urllib.request.Request('{api}/flow_runs/filter', data=b'{{}}', "
            "headers={'Content-Type': 'application/json'})\n"
            "try:\n    urllib.request.urlopen(request, timeout=10, context=ssl._create_unverified_context())\n"
            "    print('answered 200')\n"
            "except urllib.error.HTTPError as error:\n    print('answered', error.code)\n"
        )
        assert asked.stdout.strip() == "answered 401", asked
        socket_file = postgres_local.socket_path(ports["postgres"], data / "postgres")
        knock = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(socket_file)!r})\nprint('connected')"
        assert "PermissionError" in as_nobody_python(knock).stderr  # refused at the 0700 folder, psql or not
        psql = shutil.which("psql")
        if psql:
            refused = as_nobody_run(
                [psql, "-h", str(data / "postgres"), "-p", str(ports["postgres"]), "-U", "prefect", "-c", "select 1"]
            )
            assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
        knock = (  # an unsigned request: the relay's refusal answers it, DynamoDB Local never sees it
            f"import socket\ns = socket.create_connection(('127.0.0.1', {ports['dynamodb']}), timeout=5)\n"
            "s.sendall(b'POST / HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 2\\r\\n\\r\\n{}')\n"
            "print(s.recv(4096).decode(errors='replace'))\n"
        )
        answer = as_nobody_python(knock).stdout
        assert answer.startswith("HTTP/1.1 400") and "UnrecognizedClientException" in answer, answer

        # each process SIGKILLed under a stream of files; the supervisor brings it back
        objects = data / "objects"
        supervisor = Supervisor(data, socket_for(data))
        names: list[str] = []
        back_after = {}
        for round_, name in enumerate(KILLED):
            names += _drop(objects, round_ * BATCH, BATCH)
            victim = _killed_process(supervisor, name)
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            wait_for(lambda victim=victim: not pid_alive(victim), 30, f"{name} to die")
            if name in ("prefect-server", "dynamodb"):  # the port stays held while it comes back: no one else gets it
                squat = as_nobody_python(
                    "import socket\ntry:\n    socket.socket().bind(('127.0.0.1', "
                    f"{ports[name]}))\n    print('bound')\nexcept OSError as error:\n    print(error.errno)\n"
                )
                assert squat.stdout.strip() == "98", squat  # EADDRINUSE
            wait_for(lambda name=name: _answers(name, data, ports, auth), 60, f"{name} to be back")
            back_after[name] = time.monotonic() - killed_at
        names += _drop(objects, len(KILLED) * BATCH, BATCH)

        dynamodb = boto3.client(
            "dynamodb",
            endpoint_url=exported["AWS_ENDPOINT_URL_DYNAMODB"],
            region_name="us-east-1",
            aws_access_key_id=exported["AWS_ACCESS_KEY_ID"],  # the stack's own key: its relay checks it
            aws_secret_access_key=exported["AWS_SECRET_ACCESS_KEY"],
        )

        def granules() -> list[dict]:
            pages = dynamodb.get_paginator("scan").paginate(TableName="granules")
            return [item for page in pages for item in page["Items"] if item["granuleId"]["S"].startswith("LAND.")]

        expected = 5 * len(names)
        wait_for(lambda: len(granules()) == expected, 600, f"all {expected} granules written")
        processed = objects / "records" / "processed"
        wait_for(
            lambda: sorted(p.name for p in processed.rglob("svc-*.json")) == sorted(names), 300, "every file set aside"
        )
        assert {item["status"]["S"] for item in granules()} == {"completed"}
        assert not list((objects / "records" / "incoming").glob("svc-*"))
        print(f"stack service: back after SIGKILL, s: { {k: round(v, 1) for k, v in back_after.items()} }")
        assert all(seconds < 60 for seconds in back_after.values()), back_after
        status = stack("status", env)
        assert all(f"{name:16} running" in status for name in (*KILLED, "engine", "worker")), status

        # the next `up` rotates the API's auth string: the one seen before stops working
        stack("up", env)
        rotated = (data / "secrets" / "prefect-api-auth").read_text().strip()
        assert rotated != auth
        assert [_api_status(data, api, given) for given in (auth, rotated)] == [401, 200]
    finally:
        with contextlib.suppress(Exception):
            print(stack("down", env))
        shutil.rmtree(folder, ignore_errors=True)
    assert not Supervisor(data, socket_for(data)).running()
    assert not dynamodb_local.port_open("127.0.0.1", ports["prefect-server"])
