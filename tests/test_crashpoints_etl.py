"""ETL crash-point sweep: ingest → merge → flush in a child that dies at a chosen write (DynamoDB or object store,
the merge's publish renames included), then only what the product runs: the event delivered again, the crashed
run reported, `records-reconcile`, `etl remediate` and `etl reprocess` (README), the scheduled flush. Then every
good line is exactly once in the date's merged Parquet, every file completed, no manifest pending or processing,
and `records-reconcile` finds nothing."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path

import pytest

from deployments.cli import main as cli
from flows.records import records_reconcile
from tasks import reconcile
from tests.helpers.crashpoints import count_writes, crash_points, killed, report, report_crashed_runs, run_child
from tests.helpers.etl import merged_rows, records, write_input

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


def _inputs(root: Path, date: str) -> list[str]:
    """Three tiny files; each has a malformed line among its good ones."""
    return [
        write_input(
            root,
            date,
            f"c-{i}.ndjson",
            [{"id": f"{date}-{i}-{k}", "v": k / 2, "n": {"k": [k]}} for k in range(GOOD_LINES)] + ["{bad"],
        )
        for i in range(FILES)
    ]


def _recover(date: str, urls: list[str]) -> None:
    """Only what the product runs after a crash, in the README's order."""
    from flows.etl import ndjson_flush_orphans, ndjson_ingest

    report_crashed_runs()  # the worker marks the dead flow run Crashed
    ndjson_ingest(file_urls=urls, merge_deployment=None)  # the unacknowledged event comes again
    records_reconcile()  # MANIFEST processing under a crashed run → failed
    assert cli(["etl", "remediate", "--date", date, "--older-than-minutes", "0"]) == 0
    assert cli(["etl", "reprocess", "--date", date]) == 0
    ndjson_flush_orphans(today=TODAY, merge_deployment=None, restart_pending_after_seconds=0)


def _check(root: Path, table: str, date: str, urls: list[str]) -> None:
    ids = Counter(row["id"] for row in merged_rows(root, date))
    assert sum(ids.values()) == FILES * GOOD_LINES and set(ids.values()) == {1}, ids
    items = {k[1]: v for k, v in records(table).items() if k[0] == date}
    files = Counter(v["status"].split("#")[0] for k, v in items.items() if k.endswith(".ndjson"))
    assert files == {"completed": FILES}, items
    assert not [v for k, v in items.items() if k.startswith("MANIFEST#") and v["status"] in ("pending", "processing")]
    assert reconcile.disagreements() == []


@pytest.mark.timeout(1800)  # ~13 s a point on a quiet machine, 30 s on a loaded one: the full sweep has 29 writes
def test_etl_crash_points(etl_env, monkeypatch, tmp_path):
    monkeypatch.setenv("MAX_FILES_PER_MANIFEST", "2")
    root, table = etl_env["root"], etl_env["table"]
    start = dt.date(2026, 3, 1)
    # a first run over fresh tables and store makes writes no later run makes (e.g. the catalog's first entry):
    # the counted run is a second one, like every crash run after it
    first = _inputs(root, (start - dt.timedelta(days=1)).isoformat())
    count_writes("tests.test_crashpoints_etl:ingest_merge_flush", {"urls": first, "today": TODAY}, tmp_path / "w0.log")
    count_date = start.isoformat()
    urls = _inputs(root, count_date)
    writes = count_writes(
        "tests.test_crashpoints_etl:ingest_merge_flush", {"urls": urls, "today": TODAY}, tmp_path / "w.log"
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
            "tests.test_crashpoints_etl:ingest_merge_flush", {"urls": urls, "today": TODAY}, f"{point}:kill:{when}"
        )
        assert killed(result), f"write {point} ({writes[point - 1]}): {result.stderr[-2000:]}"
        _recover(date, urls)
        _check(root, table, date, urls)
        print(f"point {point} ({writes[point - 1].kind}, {when}): recovered")
    report(
        f"etl: {len(points)} crash points exercised of {len(writes)} writes ({json.dumps(dict(sorted(kinds.items())))})"
    )
