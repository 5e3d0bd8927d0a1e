"""The records landing (``records/incoming/``) as the records-ingest rules need it: one strict UTF-8 decode for a
dropped file and for ``messages_url``; a message with a lone surrogate archived on its own while its neighbours
are written and the file is set aside; processed files of the same name never overwrite each other."""

from __future__ import annotations

import base64
import json

from tasks.core import state_store
from tasks.core.object_store import LocalStore
from tasks.core.runtime import today_iso
from tasks.records import dead_letter
from tasks.records import landing as records_landing
from tasks.records import messages as records_messages
from tasks.records.keys import dead_letter_prefix
from tests.helpers.landing import arrive
from tests.helpers.records_cumulus import START, message


def body(granule_id: str, execution: str = "exec-1") -> bytes:
    """One completed message for ``granule_id``, as JSON bytes (non-ASCII escaped, as json.dumps writes it)."""
    return json.dumps(message("completed", execution, START, {"granuleId": granule_id, "files": []})).encode()


def granule_ids(tables) -> list[str]:
    return sorted(item["granuleId"] for item in state_store.scan_all(tables["granules"]))


def test_an_incoming_file_with_invalid_utf8_is_archived_as_through_messages_url(tables, store_root):
    bad = body("G-BAD-ID", "exec-bad").replace(b"BAD", b"\xff", 1)
    data = b"[\n  " + bad + b",\n  " + body("G-OK") + b"\n]\n"
    (store_root / "copy.json").write_bytes(data)  # the same file, for messages_url

    outcome = records_landing.handle_messages([arrive(store_root, "records/incoming/batch.json", data)])

    assert outcome.retry == [] and len(outcome.done) == 1
    assert granule_ids(tables) == ["G-OK"]  # nothing under "G-\ufffd-ID": no replacement character, ever
    key = f"{dead_letter_prefix(today_iso())}{records_messages.message_id(bad)}.json"
    entry = dead_letter.read(key)
    offset = bad.index(b"\xff")
    assert entry["error"] == {
        "type": "InvalidUtf8",
        "message": f"message body is not valid UTF-8: byte offset {offset} (0xff: invalid start byte)",
    }
    assert base64.b64decode(entry["body_base64"]) == bad
    # the same bytes by messages_url: the same archive entry (the same id, error and bytes)
    summary = records_messages.ingest_messages(messages_url=(store_root / "copy.json").as_uri())
    assert summary["errors"] == {records_messages.message_id(bad): entry["error"]}
    assert base64.b64decode(dead_letter.read(key)["body_base64"]) == bad


def test_a_lone_surrogate_sends_only_its_message_to_the_archive_and_the_file_is_set_aside(tables, store_root):
    lone = json.dumps(message("completed", "exec-2", START, {"granuleId": "G-\ud800-2", "files": []}))
    assert "\\ud800" in lone  # JSON text, all ASCII: valid UTF-8 that decodes to a lone surrogate
    data = b"\n".join([body("G-1"), lone.encode(), body("G-3", "exec-3")])
    arrival = arrive(store_root, "records/incoming/lone.ndjson", data)

    outcome = records_landing.handle_messages([arrival])

    assert outcome.done == [arrival] and outcome.retry == []  # not offered again forever
    assert granule_ids(tables) == ["G-1", "G-3"]
    entry = dead_letter.read(f"{dead_letter_prefix(today_iso())}{records_messages.message_id(lone)}.json")
    assert entry["error"] == {
        "type": "InvalidUnicode",
        "message": "payload/granules/0/granuleId: text holds a lone surrogate (an unpaired \\ud800-\\udfff escape)",
    }
    assert (entry["message"], entry["body"]) == (None, lone)  # kept as it came
    store = LocalStore(store_root)
    assert list(store.list("records/incoming/")) == [] and store.exists(f"records/processed/{today_iso()}/lone.ndjson")
    # its replay fails again, on its own, and is kept under failed/
    replayed = records_messages.replay_archive(today_iso(), None)
    assert list(replayed["failed"]) == [records_messages.message_id(lone)] and replayed["written"] == []


def test_processed_files_of_the_same_name_never_overwrite_each_other(tables, store_root):
    store, day = LocalStore(store_root), today_iso()
    first, second = body("G-A", "exec-a"), body("G-B", "exec-b")
    for data in (first, second, first):  # the same name three times: two contents, the first one twice
        outcome = records_landing.handle_messages([arrive(store_root, "records/incoming/drop.json", data)])
        assert outcome.retry == []
    processed = {key: store.get_bytes(key) for key in store.list(f"records/processed/{day}/")}
    assert sorted(processed.values()) == sorted([first, second])  # both kept, the repeat replaced only itself
    assert processed[f"records/processed/{day}/drop.json"] == first
    assert granule_ids(tables) == ["G-A", "G-B"]
