"""Dead-letter archive and replay through the real flows, on DynamoDB Local and a local object store."""

from __future__ import annotations

import json

import pytest

from flows.records import records_ingest, records_replay_dla
from tasks.core import state_store
from tasks.core.runtime import today_iso
from tasks.records import dead_letter
from tasks.records import messages as records_messages
from tasks.records.keys import dead_letter_prefix
from tests.helpers.records import message

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

NOW_MS = 1_700_000_900_000


def _archive_listing(root, prefix):
    base = root / prefix
    return sorted(p.name for p in base.iterdir()) if base.exists() else []


def test_rejected_messages_are_archived_and_replay_writes_fixed_ones_and_moves_the_rest(tables, store_root):
    good = message("completed", "exec-1", 1000, granule="G1")
    invalid = message("completed", "exec-2", 2000, granule="G2")
    del invalid["cumulus_meta"]["state_machine"]
    invalid["payload"]["granules"][0]["files"] = [{"fileName": "x", "size": -4}]
    fixed_body = json.dumps(message("completed", "exec-3", 3000, granule="G3"))
    unparsable = fixed_body[:-5]  # truncated JSON, as a broken queue body would be
    conflict = message("completed", "exec-4", 4000, granule="G1", collection=("OTHER", "002"))

    bodies = {
        "good": json.dumps(good),
        "invalid": json.dumps(invalid),
        "unparsable": unparsable,
        "conflict": json.dumps(conflict),
    }  # text bodies, as SQS delivers them
    summary = records_ingest(list(bodies.values()))
    assert (summary["messages"], summary["ok"], summary["archived"]) == (4, 1, 3)
    day = today_iso()
    ids = {name: records_messages.message_id(bodies[name]) for name in ("invalid", "unparsable", "conflict")}
    assert _archive_listing(store_root, dead_letter_prefix(day)) == sorted(f"{i}.json" for i in ids.values())

    entries = {name: dead_letter.read(f"{dead_letter_prefix(day)}{i}.json") for name, i in ids.items()}
    assert entries["invalid"]["error"] == {
        "type": "SchemaValidationError",
        "message": "cumulus_meta: 'state_machine' is a required property",
    }
    assert entries["invalid"]["message"] == invalid and entries["invalid"]["body"] is None
    assert entries["unparsable"]["error"]["type"] == "UnparsableMessage"
    assert entries["unparsable"]["error"]["message"].startswith("message body is not JSON: ")
    assert entries["unparsable"]["body"] == unparsable and entries["unparsable"]["message"] is None
    assert entries["conflict"]["error"] == {
        "type": "GranuleCollectionConflict",
        "message": "G1 already exists under collectionId 'MOD09GQ___006', not 'OTHER___002'",
    }
    # the invalid message's granule could be identified: it is failed, with the error
    g2 = state_store.to_plain(state_store.get_item(tables["granules"], {"granuleId": "G2"}))
    assert (g2["status"], g2["collectionId"], g2["createdAt"], g2["error"]) == (
        "failed",
        "MOD09GQ___006",
        2000,
        entries["invalid"]["error"],
    )
    assert state_store.get_item(tables["granules"], {"granuleId": "G3"}) is None

    # an operator fixes two of them in the archive; the collection conflict stays
    repaired = dict(
        entries["invalid"],
        message={
            **invalid,
            "cumulus_meta": {
                **invalid["cumulus_meta"],
                "state_machine": "arn:aws:states:us-east-1:1:stateMachine:Fixed",
            },
        },
    )
    repaired["message"]["payload"] = {"granules": [{"granuleId": "G2", "files": [{"fileName": "x", "size": 4}]}]}
    (store_root / f"{dead_letter_prefix(day)}{ids['invalid']}.json").write_text(json.dumps(repaired))
    (store_root / f"{dead_letter_prefix(day)}{ids['unparsable']}.json").write_text(
        json.dumps(dict(entries["unparsable"], body=fixed_body))
    )

    result = records_replay_dla(day)
    assert sorted(result["written"]) == sorted([ids["invalid"], ids["unparsable"]])
    assert result["failed"] == {ids["conflict"]: f"dead-letter-archive/failed/{day}/{ids['conflict']}.json"}
    assert _archive_listing(store_root, dead_letter_prefix(day)) == []
    assert _archive_listing(store_root, dead_letter_prefix(day, failed=True)) == [f"{ids['conflict']}.json"]
    moved = dead_letter.read(result["failed"][ids["conflict"]])
    assert moved["attempts"] == 1 and moved["previous_errors"] == [entries["conflict"]["error"]]
    assert moved["message"] == conflict

    granules = {g["granuleId"]: state_store.to_plain(g) for g in state_store.scan_all(tables["granules"])}
    assert {g: (r["status"], r["collectionId"]) for g, r in granules.items()} == {
        "G1": ("completed", "MOD09GQ___006"),
        "G2": ("completed", "MOD09GQ___006"),
        "G3": ("completed", "MOD09GQ___006"),
    }
    assert granules["G2"]["productVolume"] == "4" and granules["G2"]["error"] == {}


def test_replay_of_a_subset_and_of_unknown_ids(tables, store_root):
    bad = ["{oops", "[1, 2]"]
    report = records_messages.ingest(bad, now_ms=NOW_MS)
    assert [o.error["type"] for o in report.outcomes] == ["UnparsableMessage", "UnparsableMessage"]
    assert report.outcomes[1].error["message"] == "message body is JSON list, not an object"
    day = today_iso()
    first = report.outcomes[0].id
    with pytest.raises(LookupError, match="not in dead-letter-archive/"):
        records_replay_dla(day, ["msg-does-not-exist"])
    result = records_replay_dla(day, [first])
    assert result["written"] == [] and list(result["failed"]) == [first]
    # the other one was not touched
    assert _archive_listing(store_root, dead_letter_prefix(day)) == [f"{report.outcomes[1].id}.json"]


def test_sample_messages_through_the_cli(tables, store_root, tmp_path, capsys):
    from deployments import cli
    from deployments.samples import records as sample

    sample.make(tmp_path)
    assert cli.main(["records", "ingest", "--file", str(tmp_path / "records" / "messages.json")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["messages"], summary["ok"], summary["archived"]) == (6, 4, 2)
    assert summary["records"]["granule"] == {
        "written": 5,
        "stale": 3,
        "rejected": 0,
    }  # 5 = 2 running + 2 completed + 1 marked failed
    text = sample.report()
    assert (
        "MOD09GQ.A2017025.h21v00.006: completed collection=MOD09GQ___006 createdAt=1700000000000 productVolume=1050"
        in text
    )
    assert "  execution demo-exec-1: completed" in text
    assert "MOD09GQ.A2017025.h21v02.006: failed" in text  # invalid message, identifiable granule
    assert cli.main(["records", "dla-list"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert sorted(e["error"]["type"] for e in listing) == ["SchemaValidationError", "UnparsableMessage"]
    assert cli.main(["records", "dla-show", "--id", "msg-nope"]) == 2
    assert "no archived message" in capsys.readouterr().err
    assert cli.main(["records", "reconcile"]) == 0
    assert json.loads(capsys.readouterr().out) == []
