"""A write that landed but whose response was lost is retried by botocore: the retry must read APPLIED (its own
token), never STALE or EXISTS, and must not apply twice (issue 12, item 6).

The loss is real: a botocore ``before-send`` handler sends the first request to DynamoDB Local itself, drops the
response and raises a retryable connection error, so botocore's own retry sends the same request again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from botocore.exceptions import ConnectionClosedError
from botocore.httpsession import URLLib3Session

from tasks.core import state_store
from tasks.core.state_store import Increment, Outcome, to_plain


@contextlib.contextmanager
def lose_first_response(operation: str) -> Iterator[list[int]]:
    """The first ``operation`` request lands in DynamoDB, then its connection drops before the response arrives."""
    landed: list[int] = []

    def send_then_drop(request, **kwargs):
        if landed:
            return None  # the retry goes through normally
        landed.append(URLLib3Session().send(request).status_code)
        raise ConnectionClosedError(endpoint_url=request.url)

    events = state_store.client().meta.events
    events.register_first(f"before-send.dynamodb.{operation}", send_then_drop, unique_id="lose-first-response")
    try:
        yield landed
    finally:
        events.unregister(f"before-send.dynamodb.{operation}", unique_id="lose-first-response")
    assert landed == [200], "the first request did not land"


def test_a_retried_gpu_node_claim_reads_applied_and_the_node_is_not_stranded(tables):
    from tasks.gpu import jobs

    table = tables["ecs_node"]
    state_store.create_if_absent(table, {"node_name": "node-1", "node_status": "AVAILABLE"}, ["node_name"])
    with lose_first_response("UpdateItem"):
        assert jobs.claim_node("node-1", "job-1") is True  # before: False, node ASSIGNED to job-1 with nobody knowing
    node = state_store.get_item(table, {"node_name": "node-1"})
    assert (node["node_status"], node["job_id"]) == ("ASSIGNED", "job-1")
    assert jobs.claim_node("node-1", "job-2") is False  # a real lost race still reads STALE


def test_a_retried_etl_claim_is_won_once(tables):
    table = tables["etl_file_tracking"]
    key = {"date_prefix": "2026-01-01", "file_key": "a.ndjson"}
    state_store.create_if_absent(table, {**key, "status": "pending#0"}, list(key))
    with lose_first_response("UpdateItem"):
        [result] = state_store.transition_many(table, [(key, "pending#0", "manifested#0", {"manifest_path": "m1"})])
    assert result.outcome is Outcome.APPLIED
    [again] = state_store.transition_many(table, [(key, "pending#0", "manifested#0", {"manifest_path": "m2"})])
    assert again.outcome is Outcome.STALE
    assert state_store.get_item(table, key)["manifest_path"] == "m1"


def test_a_retried_create_reads_applied_and_a_real_duplicate_reads_exists(tables):
    table = tables["video_jobs"]
    with lose_first_response("PutItem"):
        assert state_store.create_if_absent(table, {"job_id": "j1", "status": "created"}, ["job_id"]).applied
    assert (
        state_store.create_if_absent(table, {"job_id": "j1", "status": "created"}, ["job_id"]).outcome is Outcome.EXISTS
    )


def test_a_retried_update_without_a_status_change_never_applies_twice(tables):
    table = tables["etl_file_tracking"]
    key = {"date_prefix": "2026-01-01", "file_key": "SEQUENCE#"}
    state_store.create_if_absent(table, {**key, "sequence": 0}, list(key))
    with lose_first_response("UpdateItem"):
        assert state_store.transition(table, key, None, None, add={"sequence": 5}).applied
    assert state_store.get_item(table, key)["sequence"] == 5  # before: 10, the retry added again


@pytest.mark.parametrize("many", [False, True])
def test_a_retried_transaction_is_applied_once(tables, many):
    """TransactWriteItems: botocore's ClientRequestToken, and the write token in the entries' conditions."""
    table = tables["phspectra_runs"]
    run = {"PK": "r1", "SK": "RUN"}
    state_store.create_if_absent(table, {**run, "jobs_completed": 0}, ["PK", "SK"])
    chunks = [{"PK": "r1", "SK": f"CHUNK#chunk-000000{i}"} for i in range(2)]
    for chunk in chunks:
        state_store.create_if_absent(table, {**chunk, "status": "IN_PROGRESS"}, ["PK", "SK"])
    with lose_first_response("TransactWriteItems"):
        if many:
            results = state_store.transition_many(table, [(c, "IN_PROGRESS", "COMPLETED", None) for c in chunks])
        else:
            results = [
                state_store.transition(
                    table,
                    chunks[0],
                    "IN_PROGRESS",
                    "COMPLETED",
                    increments=[Increment(table, run, {"jobs_completed": 1})],
                )
            ]
    assert [r.outcome for r in results] == [Outcome.APPLIED] * len(results)
    done = chunks if many else chunks[:1]
    assert [to_plain(state_store.get_item(table, c))["status"] for c in done] == ["COMPLETED"] * len(done)
    assert to_plain(state_store.get_item(table, run))["jobs_completed"] == (0 if many else 1)
