"""Shared by tests/test_records_cumulus_*.py: Cumulus workflow messages as Cumulus's own tests build them, and
the records they leave (each test uses ids of its own, so one module's tests share their tables)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tasks.core import state_store
from tasks.records import messages as records_messages
from tasks.records import rules as records

STATE_MACHINE = "arn:aws:states:us-east-1:12345:stateMachine:IngestGranule"
COLLECTION = {"name": "MOD09GQ", "version": "006"}
COLLECTION_ID = "MOD09GQ___006"
NOW = 1_700_000_900_000
START = 1_700_000_000_000


def new_id(prefix: str) -> str:
    """An id no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def arn(execution_name: str) -> str:
    """The execution ARN of ``execution_name`` under the test state machine."""
    return STATE_MACHINE.replace(":stateMachine:", ":execution:") + ":" + execution_name


def files(*sizes: int) -> list[dict[str, Any]]:
    """Cumulus's fakeFileFactory: files with a bucket, key, name and size."""
    return [
        {"bucket": "protected", "key": f"{n}/{k}.hdf", "fileName": f"{k}.hdf", "size": size}
        for n, (k, size) in enumerate((uuid.uuid4().hex[:8], size) for size in sizes)
    ]


def message(
    status: str | None, execution: str, start: int | None, *granules: dict, pdr: str | None = None, **extra: Any
) -> dict:
    """A Cumulus message: cumulus_meta, meta (collection, provider, status) and payload (granules, PDR)."""
    msg: dict[str, Any] = {
        "cumulus_meta": {"state_machine": STATE_MACHINE, "execution_name": execution},
        "meta": {"collection": dict(COLLECTION), "provider": {"id": "prov", "host": "h", "protocol": "s3"}},
        "payload": {"granules": list(granules)},
    }
    if start is not None:
        msg["cumulus_meta"]["workflow_start_time"] = start
    if status is not None:
        msg["meta"]["status"] = status
    if pdr is not None:
        msg["payload"]["pdr"] = {"name": pdr}
    for where, values in extra.items():  # cumulus_meta=..., meta=..., payload=... merge; anything else is set
        if where in msg and isinstance(values, dict):
            msg[where].update(values)
        else:
            msg[where] = values
    return msg


def ingest(*messages: dict, now: int = NOW) -> records_messages.IngestReport:
    """The messages through records-ingest's task body, in order, as one batch."""
    return records_messages.ingest(list(messages), now_ms=now)


def granule(granule_id: str) -> dict[str, Any] | None:
    """The stored granule record, or None."""
    item = state_store.get_item(records.GRANULE.table_name(), {"granuleId": granule_id})
    return state_store.to_plain(item) if item else None


def execution(execution_name: str) -> dict[str, Any] | None:
    """The stored execution record, or None."""
    item = state_store.get_item(records.EXECUTION.table_name(), {"arn": arn(execution_name)})
    return state_store.to_plain(item) if item else None


def pdr(name: str) -> dict[str, Any] | None:
    """The stored PDR record, or None."""
    item = state_store.get_item(records.PDR.table_name(), {"pdrName": name})
    return state_store.to_plain(item) if item else None


def put_execution(execution_name: str, status: str, created: int = START) -> None:
    """An execution record as Cumulus's tests create one beforehand (fakeExecutionRecordFactory)."""
    state_store.put(
        records.EXECUTION.table_name(), {"arn": arn(execution_name), "status": status, "createdAt": created}
    )


def ported(*titles: str) -> pytest.MarkDecorator:
    """One test for several Cumulus tests of the same scenario: ``title`` takes each Cumulus test's title."""
    return pytest.mark.parametrize("title", titles, ids=titles)
