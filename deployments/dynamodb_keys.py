"""The local stack's DynamoDB key: the access key id and secret every request to DynamoDB Local is signed with (SigV4),
checked by the loopback relay (``deployments/loopback_ns.py``) before anything reaches the jar.

The key lives in ``.data/secrets/dynamodb-keys.json`` (0600, in the 0700 secrets folder) and is made afresh at every
`make up` (``rotate``). The key it replaces stays accepted for ``PIPELINES_DYNAMODB_KEY_GRACE_S`` seconds after the
rotation (default 3600), so flow runs in flight, which hold the old key in their environment, finish; an older key is
never accepted. Standard library only: the relay loads it.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from deployments.settings import StackSettings

# the relay's way to the key file (never its command line: ps shows that)
KEYS_FILE_ENV = StackSettings.env_name("dynamodb_keys")
GRACE_ENV = StackSettings.env_name("dynamodb_key_grace_s")


@dataclass(frozen=True)
class Key:
    """One access key: its id and secret."""

    access_key_id: str
    secret_access_key: str


def new_key() -> Key:
    """A random key, shaped like AWS's (a 20-character id, a 40-character secret)."""
    return Key(f"PIPE{secrets.token_hex(8).upper()}", secrets.token_urlsafe(30))


def grace_seconds() -> float:
    """How long the previous key stays accepted after a rotation (``PIPELINES_DYNAMODB_KEY_GRACE_S``)."""
    return StackSettings.read().dynamodb_key_grace_s


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def current(path: Path) -> Key | None:
    """The key the stack's processes sign with, or None before the first `make up` made one."""
    try:
        record = _read(path)["current"]
    except FileNotFoundError:
        return None
    return Key(record["access_key_id"], record["secret_access_key"])


def load(path: Path) -> dict:
    """The key file's record: {"current": {...}, "previous": {..., "retired_at"} or None}."""
    return _read(path)


def accepted(record: dict, now: float | None = None) -> dict[str, Key]:
    """Access key id -> key for every key of ``record`` (``load``) the relay accepts now: the current one, and the
    previous one within its grace period after the rotation that retired it."""
    now = time.time() if now is None else now
    keys = {record["current"]["access_key_id"]: Key(**_key_fields(record["current"]))}
    previous = record.get("previous")
    if previous and now - previous["retired_at"] < grace_seconds():
        keys[previous["access_key_id"]] = Key(**_key_fields(previous))
    return keys


def _key_fields(record: dict) -> dict[str, str]:
    return {"access_key_id": record["access_key_id"], "secret_access_key": record["secret_access_key"]}


def rotate(path: Path) -> Key:
    """Make a new current key in ``path`` (the folder made private), keeping the one it replaces as the previous key
    (retired now); the new key. The file is replaced in one step, so the relay never reads half of it."""
    from tasks.core.private_folder import write_secret

    try:
        before = _read(path)["current"]
    except FileNotFoundError:
        before = None
    key = new_key()
    record = {
        "current": {**_key_fields(key.__dict__), "made_at": time.time()},
        "previous": {**_key_fields(before), "retired_at": time.time()} if before else None,
    }
    write_secret(path, json.dumps(record))
    return key


def use_fresh_key(environ: dict[str, str] | None = None) -> Key:
    """A new random key set as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in ``environ`` (this process's environment
    by default): for a DynamoDB Local of one's own (a test session, a benchmark), whose relay checks the key of the
    environment it starts in, and whose every client signs with it."""
    key = new_key()
    target = os.environ if environ is None else environ
    target["AWS_ACCESS_KEY_ID"], target["AWS_SECRET_ACCESS_KEY"] = key.access_key_id, key.secret_access_key
    return key
