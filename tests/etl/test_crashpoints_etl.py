"""ETL crash-point sweeps: ingest → merge → flush in a child that dies at a chosen write (DynamoDB or object store,
the merge's publish renames included), then only what the product runs: the event delivered again, the crashed
run reported, `records-reconcile`, `etl remediate` and `etl reprocess` (README), the scheduled flush. Then every
good line is exactly once in the date's merged Parquet, every file completed, no manifest pending or processing,
and `records-reconcile` finds nothing. A second sweep does the same for the timeout hook of `ndjson-merge`
(`_fail_timed_out_merge`), run by the child over manifests a TimedOut run holds with their output published. Two
more cover the paths that give a manifest back to pending: a merge that meets a full disk (`wait_for_space`, the store
a small tmpfs filled up), and `records-prefect-state` re-driving a crashed merge's manifest (`redrive_manifest`)."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections import Counter
from pathlib import Path

import pytest

from deployments.cli import main as cli
from flows.records import records_reconcile
from tasks import reconcile
from tests.helpers.crashpoints import count_writes, crash_points, killed, report, report_crashed_runs, run_child
from tests.helpers.disk import fill, small_disk
from tests.helpers.etl import MISSING_DEPLOYMENT, file_statuses, manifests, merged_rows, records, write_input
from tests.helpers.prefect_runs import crash_event

pytestmark = pytest.mark.crashpoints  # `make test-sweep` takes every write; by hand 3 sampled points

TODAY = "2026-12-31"  # after every crash run's date: the flush takes only pending files of earlier dates
FILES = 3
GOOD_LINES = 3


def ingest_merge_flush(urls: list[str], today: str) -> dict:
    """The child's step: one ingest (a batch of 2 merged inline), then the flush (the third file, merged inline)."""
    from flows.etl import ndjson_flush_orphans, ndjson_ingest

    first = ndjson_ingest(file_urls=urls, merge_deployment=None)
    flushed = ndjson_flush_orphans(today=today, merge_deployment=None)
    return {"ingest": first["manifests"], "flush": flushed["manifests"]}


def _inputs(root: Path, date: str, files: int = FILES) -> list[str]:
    """``files`` tiny files; each has a malformed line among its good ones."""
    return [
        write_input(
            root,
            date,
            f"c-{i}.ndjson",
            [{"id": f"{date}-{i}-{k}", "v": k / 2, "n": {"k": [k]}} for k in range(GOOD_LINES)] + ["{bad"],
        )
        for i in range(files)
    ]


def _recover(date: str, urls: list[str]) -> None:
    """Only what the product runs after a crash, in the README's order."""
    from flows.etl import ndjson_ingest

    report_crashed_runs()  # the worker marks the dead flow run Crashed
    ndjson_ingest(file_urls=urls, merge_deployment=None)  # the unacknowledged event comes again
    _maintain(date)


def _maintain(date: str) -> None:
    """The maintenance the product runs after a crash, once the dead run is reported (README's order)."""
    from flows.etl import ndjson_flush_orphans

    records_reconcile()  # MANIFEST processing under a crashed run → failed
    assert cli(["etl", "remediate", "--date", date, "--older-than-minutes", "0"]) == 0
    assert cli(["etl", "reprocess", "--date", date]) == 0
    ndjson_flush_orphans(today=TODAY, merge_deployment=None, restart_pending_after_seconds=0)


def _check(root: Path, table: str, date: str, urls: list[str]) -> None:
    ids = Counter(row["id"] for row in merged_rows(root, date))
    assert sum(ids.values()) == len(urls) * GOOD_LINES and set(ids.values()) == {1}, ids
    items = {k[1]: v for k, v in records(table).items() if k[0] == date}
    files = Counter(v["status"].split("#")[0] for k, v in items.items() if k.endswith(".ndjson"))
    assert files == {"completed": len(urls)}, items
    assert not [v for k, v in items.items() if k.startswith("MANIFEST#") and v["status"] in ("pending", "processing")]
    assert reconcile.disagreements() == []


@pytest.mark.timeout(1800)  # ~13 s a point on a quiet machine, 30 s on a loaded one: the full sweep has 29 writes
def test_etl_crash_points(etl_env, monkeypatch, tmp_path):
    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", "2")
    root, table = etl_env["root"], etl_env["table"]
    start = dt.date(2026, 3, 1)
    # a first run over fresh tables and store makes writes no later run makes (e.g. the catalog's first entry):
    # the counted run is a second one, like every crash run after it
    first = _inputs(root, (start - dt.timedelta(days=1)).isoformat())
    count_writes(
        "tests.etl.test_crashpoints_etl:ingest_merge_flush", {"urls": first, "today": TODAY}, tmp_path / "w0.log"
    )
    count_date = start.isoformat()
    urls = _inputs(root, count_date)
    writes = count_writes(
        "tests.etl.test_crashpoints_etl:ingest_merge_flush", {"urls": urls, "today": TODAY}, tmp_path / "w.log"
    )
    _check(root, table, count_date, urls)
    kinds = Counter(w.kind for w in writes)
    assert kinds["objects:rename:pipeline"] >= 2  # the publish of each manifest is a crash point
    assert writes[-1].kind.startswith(
        "dynamodb:put:ndjson-parquet-sqs-metrics"
    )  # the flush's metrics row: a crash point too
    points = crash_points(writes)
    for n, point in enumerate(points, start=1):
        date = (start + dt.timedelta(days=n)).isoformat()
        # a crash run on today's date would leave its third file to tomorrow's flush: no write past the merge's
        assert date < TODAY
        urls = _inputs(root, date)
        when = "after" if n % 2 else "before"
        result = run_child(
            "tests.etl.test_crashpoints_etl:ingest_merge_flush", {"urls": urls, "today": TODAY}, f"{point}:kill:{when}"
        )
        assert killed(result), f"write {point} ({writes[point - 1]}): {result.stderr[-2000:]}"
        _recover(date, urls)
        _check(root, table, date, urls)
        print(f"point {point} ({writes[point - 1].kind}, {when}): recovered")
    report(
        f"etl: {len(points)} crash points exercised of {len(writes)} writes ({json.dumps(dict(sorted(kinds.items())))})"
    )


# --------------------------------------------------------------------------- the merge run's timeout hook

TIMEOUT_MESSAGE = "Flow run exceeded timeout of 3 second(s)"  # the words Prefect's engine gives a TimedOut run


def fail_timed_out_merge(flow_run_id: str) -> dict:
    """The child's step: the TimedOut merge run's on-failure hooks (`_fail_timed_out_merge`), as its engine calls
    them in the run's own process once the server holds the TimedOut state."""
    from prefect import get_client

    from flows.etl import ndjson_merge

    os.environ["PREFECT__FLOW_RUN_ID"] = flow_run_id  # what the worker gives the run's process (prefect_ids)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    assert run.state is not None and run.state.name == "TimedOut", run.state
    for hook in ndjson_merge.on_failure_hooks:
        hook(ndjson_merge, run, run.state)
    return {"flow_run": flow_run_id, "state": run.state.name}


def _timed_out_merge_holding(date: str, urls: list[str], monkeypatch) -> str:
    """A merge run that took the date's manifests (its own, named by its parameters, and one more), merged and
    published each, and timed out before their status update (two in flight at ``parallel_manifests`` 2): the
    TimedOut flow run's id, the manifests ``processing`` under it."""
    from prefect import get_client
    from prefect.states import Failed, Running

    from flows.etl import ndjson_ingest, ndjson_merge
    from tasks.etl import ingest as etl
    from tasks.etl import keys as etl_keys
    from tasks.etl import merge as etl_merge

    ndjson_ingest(file_urls=urls, merge_deployment=MISSING_DEPLOYMENT)  # tracked; the manifests left pending
    names = sorted(etl_keys.manifest_name_from_record_key(key) for key in manifests(etl.table_name(etl.TRACKING), date))
    assert len(names) == 2, names
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(
            ndjson_merge,
            parameters={"date_prefix": date, "manifest_name": names[0], "more_manifests": 1, "parallel_manifests": 2},
            state=Running(),
        )
        with monkeypatch.context() as inside:
            inside.setenv("PREFECT__FLOW_RUN_ID", str(run.id))  # the pieces as the flow runs them, under its id
            for name in names:
                taken = etl_merge.start_processing(date, name)
                assert taken is not None and taken["prefect_flow_run_id"] == str(run.id)
                etl_merge.merge_listed(date, name, taken["manifest_path"], etl.settings().output_store_url)
        client.set_flow_run_state(run.id, Failed(name="TimedOut", message=TIMEOUT_MESSAGE), force=True)
    assert etl_merge.processing_under(str(run.id)) == dict.fromkeys(names, date)
    return str(run.id)


@pytest.mark.timeout(900)  # ~12 s a point on a loaded machine: the full sweep has 10 writes, 10 crash states
def test_etl_timeout_hook_crash_points(etl_env, monkeypatch, tmp_path):
    """A crash inside the TimedOut merge run's hook (`_fail_timed_out_merge`): at any of its writes (MANIFEST
    failed, its output removed, its files failed; for each manifest the run held), the product's maintenance ends
    every manifest and file (a manifest left `failed` with its output and files `manifested`: `etl remediate`
    fails the files, `etl reprocess` removes the output and the flush merges them again)."""
    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", "2")
    root, table = etl_env["root"], etl_env["table"]
    start = dt.date(2026, 6, 1)
    files = 2 * 2  # two manifests of two files
    count_date = start.isoformat()
    urls = _inputs(root, count_date, files)
    holder = _timed_out_merge_holding(count_date, urls, monkeypatch)
    writes = count_writes(
        "tests.etl.test_crashpoints_etl:fail_timed_out_merge", {"flow_run_id": holder}, tmp_path / "w"
    )
    kinds = Counter(w.kind for w in writes)
    # per manifest the run held: MANIFEST → failed, its output removed (publish record, part, rejects), its files
    each = [("dynamodb", "update")] + [("objects", "delete")] * 3 + [("dynamodb", "transact")]
    assert [(w.store, w.operation) for w in writes] == each * 2, writes
    held = manifests(table, count_date).values()
    assert [(m["status"], m["error_message"]) for m in held] == [("failed", TIMEOUT_MESSAGE)] * 2
    assert file_statuses(table, count_date) == {"failed": files} and merged_rows(root, count_date) == []
    _maintain(count_date)
    _check(root, table, count_date, urls)
    # the states a crash leaves: before the first write, after each (after the last one: the counted run, just
    # recovered); so before the first chosen point, then after every one but the last (after write 1: the MANIFEST
    # failed, its output and files as they were). At CRASHPOINTS_LIMIT=40 that is every state.
    points = crash_points(writes)
    plans = [(points[0], "before")] + [(point, "after") for point in points[:-1]]
    for n, (point, when) in enumerate(plans, start=1):
        date = (start + dt.timedelta(days=n)).isoformat()
        assert date < TODAY
        urls = _inputs(root, date, files)
        holder = _timed_out_merge_holding(date, urls, monkeypatch)
        result = run_child(
            "tests.etl.test_crashpoints_etl:fail_timed_out_merge", {"flow_run_id": holder}, f"{point}:kill:{when}"
        )
        assert killed(result), f"write {point} ({writes[point - 1]}): {result.stderr[-2000:]}"
        report_crashed_runs()  # the worker finds the run's process dead: the run is TimedOut already, left so
        _maintain(date)
        _check(root, table, date, urls)
        print(f"point {point} ({writes[point - 1].kind}, {when}): recovered")
    report(
        f"etl timeout hook: {len(plans)} crash points exercised of {len(writes)} writes "
        f"({json.dumps(dict(sorted(kinds.items())))})"
    )


# --------------------------------------------------------------------------- a merge that meets a full disk


def merge_on_a_full_disk(date_prefix: str, manifest_name: str) -> dict:
    """The child's step: the manifest's merge run on a store with no space left: its part meets ENOSPC, nothing is
    published and its MANIFEST goes back to pending (`wait_for_space`) until space is freed."""
    from flows.etl import ndjson_merge

    return ndjson_merge(date_prefix=date_prefix, manifest_name=manifest_name)


def _pending_manifest(root: Path, date: str) -> tuple[list[str], str]:
    """``FILES`` files of ``date`` tracked in one manifest left pending (no merge deployment): their URLs and its
    name."""
    from flows.etl import ndjson_ingest
    from tasks.etl import ingest as etl
    from tasks.etl import keys as etl_keys

    urls = _inputs(root, date)
    ndjson_ingest(file_urls=urls, merge_deployment=MISSING_DEPLOYMENT)
    (key,) = manifests(etl.table_name(etl.TRACKING), date)
    return urls, etl_keys.manifest_name_from_record_key(key)


def _crash_states(points: list[int]) -> list[tuple[int, str]]:
    """The states a crash leaves on a short path: before each chosen write, and after the last one (after any
    other: the next write's before, as nothing lands between two writes)."""
    return [(point, "before") for point in points] + [(points[-1], "after")]


def _recover_crashed_merge() -> None:
    """What the product runs once a merge run died: the worker reports it Crashed, prefect.yaml's trigger runs
    `records-prefect-state` for it (a manifest it held back to pending), and the scheduled flush merges what waits."""
    from flows.etl import ndjson_flush_orphans
    from flows.records import records_prefect_state

    for run_id in report_crashed_runs():
        records_prefect_state(crash_event(run_id))
    ndjson_flush_orphans(today=TODAY, merge_deployment=None, restart_pending_after_seconds=0)


@pytest.mark.timeout(900)  # ~10 s a point on a quiet machine
def test_etl_full_disk_merge_crash_points(etl_env, monkeypatch, tmp_path):
    """A merge that meets a full disk, killed in each state its writes leave: the MANIFEST not taken yet; taken, its
    part met ENOSPC (a staged part is no write of the store); back to pending (`wait_for_space`). Once space is
    freed the product's recovery merges every file once and leaves no manifest pending."""
    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", str(FILES))  # one manifest
    root, table = etl_env["root"], etl_env["table"]
    start = dt.date(2026, 8, 1)
    call = "tests.etl.test_crashpoints_etl:merge_on_a_full_disk"
    with small_disk(root, megabytes=16):
        count_date = start.isoformat()
        urls, name = _pending_manifest(root, count_date)
        filler = fill(root)
        writes = count_writes(call, {"date_prefix": count_date, "manifest_name": name}, tmp_path / "w.log")
        filler.unlink()
        (waiting,) = manifests(table, count_date).values()
        assert waiting["status"] == "pending" and "No space left" in waiting["waiting_reason"], waiting
        assert file_statuses(table, count_date) == {"manifested": FILES}  # none failed for the disk
        kinds = Counter(w.kind for w in writes)
        assert writes[-1].kind.startswith("dynamodb:update:"), writes  # `wait_for_space` is the path's last write
        _recover_crashed_merge()
        _check(root, table, count_date, urls)
        plans = _crash_states(crash_points(writes))
        for n, (point, when) in enumerate(plans, start=1):
            date = (start + dt.timedelta(days=n)).isoformat()
            assert date < TODAY
            urls, name = _pending_manifest(root, date)
            filler = fill(root)
            try:
                result = run_child(call, {"date_prefix": date, "manifest_name": name}, f"{point}:kill:{when}")
            finally:
                filler.unlink()  # the operator frees space; the merge waits for it, whoever ends it
            assert killed(result), f"write {point} ({writes[point - 1]}): {result.stderr[-2000:]}"
            _recover_crashed_merge()
            _check(root, table, date, urls)
            print(f"point {point} ({writes[point - 1].kind}, {when}): recovered")
    report(
        f"etl full-disk merge: {len(plans)} crash points exercised of {len(writes)} writes "
        f"({json.dumps(dict(sorted(kinds.items())))})"
    )


# --------------------------------------------------------------------------- a crashed merge's manifest re-driven


def repair_crashed_merge(flow_run_id: str) -> list:
    """The child's step: `records-prefect-state` for a Crashed merge run that held a manifest (prefect.yaml's trigger
    starts it): the manifest back to pending for the next merge run (`redrive_manifest`)."""
    from flows.records import records_prefect_state

    return records_prefect_state(crash_event(flow_run_id))


def _crashed_merge_holding(date: str, urls: list[str], monkeypatch) -> str:
    """A merge run that took the date's one manifest and was killed before it published anything: the Crashed flow
    run's id, the manifest ``processing`` under it."""
    from prefect import get_client
    from prefect.states import Crashed, Running

    from flows.etl import ndjson_ingest, ndjson_merge
    from tasks.etl import ingest as etl
    from tasks.etl import keys as etl_keys
    from tasks.etl import merge as etl_merge

    ndjson_ingest(file_urls=urls, merge_deployment=MISSING_DEPLOYMENT)
    (key,) = manifests(etl.table_name(etl.TRACKING), date)
    name = etl_keys.manifest_name_from_record_key(key)
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(
            ndjson_merge, parameters={"date_prefix": date, "manifest_name": name}, state=Running()
        )
        with monkeypatch.context() as inside:
            inside.setenv("PREFECT__FLOW_RUN_ID", str(run.id))  # taken as the flow takes it, under its run's id
            taken = etl_merge.start_processing(date, name)
            assert taken is not None and taken["prefect_flow_run_id"] == str(run.id)
        client.set_flow_run_state(run.id, Crashed(message="merge process killed (crash-point test)"), force=True)
    return str(run.id)


@pytest.mark.timeout(900)  # ~10 s a point on a quiet machine
def test_etl_redrive_crash_points(etl_env, monkeypatch, tmp_path):
    """`records-prefect-state` re-driving a crashed merge's manifest, killed at each of its writes: the scheduled
    `records-reconcile` re-drives what it left, the flush merges every file once, no manifest is left pending."""
    from flows.etl import ndjson_flush_orphans

    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", str(FILES))  # one manifest
    root, table = etl_env["root"], etl_env["table"]
    start = dt.date(2026, 10, 1)
    call = "tests.etl.test_crashpoints_etl:repair_crashed_merge"
    count_date = start.isoformat()
    urls = _inputs(root, count_date)
    holder = _crashed_merge_holding(count_date, urls, monkeypatch)
    writes = count_writes(call, {"flow_run_id": holder}, tmp_path / "w.log")
    (redriven,) = manifests(table, count_date).values()
    assert redriven["status"] == "pending" and redriven["redrives"] == 1 and redriven["redriven_from"] == holder
    kinds = Counter(w.kind for w in writes)
    ndjson_flush_orphans(today=TODAY, merge_deployment=None, restart_pending_after_seconds=0)
    _check(root, table, count_date, urls)
    plans = _crash_states(crash_points(writes))
    for n, (point, when) in enumerate(plans, start=1):
        date = (start + dt.timedelta(days=n)).isoformat()
        assert date < TODAY
        urls = _inputs(root, date)
        holder = _crashed_merge_holding(date, urls, monkeypatch)
        result = run_child(call, {"flow_run_id": holder}, f"{point}:kill:{when}")
        assert killed(result), f"write {point} ({writes[point - 1]}): {result.stderr[-2000:]}"
        report_crashed_runs()  # the repair's own run, reported Crashed by the worker
        records_reconcile()  # the scheduled backstop: the merge run Crashed, its manifest still processing
        ndjson_flush_orphans(today=TODAY, merge_deployment=None, restart_pending_after_seconds=0)
        _check(root, table, date, urls)
        print(f"point {point} ({writes[point - 1].kind}, {when}): recovered")
    report(
        f"etl redrive: {len(plans)} crash points exercised of {len(writes)} writes "
        f"({json.dumps(dict(sorted(kinds.items())))})"
    )
