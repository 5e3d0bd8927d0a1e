"""Seed 004 write rules on a real DynamoDB Local: stale-write guards, permutations, concurrency, other kinds."""

from __future__ import annotations

import itertools
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tasks.core import state_store
from tasks.records import messages as records_messages
from tasks.records import rules as records
from tasks.records.rules import COMPLETED, EXECUTION, FAILED, GRANULE, QUEUED, RUNNING, RecordKind, Verdict
from tests.helpers.records import STATE_MACHINE, message

NOW = 1_700_000_900_000


def granule(tables, granule_id="G1") -> dict | None:
    item = state_store.get_item(tables["granules"], {"granuleId": granule_id})
    return state_store.to_plain(item) if item else None


def expected_granule(msg: dict, granule_id: str | None = None) -> dict:
    granules = records_messages.derive(msg, NOW)[1]
    record = {k: v for k, v in granules[0].items() if v is not None}
    if granule_id:
        record["granuleId"] = granule_id
    return record


def test_derived_fields_follow_the_seed_table():
    msg = message("completed", "exec-a", 1_700_000_000_000, extra_ignored=None)
    msg["cumulus_meta"]["workflow_stop_time"] = 1_700_000_600_000
    msg["meta"]["granule"] = {"queryFields": {"cnm": "x"}}
    msg["payload"]["granules"][0]["sync_granule_duration"] = 1500
    execution, granules, problems = records_messages.derive(msg, NOW)
    assert problems == []
    assert granules == [
        {
            "collectionId": "MOD09GQ___006",
            "timestamp": NOW,
            "updatedAt": NOW,
            "duration": 900.0,
            "processingStartDateTime": "2023-11-14T22:13:20.000+00:00",
            "processingEndDateTime": "2023-11-14T22:23:20.000+00:00",
            "granuleId": "G1",
            "status": "completed",
            "execution": "arn:aws:states:us-east-1:123456789012:execution:IngestGranule:exec-a",
            "createdAt": 1_700_000_000_000,
            "error": {},
            "files": [{"fileName": "a.hdf", "size": 100}, {"fileName": "a.xml", "size": 23}],
            "productVolume": "123",  # Cumulus's API record: text
            "pdrName": "p.PDR",
            "provider": "prov",
            "published": False,
            "queryFields": {"cnm": "x"},
            "timeToArchive": 0.0,
            "timeToPreprocess": 1.5,
        }
    ]
    assert execution["arn"] == granules[0]["execution"] and execution["status"] == "completed"
    msg["payload"]["granules"][0]["files"] = None
    assert records_messages.derive(msg, NOW)[1][0]["files"] == []
    # createdAt: workflow_start_time, else the granule's own createdAt; neither is a schema error of the granule
    del msg["cumulus_meta"]["workflow_start_time"]
    msg["payload"]["granules"][0]["createdAt"] = 1_650_000_000_000
    records_messages.validate(msg)
    assert records_messages.derive(msg, NOW)[1][0]["createdAt"] == 1_650_000_000_000
    del msg["payload"]["granules"][0]["createdAt"]
    records_messages.validate(msg)
    (problem,) = records_messages.derive(msg, NOW)[2]
    assert problem.problems == [
        "payload/granules/0: no createdAt (neither cumulus_meta.workflow_start_time nor granule.createdAt)"
    ]


def test_terminal_write_then_stale_running_and_older_completed_are_dropped(tables):
    done = message("completed", "exec-b", 2000)
    report = records_messages.ingest([done], now_ms=NOW)
    assert report.counts()["records"] == {
        "granule": {"written": 1, "stale": 0, "rejected": 0},
        "execution": {"written": 1, "stale": 0, "rejected": 0},
        "pdr": {"written": 1, "stale": 0, "rejected": 0},
    }
    late = records_messages.ingest(
        [message("running", "exec-b", 2000), message("completed", "exec-a", 1000)], now_ms=NOW + 5
    )
    reasons = [r.reason for o in late.outcomes for r in o.results if r.kind == "granule"]
    assert [r.verdict for o in late.outcomes for r in o.results if r.kind == "granule"] == [
        Verdict.STALE,
        Verdict.STALE,
    ]
    assert reasons == [
        f"execution {STATE_MACHINE.replace('stateMachine', 'execution')}:exec-b is already completed "
        "(running write dropped)",
        "older createdAt (1000 < 2000)",
    ]
    assert granule(tables) == expected_granule(done)
    assert late.errors() == {}  # stale drops are not errors


def test_running_write_touches_only_status_and_timestamps(tables):
    records_messages.ingest([message("failed", "exec-a", 1000)], now_ms=NOW)
    before = granule(tables)
    newer = message("running", "exec-b", 2000, granule="G1")
    newer["payload"]["granules"][0]["files"] = [{"fileName": "other", "size": 5}]
    records_messages.ingest([newer], now_ms=NOW + 1)
    after = granule(tables)
    changed = {k for k in after if after[k] != before.get(k)}
    assert changed == {"status", "createdAt", "timestamp", "updatedAt"}
    assert after["status"] == "running" and after["files"] == before["files"] and after["error"] == before["error"]


def test_queued_dropped_once_execution_exists_and_running_dropped_once_execution_finished(tables):
    records_messages.ingest([message("running", "exec-a", 1000)], now_ms=NOW)
    queued = records_messages.ingest([message("queued", "exec-a", 1000)], now_ms=NOW)
    assert queued.outcomes[0].results[0].verdict is Verdict.STALE
    assert "already exists" in queued.outcomes[0].results[0].reason
    # the execution finishes through another granule; a late running event for G1 is dropped by the check
    records_messages.ingest([message("completed", "exec-a", 1000, granule="G2")], now_ms=NOW)
    late = records_messages.ingest([message("running", "exec-a", 1000, granule="G1")], now_ms=NOW)
    assert late.outcomes[0].results[-1].verdict is Verdict.STALE  # the granule's: written last, as in the seed
    assert "is already completed" in late.outcomes[0].results[-1].reason
    assert granule(tables)["status"] == "running"


def test_same_granule_id_in_another_collection_is_rejected_and_archived(tables, store_root):
    records_messages.ingest([message("completed", "exec-a", 1000)], now_ms=NOW)
    other = message("completed", "exec-z", 5000, collection=("OTHER", "001"))
    report = records_messages.ingest([other], now_ms=NOW)
    outcome = report.outcomes[0]
    assert outcome.results[-1].verdict is Verdict.REJECTED
    assert outcome.error == {
        "type": "GranuleCollectionConflict",
        "message": "G1 already exists under collectionId 'MOD09GQ___006', not 'OTHER___001'",
    }
    assert outcome.archived_key is not None and (store_root / outcome.archived_key).is_file()
    assert granule(tables)["collectionId"] == "MOD09GQ___006" and granule(tables)["createdAt"] == 1000


def _permutation_messages(order_index: int) -> list[dict]:
    g = f"G-{order_index:03d}"
    a, b = f"A-{order_index:03d}", f"B-{order_index:03d}"
    return [
        message("queued", a, 1000, granule=g),
        message("running", a, 1000, granule=g),
        message("completed", a, 1000, granule=g),
        message("queued", b, 2000, granule=g),
        message("running", b, 2000, granule=g),
        message("failed", b, 2000, granule=g),
    ]


def test_every_order_ends_at_newest_terminal_and_no_light_write_overwrites_terminal(tables):
    """100 shuffled orders of 6 messages, one granule per order, applied step by step in bulk."""
    rng = random.Random(7)
    all_orders = list(itertools.permutations(range(6)))
    chosen = rng.sample(all_orders, 100)
    sets = [_permutation_messages(i) for i in range(len(chosen))]
    snapshots: dict[str, dict] = {}
    stale = light_after_terminal = 0
    for step in range(6):
        batch = [sets[i][order[step]] for i, order in enumerate(chosen)]
        report = records_messages.ingest(batch, now_ms=NOW)
        assert report.errors() == {}
        stale += sum(c["stale"] for c in report.counts()["records"].values())
        now = {g["granuleId"]: state_store.to_plain(g) for g in state_store.scan_all(tables["granules"])}
        for i, order in enumerate(chosen):
            gid = f"G-{i:03d}"
            msg = sets[i][order[step]]
            previous, applied = snapshots.get(gid), msg["meta"]["status"]
            # a light write never overwrites a terminal record of its own or a newer attempt (a newer attempt,
            # e.g. a re-ingest, may legitimately start over an older terminal record: the seed's rule)
            if (
                previous
                and previous["status"] in ("completed", "failed")
                and applied in ("queued", "running")
                and previous["createdAt"] >= msg["cumulus_meta"]["workflow_start_time"]
            ):
                assert now[gid] == previous, f"order {order} step {step}: {applied} overwrote {previous['status']}"
                light_after_terminal += 1
        snapshots = now
    for i in range(len(chosen)):
        assert snapshots[f"G-{i:03d}"] == expected_granule(sets[i][5])
    executions = {e["arn"].rsplit(":", 1)[1]: e["status"] for e in state_store.scan_all(tables["executions"])}
    assert {executions[f"A-{i:03d}"] for i in range(len(chosen))} == {"completed"}
    assert {executions[f"B-{i:03d}"] for i in range(len(chosen))} == {"failed"}
    assert stale > 0 and light_after_terminal > 80  # the invariant was exercised, not vacuous


def test_concurrent_shuffled_writers_end_at_newest_terminal(tables):
    """Eight threads apply the six messages in different orders to the same granule at the same time."""
    msgs = _permutation_messages(0)
    orders = [random.Random(seed).sample(range(6), 6) for seed in range(8)]
    barrier = threading.Barrier(len(orders))

    def apply(order):
        state_store.reset_clients()
        barrier.wait()
        for index in order:
            records_messages.ingest([msgs[index]], now_ms=NOW)

    with ThreadPoolExecutor(len(orders)) as pool:
        list(pool.map(apply, orders))
    assert granule(tables, "G-000") == expected_granule(msgs[5])


def test_bulk_batch_keeps_per_record_order(tables):
    """Messages for one granule and one execution in a single batch behave as if written one by one."""
    msgs = _permutation_messages(1)
    order = [3, 4, 5, 0, 1, 2]  # B queued, running, failed, then A's older messages
    report = records_messages.ingest([msgs[i] for i in order], now_ms=NOW)
    verdicts = [o.results[-1].verdict.value for o in report.outcomes]  # the granule's (written last)
    assert verdicts == ["written", "written", "written", "stale", "stale", "stale"]
    assert granule(tables, "G-001") == expected_granule(msgs[5])


# another record kind through the same writer: chunk-like items with their own status names (queued=PENDING, ...)
CHUNK_LIKE = RecordKind(
    "phspectra-chunk",
    "phspectra_runs",
    ("PK", "SK"),
    created_attr="created_at",
    light_attrs=("started_at", "prefect_flow_run_id", "prefect_task_run_id"),
    terminal_removes=("error",),
    statuses={QUEUED: "PENDING", RUNNING: "IN_PROGRESS", COMPLETED: "COMPLETED", FAILED: "FAILED"},
)


CHUNK_KEY = {"PK": "run-1", "SK": "CHUNK#chunk-0000000"}


def chunk(status: str, created: str, **extra) -> dict:
    return {
        **CHUNK_KEY,
        "status": status,
        "created_at": created,
        "chunk_key": "chunks/run-1/chunk-0000000.npz",
        **extra,
    }


def test_generic_writer_on_phspectra_chunk_records(tables):
    """The same rules on another record kind: seed 000 chunk items with ISO created_at and their own statuses."""
    table = tables["phspectra_runs"]
    attempts = [
        chunk("PENDING", "2026-01-01T00:00:00Z"),
        chunk("IN_PROGRESS", "2026-01-01T00:00:00Z", started_at="t1", prefect_task_run_id="tr-1"),
        chunk("FAILED", "2026-01-01T00:00:00Z", error="timeout"),
        chunk("PENDING", "2026-01-02T00:00:00Z"),
        chunk("IN_PROGRESS", "2026-01-02T00:00:00Z", started_at="t2", prefect_task_run_id="tr-2"),
        chunk("COMPLETED", "2026-01-02T00:00:00Z", output_key="out.parquet", duration_ms=5),
    ]
    orders = random.Random(3).sample(list(itertools.permutations(range(6))), 100)
    keys = [{"PK": f"run-{n:03d}", "SK": CHUNK_KEY["SK"]} for n in range(len(orders))]
    snapshot: dict[str, dict] = {}
    guarded = 0
    for step in range(6):
        batch = [{**attempts[order[step]], **key} for order, key in zip(orders, keys)]
        results = records.write_many(CHUNK_LIKE, batch, table)
        now = {i["PK"]: i for i in state_store.scan_all(table)}
        for record, result in zip(batch, results):
            before = snapshot.get(record["PK"])
            if (
                before
                and before["status"] in ("COMPLETED", "FAILED")
                and record["status"] in ("PENDING", "IN_PROGRESS")
                and before["created_at"] >= record["created_at"]
            ):
                assert now[record["PK"]] == before and result.verdict is Verdict.STALE
                guarded += 1
        snapshot = now
    newest = {k: v for k, v in attempts[5].items() if k != "PK"}
    for key in keys:
        final = state_store.to_plain(snapshot[key["PK"]])
        # the newest terminal state, plus at most the fields its own attempt's light writes inserted first
        assert {k: final[k] for k in newest} == newest
        assert set(final) - set(newest) <= {"PK", "started_at", "prefect_task_run_id"}
    assert guarded > 50


def test_unknown_status_and_missing_scope_are_clear_errors(tables):
    with pytest.raises(ValueError, match="unknown status 'DONE'"):
        records.write(CHUNK_LIKE, chunk("DONE", "x"), tables["phspectra_runs"])
    with pytest.raises(ValueError, match="no collectionId"):
        records.write(GRANULE, {"granuleId": "g", "status": "completed", "createdAt": 1}, tables["granules"])
    assert EXECUTION.role("running") == "running"
