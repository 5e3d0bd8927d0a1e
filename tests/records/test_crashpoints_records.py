"""Records crash-point sweep (issue 12): `records-ingest` dies at each write of a small batch, then only what the
product runs recovers: the worker marks the run Crashed, SQS delivers the same batch again, `records-replay-dla`
replays the archive, `records-reconcile` compares Prefect with DynamoDB.

Invariants (docs/design.md, "Fault model"): every message is reflected in the records (written, or superseded
by a newer one) or kept in the dead-letter archive; the records equal those of a run that never crashed;
reconciliation finds 0 disagreements.
"""

from __future__ import annotations

import json

import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName

from flows.records import records_ingest
from tasks import reconcile
from tasks.core import state_store
from tasks.core.runtime import today_iso
from tasks.records import messages as records_messages
from tasks.records.keys import dead_letter_prefix
from tests.helpers.crashpoints import count_writes, crash_points, killed, report, report_crashed_runs, run_child
from tests.helpers.records import message

pytestmark = pytest.mark.crashpoints  # `make test-sweep` takes every write; by hand 3 sampled points

CALL = "flows.records:records_ingest"
VOLATILE = {"timestamp", "updatedAt", "duration"}  # set from the clock of the run that wrote them


def _batch() -> list[str]:
    invalid = message("completed", "exec-x", 3000, granule="G3")
    del invalid["cumulus_meta"]["state_machine"]
    return [
        json.dumps(m) if isinstance(m, dict) else m
        for m in (
            message("running", "exec-a", 1000, granule="G1"),
            message("completed", "exec-a", 1000, granule="G1"),
            message("running", "exec-old", 500, granule="G1"),  # an older attempt: stale
            message("failed", "exec-b", 2000, granule="G2"),
            invalid,  # archived; its granule marked failed
            message("completed", "exec-c", 4000, granule="G2", collection=("OTHER", "001")),  # archived: conflict
            '{"cumulus_meta": ',  # archived: unparsable
        )
    ]


def _state(tables, store_root) -> dict:
    """The records (clock-set fields aside) and the dead-letter archive: what must come out the same."""
    records = {}
    for logical, key in (("granules", "granuleId"), ("executions", "arn"), ("pdrs", "pdrName")):
        for item in state_store.scan_all(tables[logical]):
            records[item[key]] = {k: v for k, v in state_store.to_plain(item).items() if k not in VOLATILE}
    archive = {}
    for path in sorted(store_root.rglob("*.json")):
        entry = json.loads(path.read_text())
        archive[str(path.relative_to(store_root))] = (entry["error"]["type"], entry["attempts"])
    return {"records": records, "archive": archive}


def _clear(tables, store_root) -> None:
    for logical, key in (("granules", "granuleId"), ("executions", "arn"), ("pdrs", "pdrName")):
        state_store.batch_delete(tables[logical], [{key: i[key]} for i in state_store.scan_all(tables[logical])])
    for path in sorted(store_root.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()


def _recover(bodies: list[str]) -> None:
    """Only what the product runs after a crash (the maintenance flows' task bodies, to keep CI's time)."""
    report_crashed_runs()  # the process worker: the dead run is Crashed
    redelivered = records_ingest(bodies)  # SQS: the batch was not deleted, so it comes again, whole
    assert redelivered["messages"] == len(bodies)
    records_messages.replay_archive(today_iso(), None)  # records-replay-dla of today's archive
    assert reconcile.reconcile_rows(None, dry_run=False) == []  # records-reconcile: 0 disagreements
    assert reconcile.disagreements() == []


def _assert_every_message_reflected_or_archived(state: dict, bodies: list[str]) -> None:
    records, day = state["records"], today_iso()
    failed_again = {f"{dead_letter_prefix(day, failed=True)}{records_messages.message_id(b)}.json" for b in bodies[4:]}
    assert set(state["archive"]) == failed_again  # replayed once, failed again, kept with attempts=1
    for body in bodies[:4]:
        msg = json.loads(body)
        granule = records[msg["payload"]["granules"][0]["granuleId"]]
        assert granule["createdAt"] >= msg["cumulus_meta"]["workflow_start_time"]  # written, or superseded
    assert (records["G1"]["status"], records["G1"]["createdAt"]) == ("completed", 1000)
    assert (records["G2"]["status"], records["G2"]["collectionId"]) == ("failed", "MOD09GQ___006")
    assert records["G3"]["status"] == "failed" and records["G3"]["error"]["type"] == "SchemaValidationError"
    executions = {arn.rsplit(":", 1)[1]: r["status"] for arn, r in records.items() if arn.startswith("arn:")}
    assert executions == {"exec-a": "completed", "exec-old": "running", "exec-b": "failed", "exec-c": "completed"}


def _ingest_run_states() -> list[str]:
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["records-ingest"])))
    return sorted(run.state.type.value for run in runs)


@pytest.mark.timeout(900)  # ten child processes; a loaded machine needs the room
def test_records_ingest_crash_points(tables, store_root, tmp_path):
    bodies = _batch()
    writes = count_writes(CALL, {"messages": bodies}, tmp_path / "writes.log")
    _recover(bodies)  # after a run that did not crash, the same steps change nothing
    expected = _state(tables, store_root)
    _assert_every_message_reflected_or_archived(expected, bodies)

    # dying before write N is dying after write N-1 has been answered, so "before" covers both sides but the last
    plans = [f"{n}:kill:before" for n in crash_points(writes)] + [f"{writes[-1].number}:kill:after"]
    for plan in plans:
        _clear(tables, store_root)
        before = _ingest_run_states()
        result = run_child(CALL, {"messages": bodies}, plan, log=tmp_path / "crash.log")
        assert killed(result), f"{plan}: the child was not killed\n{result.stdout[-1000:]}\n{result.stderr[-2000:]}"
        _recover(bodies)
        state = _state(tables, store_root)
        _assert_every_message_reflected_or_archived(state, bodies)
        assert state == expected, plan
        # Prefect agrees: the killed run Crashed, the redelivery Completed
        assert _ingest_run_states() == sorted(before + ["COMPLETED", "CRASHED"]), plan
    report(
        f"records: {len(plans)} crash points exercised of {len(writes)} writes "
        f"({', '.join(sorted({w.kind for w in writes}))})"
    )
