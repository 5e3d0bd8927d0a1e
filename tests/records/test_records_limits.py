"""One message never costs the others their write (issue 12 item 5), on a real DynamoDB Local: out-of-range times,
records over the 400 KB item limit, batches over the 4 MB transaction limit, numbers DynamoDB cannot hold,
keys over the key limit. Each message is written (text cut with a visible mark) or archived with the reason."""

from __future__ import annotations

import json

import pytest

from tasks.core import state_store
from tasks.records import dead_letter, rules
from tasks.records import messages as records_messages
from tasks.records.rules import Verdict
from tests.helpers.records import message

NOW = 1_700_000_900_000


def _granule(tables, granule_id: str) -> dict | None:
    item = state_store.get_item(tables["granules"], {"granuleId": granule_id})
    return state_store.to_plain(item) if item else None


def _ingest(bodies: list) -> records_messages.IngestReport:
    return records_messages.ingest([b if isinstance(b, str) else json.dumps(b) for b in bodies], now_ms=NOW)


def test_a_start_time_past_year_9999_is_archived_and_the_others_are_written(tables, store_root):
    far = message("completed", "exec-far", 10**20, granule="G2")
    report = _ingest(
        [message("completed", "exec-a", 1000, granule="G1"), far, message("running", "exec-c", 3000, granule="G3")]
    )
    assert [o.ok for o in report.outcomes] == [True, False, True]
    error = {
        "type": "SchemaValidationError",
        "message": "cumulus_meta/workflow_start_time: 100000000000000000000 "
        "is greater than the maximum of 253402300799999",
    }
    assert report.outcomes[1].error == error
    assert dead_letter.read(report.outcomes[1].archived_key)["message"] == far
    assert (_granule(tables, "G1")["status"], _granule(tables, "G3")["status"]) == ("completed", "running")
    # its granule is marked failed with the reason, without the poisonous createdAt (it would make every real
    # event for G2 stale forever)
    g2 = _granule(tables, "G2")
    assert (g2["status"], g2["error"], "createdAt" in g2) == ("failed", error, False)
    assert (
        records_messages.ingest([json.dumps(message("completed", "exec-ok", 5000, granule="G2"))], now_ms=NOW).errors()
        == {}
    )
    assert _granule(tables, "G2")["status"] == "completed"


def test_an_error_cause_over_the_item_limit_is_cut_with_a_visible_mark(tables, store_root):
    huge = message("failed", "exec-a", 1000, granule="G1", error={"Error": "Crash", "Cause": "é" + "x" * 500_000})
    report = _ingest([huge, message("completed", "exec-b", 1000, granule="G2")])
    assert report.errors() == {} and report.counts()["records"]["granule"]["written"] == 2
    assert [r.cut for r in report.outcomes[0].results] == [
        ("error/Cause",),
        (),
        ("error/Cause",),
    ]  # execution, PDR, granule
    cause = _granule(tables, "G1")["error"]["Cause"]
    kept, mark = cause.split("…")
    assert kept == "é" + "x" * (len(kept) - 1) and len(kept) > 150_000
    assert mark == f"[cut {500_002 - len(kept.encode())} of 500002 bytes]"
    assert rules.item_bytes(_granule(tables, "G1")) <= rules.RECORD_BYTES
    execution = state_store.get_item(tables["executions"], {"arn": report.outcomes[0].results[0].key["arn"]})
    assert execution["status"] == "failed" and "…[cut " in execution["error"]["Cause"]
    # a newer running write touches only the status and the times of the record (Cumulus's granule upsert), so
    # its huge queryFields (cut to fit, in case it inserts) never reach the stored record
    newer = message("running", "exec-c", 2000, granule="G1")
    newer["meta"]["granule"] = {"queryFields": {"notes": "q" * 500_000}}
    assert _ingest([newer]).errors() == {}
    g1 = _granule(tables, "G1")
    assert g1["status"] == "running" and "queryFields" not in g1 and g1["error"]["Cause"] == cause
    assert rules.item_bytes(g1) <= rules.RECORD_BYTES


def test_a_batch_over_the_4mb_transaction_limit_is_packed_by_size(tables, store_root, monkeypatch):
    sent = []
    send = state_store._send

    def spy(operation, target, request, **kwargs):
        if operation == "transact":
            sent.append(len(json.dumps(kwargs["TransactItems"], default=str)))
        return send(operation, target, request, **kwargs)

    monkeypatch.setattr(state_store, "_send", spy)
    batch = [
        message("failed", f"exec-{i}", 1000, granule=f"G{i}", error={"Error": "E", "Cause": str(i) * 150_000})
        for i in range(30)
    ]  # 30 granules of ~150 KB (under the cut): ~4.5 MB by count in one transaction
    report = _ingest(batch)
    assert report.errors() == {}
    assert report.counts()["records"] == {
        "granule": {"written": 30, "stale": 0, "rejected": 0},
        "execution": {"written": 30, "stale": 0, "rejected": 0},
        "pdr": {"written": 30, "stale": 0, "rejected": 0},
    }
    assert {g["granuleId"] for g in state_store.scan_all(tables["granules"])} == {f"G{i}" for i in range(30)}
    assert len(sent) >= 4 and max(sent) <= state_store.TRANSACTION_BYTES


def test_next_batch_packs_by_bytes_and_keeps_one_oversized_group_alone():
    def group(key: str, size: int) -> list[dict]:
        return [
            {
                "Update": {
                    "TableName": "t",
                    "Key": {"k": key},
                    "UpdateExpression": "SET #a = :v",
                    "ExpressionAttributeValues": {":v": "x" * size},
                }
            }
        ]

    mb = 1024 * 1024
    groups = [group("a", mb), group("b", mb), group("c", mb), group("d", mb), group("e", 5 * mb), group("f", 10)]
    assert state_store._next_batch([0, 1, 2, 3, 4, 5], groups) == [0, 1, 2, 5]
    assert state_store._next_batch([3, 4], groups) == [3]
    assert state_store._next_batch([4], groups) == [4]  # too big for any transaction: sent alone, DynamoDB says why


@pytest.mark.parametrize(
    "size, shown, error",
    [
        ("1e200", "1e+200", "UnwritableRecord"),
        (str(10**40), str(10**40), "UnwritableRecord"),
        ("NaN", "nan", "SchemaValidationError"),  # Cumulus's API granule schema: a file size is an integer
    ],
)
def test_a_number_dynamodb_cannot_hold_rejects_only_its_message(tables, store_root, size, shown, error):
    odd = json.dumps(message("completed", "exec-odd", 1000, granule="G1")).replace('"size": 100', f'"size": {size}')
    assert repr(json.loads(odd)["payload"]["granules"][0]["files"][0]["size"]) == shown
    report = _ingest([odd, message("completed", "exec-b", 1000, granule="G2")])
    assert report.outcomes[0].error == {
        "type": error,
        "message": "granule files holds a number DynamoDB cannot store (over 38 digits, beyond 1e125, NaN or Infinity)"
        if error == "UnwritableRecord"
        else "payload/granules/0/files/0/size: nan is not of type 'integer'",
    }
    assert dead_letter.read(report.outcomes[0].archived_key)["body"] is None
    if error == "UnwritableRecord":  # not even marked failed: DynamoDB could not hold the record
        assert _granule(tables, "G1") is None
    else:  # the seed: a granule against the schema is marked failed
        assert (_granule(tables, "G1")["status"], _granule(tables, "G1")["error"]) == (
            "failed",
            report.outcomes[0].error,
        )
    assert _granule(tables, "G2")["status"] == "completed"


def test_granule_ids_over_the_key_limit_are_archived_and_the_others_written(tables, store_root):
    wide = "€" * 700  # 700 characters (schema-valid) but 2100 bytes: over DynamoDB's 2048-byte key
    invalid = message("completed", "exec-x", 1000, granule="g" * 3000)  # too long for a key: not even marked failed
    report = _ingest(
        [
            message("completed", "exec-w", 1000, granule=wide),
            invalid,
            message("completed", "exec-b", 1000, granule="G2"),
        ]
    )
    assert report.outcomes[0].error == {
        "type": "UnwritableRecord",
        "message": "granule granuleId is 2100 bytes: over DynamoDB's 2048-byte key limit",
    }
    assert report.outcomes[1].error == {
        "type": "UnwritableRecord",
        "message": "granule granuleId is 3000 bytes: over DynamoDB's 2048-byte key limit",
    }
    assert report.outcomes[1].archived_key
    assert [g["granuleId"] for g in state_store.scan_all(tables["granules"])] == ["G2"]


def test_a_write_dynamodb_refuses_anyway_rejects_only_its_message(tables, store_root):
    """An item grown by attributes written outside the rules: DynamoDB refuses the update (item over 400 KB), the
    batch is written record by record, and only that message is archived with DynamoDB's reason."""
    state_store.put(tables["granules"], {"granuleId": "G1", "collectionId": "MOD09GQ___006", "notes": "n" * 300_000})
    big = message("failed", "exec-a", 1000, granule="G1", error={"Error": "E", "Cause": "c" * 150_000})
    report = _ingest(
        [big, message("completed", "exec-b", 1000, granule="G2"), message("completed", "exec-c", 1000, granule="G3")]
    )
    assert report.outcomes[0].error == {
        "type": "UnwritableRecord",
        "message": "DynamoDB refused the granule write: Item size to update has exceeded the maximum allowed size",
    }
    assert report.outcomes[0].archived_key and [o.ok for o in report.outcomes] == [False, True, True]
    assert [r.verdict for r in report.outcomes[0].results] == [
        Verdict.WRITTEN,
        Verdict.WRITTEN,
        Verdict.REJECTED,
    ]  # execution, PDR, granule
    assert "status" not in _granule(tables, "G1")
    assert (_granule(tables, "G2")["status"], _granule(tables, "G3")["status"]) == ("completed", "completed")
