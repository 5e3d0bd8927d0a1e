"""The stack's DynamoDB key: rotated at every `make up`, the previous one accepted for its grace period only, handed
to the programs that sign with it (which restart with it) and never to DynamoDB's relay command line."""

from __future__ import annotations

import os
import stat
import sys
import time

import pytest

from deployments import dynamodb_keys, local_stack
from deployments.sigv4_door import Door, Refused
from deployments.supervisor import Supervisor
from tests.helpers.prefect_runs import wait_for
from tests.helpers.sigv4 import raw


def _request(key: dynamodb_keys.Key):
    from deployments.sigv4_door import Reader

    class Bytes:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def recv(self, _size: int) -> bytes:
            data, self.data = self.data, b""
            return data

    payload = {"TableName": "t", "Item": {"k": {"S": "x"}}}
    return Reader(Bytes(raw(8000, "PutItem", payload, (key.access_key_id, key.secret_access_key)))).request()


def test_rotation_keeps_the_previous_key_for_its_grace_period_and_never_an_older_one(tmp_path, monkeypatch):
    path = tmp_path / "secrets" / "dynamodb-keys.json"
    first = dynamodb_keys.rotate(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    second = dynamodb_keys.rotate(path)
    door = Door.from_environment({dynamodb_keys.KEYS_FILE_ENV: str(path)})
    door.check(_request(second))
    door.check(_request(first))  # a flow run in flight still signs with it
    monkeypatch.setenv(dynamodb_keys.GRACE_ENV, "0.5")
    time.sleep(0.6)
    with pytest.raises(Refused, match="security token"):
        door.check(_request(first))
    monkeypatch.delenv(dynamodb_keys.GRACE_ENV)
    third = dynamodb_keys.rotate(path)  # the door reads the replaced file: no restart
    door.check(_request(third))
    door.check(_request(second))
    with pytest.raises(Refused, match="security token"):
        door.check(_request(first))  # two rotations ago: never
    assert dynamodb_keys.current(path) == third


def test_make_up_hands_the_new_key_to_the_programs_that_sign_and_only_the_file_path_to_the_relay(tmp_path, monkeypatch):
    monkeypatch.setattr(local_stack, "DATA", tmp_path / "data")
    monkeypatch.setattr(local_stack, "server_database_env", lambda: {})
    key = dynamodb_keys.rotate(local_stack.dynamodb_keys_file())
    programs = local_stack.stack_programs()
    for name in ("engine", "worker", "listeners"):
        assert f'AWS_SECRET_ACCESS_KEY="{key.secret_access_key}"' in programs[name]["environment"]
    relay = programs["dynamodb"]
    assert key.secret_access_key not in relay["command"] + relay["environment"]
    assert f"{dynamodb_keys.KEYS_FILE_ENV}=" in relay["environment"]
    fingerprint = local_stack.deployment_fingerprint()
    dynamodb_keys.rotate(local_stack.dynamodb_keys_file())
    assert local_stack.stack_programs()["dynamodb"] == relay  # the relay keeps running: it re-reads the file
    assert local_stack.deployment_fingerprint() == fingerprint  # a rotation deploys nothing again


def test_the_supervisor_restarts_a_program_whose_key_changed_and_no_other(tmp_path):
    show = f"{sys.executable} -c 'import time; time.sleep(600)'"

    def programs(key_id: str) -> dict[str, dict[str, str]]:
        return {"holder": {"command": show, "environment": f'AWS_ACCESS_KEY_ID="{key_id}"'}, "relay": {"command": show}}

    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    stack = Supervisor(tmp_path / "data", str(runtime / "supervisor.sock"))
    try:
        stack.ensure(
            {"holder": {"command": show, "environment": 'AWS_ACCESS_KEY_ID="OLD"'}, "relay": {"command": show}}
        )
        holder = wait_for(lambda: stack.pid("holder"), 30, "holder to run")
        relay = wait_for(lambda: stack.pid("relay"), 30, "relay to run")
        stack.ensure(
            {"holder": {"command": show, "environment": 'AWS_ACCESS_KEY_ID="NEW"'}, "relay": {"command": show}}
        )
        again = wait_for(lambda: (stack.pid("holder") or holder) != holder and stack.pid("holder"), 30, "a restart")
        assert b"AWS_ACCESS_KEY_ID=NEW" in open(f"/proc/{again}/environ", "rb").read().split(b"\0")
        assert stack.pid("relay") == relay
    finally:
        stack.shutdown()
