"""A records batch file with bytes that are not UTF-8: the message holding them goes to the dead-letter archive
(InvalidUtf8, with the byte offset) with its exact bytes, its granule is not written under a changed id, the
other messages of the file are written, and a replay after fixing the bytes writes it."""

from __future__ import annotations

import base64
import json

import pytest

from flows.records import records_ingest, records_replay_dla
from tasks.core import config, state_store
from tasks.core.runtime import today_iso
from tasks.records import dead_letter
from tasks.records import messages as records_messages
from tasks.records.keys import dead_letter_prefix
from tests.helpers.records import message

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


def broken_message() -> bytes:
    """A message whose granule id holds the byte 0xff (as a producer writing Latin-1 would send it)."""
    return json.dumps(message("completed", "exec-bad", 2000, granule="G-BAD-ID")).encode().replace(b"BAD", b"\xff", 1)


def batch_file(layout: str, bad: bytes, good: bytes) -> bytes:
    """The bytes of a batch file: an indented JSON list, or one message per line."""
    return b"[\n  " + bad + b",\n  " + good + b"\n]\n" if layout == "list" else bad + b"\n" + good + b"\n"


def granule_ids(tables) -> list[str]:
    return sorted(item["granuleId"] for item in state_store.scan_all(tables["granules"]))


@pytest.mark.parametrize("layout", ["list", "lines"])
def test_a_message_with_invalid_utf8_is_archived_byte_exact_and_the_others_are_written(tables, store_root, layout):
    bad, good = broken_message(), json.dumps(message("completed", "exec-ok", 1000, granule="G-OK")).encode()
    (store_root / "batch.json").write_bytes(batch_file(layout, bad, good))

    summary = records_ingest(messages_url=(store_root / "batch.json").as_uri())

    bad_id = records_messages.message_id(bad)
    assert (summary["messages"], summary["ok"], summary["archived"]) == (2, 1, 1)
    offset = bad.index(b"\xff")
    assert summary["errors"] == {
        bad_id: {
            "type": "InvalidUtf8",
            "message": f"message body is not valid UTF-8: byte offset {offset} (0xff: invalid start byte)",
        }
    }
    assert granule_ids(tables) == ["G-OK"]  # nothing under "G-\ufffd-ID" (or any other changed id)
    entry = dead_letter.read(f"{dead_letter_prefix(today_iso())}{bad_id}.json")
    assert (entry["message"], entry["body"], entry["error"]["type"]) == (None, None, "InvalidUtf8")
    assert base64.b64decode(entry["body_base64"]) == bad  # the original bytes, exactly


def test_a_replay_writes_the_message_once_its_bytes_are_fixed(tables, store_root):
    bad = broken_message()
    records_ingest(messages_url=_write(store_root, bad))
    day, bad_id = today_iso(), records_messages.message_id(bad)
    key = f"{dead_letter_prefix(day)}{bad_id}.json"

    result = records_replay_dla(day=day)  # not fixed: fails again, moved to failed/ with its bytes kept
    assert result["written"] == [] and result["errors"][bad_id]["type"] == "InvalidUtf8"
    failed = dead_letter.read(result["failed"][bad_id])
    assert base64.b64decode(failed["body_base64"]) == bad and failed["attempts"] == 1

    failed["body_base64"] = base64.b64encode(bad.replace(b"\xff", b"BAD")).decode()  # the operator's fix
    config.object_store().put_bytes(key, json.dumps(failed).encode())
    result = records_replay_dla(day=day, message_ids=[bad_id])
    assert result["written"] == [bad_id] and granule_ids(tables) == ["G-BAD-ID"]


def test_a_text_body_with_invalid_utf8_in_a_json_list_keeps_the_bodys_bytes(tables, store_root):
    """A JSON list of text bodies (as SQS delivers them): the bad body is archived as its own bytes."""
    good = json.dumps(message("completed", "exec-ok", 1000, granule="G-OK"))
    bad_body = broken_message()
    data = b'["' + bad_body.replace(b'"', b'\\"') + b'", ' + json.dumps(good).encode() + b"]"
    assert records_messages.batch_from_bytes(data) == [bad_body, good]


def _write(root, data: bytes) -> str:
    (root / "batch.ndjson").write_bytes(data + b"\n")
    return (root / "batch.ndjson").as_uri()
