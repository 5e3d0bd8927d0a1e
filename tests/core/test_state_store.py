"""The state store against a real DynamoDB Local."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError

from tasks.core import state_store as store
from tasks.core.state_store import Condition, Increment, Outcome


def test_create_if_absent_twice_leaves_one_item(tables):
    name = tables["ecs_job"]
    first = store.create_if_absent(name, {"job_id": "j1", "job_status": "IN_PROGRESS"}, ["job_id"])
    second = store.create_if_absent(name, {"job_id": "j1", "job_status": "COMPLETE"}, ["job_id"])
    assert first.outcome is Outcome.APPLIED
    assert second.outcome is Outcome.EXISTS
    assert second.item == {"job_id": "j1", "job_status": "IN_PROGRESS"}
    items = list(store.scan_all(name))
    assert items == [{"job_id": "j1", "job_status": "IN_PROGRESS"}]


def test_transition_from_wrong_state_is_stale_and_changes_nothing(tables):
    name = tables["ecs_job"]
    store.create_if_absent(name, {"job_id": "j1", "job_status": "COMPLETE", "retry": "0"}, ["job_id"])
    result = store.transition(
        name, {"job_id": "j1"}, "IN_PROGRESS", "FAILED", status_attr="job_status", set={"retry": "1"}
    )
    assert result.outcome is Outcome.STALE
    assert not result
    assert result.item["job_status"] == "COMPLETE"
    assert store.get_item(name, {"job_id": "j1"}) == {"job_id": "j1", "job_status": "COMPLETE", "retry": "0"}


def test_transition_on_missing_item_is_stale_and_creates_nothing(tables):
    name = tables["ecs_job"]
    result = store.transition(name, {"job_id": "ghost"}, "IN_PROGRESS", "FAILED", status_attr="job_status")
    assert result.outcome is Outcome.STALE and result.item is None
    assert store.get_item(name, {"job_id": "ghost"}) is None


def test_transition_accepts_any_of_several_expected_states(tables):
    name = tables["ecs_job"]
    store.create_if_absent(name, {"job_id": "j1", "job_status": "RESTARTING"}, ["job_id"])
    result = store.transition(
        name, {"job_id": "j1"}, ["IN_PROGRESS", "RESTARTING"], "IN_PROGRESS", status_attr="job_status"
    )
    assert result.applied and result.item["job_status"] == "IN_PROGRESS"


def test_counter_moves_once_when_transition_is_retried_five_times(tables):
    runs = tables["phspectra_runs"]
    store.create_if_absent(runs, {"PK": "r1", "SK": "RUN", "jobs_completed": 0}, ["PK", "SK"])
    store.create_if_absent(runs, {"PK": "r1", "SK": "CHUNK#chunk-0000000", "status": "IN_PROGRESS"}, ["PK", "SK"])
    results = [
        store.transition(
            runs,
            {"PK": "r1", "SK": "CHUNK#chunk-0000000"},
            "IN_PROGRESS",
            "COMPLETED",
            set={"duration_ms": 12},
            increments=[Increment(runs, {"PK": "r1", "SK": "RUN"}, {"jobs_completed": 1})],
        )
        for _ in range(5)
    ]
    assert [r.outcome for r in results] == [Outcome.APPLIED] + [Outcome.STALE] * 4
    assert results[1].item["status"] == "COMPLETED"
    assert store.get_item(runs, {"PK": "r1", "SK": "RUN"})["jobs_completed"] == 1


def _race(tables, n_items: int, claim_order) -> dict[int, list[str]]:
    """8 threads each try to claim all ``n_items`` pending files; returns what each thread won."""
    name = tables["etl_file_tracking"]
    keys = [{"date_prefix": "2026-02-01", "file_key": f"f-{i:04d}.ndjson"} for i in range(n_items)]
    store.batch_put(name, ({**k, "status": "pending#0"} for k in keys))
    won: dict[int, list[str]] = {w: [] for w in range(8)}
    barrier = threading.Barrier(8)

    def claim(worker: int) -> None:
        order = keys if worker % 2 else list(reversed(keys))
        barrier.wait()
        won[worker] = claim_order(name, order, worker)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(claim, range(8)))
    items = list(
        store.query_all(name, KeyConditionExpression="date_prefix = :d", ExpressionAttributeValues={":d": "2026-02-01"})
    )
    assert len(items) == n_items and all(item["status"] == "manifested#0" for item in items)
    owners = {item["file_key"]: item["claimed_by"] for item in items}
    for worker, files in won.items():  # what a thread was told it won is what the table says it owns
        assert all(owners[f] == str(worker) for f in files)
    claimed = [f for files in won.values() for f in files]
    assert sorted(claimed) == sorted(k["file_key"] for k in keys)  # each exactly once
    return won


def test_eight_threads_claim_a_thousand_items_each_exactly_once(tables):
    def claim_in_transactions(name, order, worker):
        results = store.transition_many(
            name, [(k, "pending#0", "manifested#0", {"claimed_by": str(worker)}) for k in order]
        )
        return [k["file_key"] for k, r in zip(order, results) if r.applied]

    won = _race(tables, 1000, claim_in_transactions)
    assert sum(len(files) for files in won.values()) == 1000


def test_eight_threads_racing_single_item_claims(tables):
    def claim_one_by_one(name, order, worker):
        return [
            k["file_key"]
            for k in order
            if store.transition(name, k, "pending#0", "manifested#0", set={"claimed_by": str(worker)}).applied
        ]

    _race(tables, 200, claim_one_by_one)


def test_create_many_if_absent_reports_each_item(tables):
    name = tables["etl_file_tracking"]
    store.create_if_absent(
        name, {"date_prefix": "d", "file_key": "f-0005", "status": "pending#1"}, ["date_prefix", "file_key"]
    )
    items = [{"date_prefix": "d", "file_key": f"f-{i:04d}", "status": "pending#2"} for i in range(250)]
    results = store.create_many_if_absent(name, items, ["date_prefix", "file_key"])
    assert [r.outcome for r in results].count(Outcome.APPLIED) == 249
    assert results[5].outcome is Outcome.EXISTS and results[5].item["status"] == "pending#1"
    again = store.create_many_if_absent(name, items, ["date_prefix", "file_key"])
    assert all(r.outcome is Outcome.EXISTS for r in again)


def test_dynamodb_local_rejects_a_filter_expression_on_a_key_attribute(tables):
    name = tables["etl_file_tracking"]
    with pytest.raises(ClientError) as error:
        store.table(name).query(
            KeyConditionExpression="date_prefix = :d",
            FilterExpression="begins_with(file_key, :m)",
            ExpressionAttributeValues={":d": "2026-02-01", ":m": "MANIFEST#"},
        )
    assert error.value.response["Error"]["Code"] == "ValidationException"
    assert "key attribute" in error.value.response["Error"]["Message"].lower()


def test_query_all_follows_pages_and_filters_in_code(tables):
    name = tables["etl_file_tracking"]
    store.batch_put(
        name,
        ({"date_prefix": "d", "file_key": f"f{i:03d}", "status": "pending#1", "pad": "x" * 4000} for i in range(400)),
    )
    store.put(name, {"date_prefix": "d", "file_key": "MANIFEST#batch-1.json", "status": "pending"})
    items = list(
        store.query_all(
            name,
            keep=lambda item: not item["file_key"].startswith("MANIFEST#"),
            KeyConditionExpression="date_prefix = :d",
            ExpressionAttributeValues={":d": "d"},
        )
    )
    assert len(items) == 400  # > 1 MB: needs several pages


def test_guarded_put_and_delete(tables):
    name = tables["video_reassembly_locks"]
    store.create_if_absent(name, {"job_id": "j"}, ["job_id"])
    cond = Condition("attribute_not_exists(#s)", {"#s": "reassembly_started_at"})
    first = store.transition(name, {"job_id": "j"}, None, None, set={"reassembly_started_at": "t1"}, condition=cond)
    second = store.transition(name, {"job_id": "j"}, None, None, set={"reassembly_started_at": "t2"}, condition=cond)
    assert first.applied and second.outcome is Outcome.STALE
    assert store.get_item(name, {"job_id": "j"})["reassembly_started_at"] == "t1"
    assert (
        store.delete_if(
            name, {"job_id": "j"}, Condition("#s = :t", {"#s": "reassembly_started_at"}, {":t": "nope"})
        ).outcome
        is Outcome.STALE
    )
    assert store.delete_if(name, {"job_id": "j"}).applied
    assert store.get_item(name, {"job_id": "j"}) is None


def test_get_many_reads_past_one_request_skips_absent_and_duplicate_keys_and_hides_the_token(tables):
    name = tables["ecs_job"]
    written = [{"job_id": f"j{i:03d}", "job_status": "IN_PROGRESS"} for i in range(150)]
    assert all(r.applied for r in store.create_many_if_absent(name, written, ["job_id"]))  # token-carrying puts
    keys = [{"job_id": f"j{i:03d}"} for i in range(0, 160, 1)] + [{"job_id": "j007"}]  # 10 absent, 1 twice
    found = store.get_many(name, keys)
    assert sorted(found, key=lambda i: i["job_id"]) == written  # more than BatchGetItem's 100 keys, no token
    assert store.get_many(name, []) == []
