"""The pipeline-health dashboard: exact figures from the metrics table and the records over the last 24 hours."""

from __future__ import annotations

import time

from tasks.core import state_store
from tasks.core.runtime import iso_ago
from tasks.gpu import jobs as gpu
from tasks.health import dashboard

HOUR_US = 3_600_000_000


def put_metric(tables: dict, metric_type: str, at_us: int, **values) -> None:
    state_store.put(tables["etl_metrics"], {"metric_type": metric_type, "timestamp": at_us, "ttl": 0, **values})


def test_the_dashboard_reads_24_hours_of_metrics_and_records(tables, store_root):
    now = time.time_ns() // 1000
    put_metric(tables, "ingest", now - HOUR_US // 2, files=32, quarantined=2, tracked=30)
    put_metric(tables, "ingest", now - 3 * HOUR_US, files=10, quarantined=0, tracked=10)
    put_metric(tables, "ingest", now - 25 * HOUR_US, files=99, quarantined=9, tracked=90)  # outside the window
    put_metric(tables, "merge", now - HOUR_US, files=30, files_failed=1, input_mb=100, seconds=2, skipped=False)
    put_metric(tables, "merge", now - 2 * HOUR_US, files=10, files_failed=0, input_mb=50, seconds=3, skipped=False)
    put_metric(
        tables, "merge", now - 2 * HOUR_US + 1, files=10, files_failed=0, input_mb=50, seconds=0.01, skipped=True
    )
    recent, old = iso_ago(600), iso_ago(30 * 3600)
    for job_id, status, at in (
        ("j1", gpu.JOB_COMPLETE, recent),
        ("j2", gpu.JOB_FAILED, recent),
        ("j3", gpu.JOB_FAILED, old),
        ("j4", gpu.JOB_IN_PROGRESS, recent),
    ):
        state_store.put(tables["ecs_job"], {"job_id": job_id, "job_status": status, "created_at": at, "updated_at": at})

    markdown, rows = dashboard.dashboard({"etl-files-pending": 7}, now_us=now)

    by_pipeline = {r["pipeline"]: r for r in rows}
    assert by_pipeline["etl"] == {"pipeline": "etl", "unit": "files", "ended": 42, "failed": 3, "failure rate": "7.1%"}
    assert by_pipeline["gpu"] == {"pipeline": "gpu", "unit": "jobs", "ended": 2, "failed": 1, "failure rate": "50.0%"}
    assert by_pipeline["video"]["ended"] == by_pipeline["phspectra"]["ended"] == by_pipeline["records"]["ended"] == 0
    assert "40 files tracked · backlog 7 pending · merge 30.0 MB/s over 3 merge(s)" in markdown
    chart = markdown.split("```")[1].strip().splitlines()
    assert len(chart) == 24
    assert chart[-1].endswith(" " + "█" * dashboard.BAR_WIDTH + "  30")  # the latest hour: the longest bar
    assert chart[-4].split()[-1] == "10" and chart[-4].count("█") == dashboard.BAR_WIDTH // 3
    assert all(line.split()[-1] == "0" for i, line in enumerate(chart) if i not in (20, 23))
    assert "| gpu | 2 jobs | 1 | 50.0% |" in markdown


def test_bars_grow_in_eighths():
    assert dashboard.bar(0, 10) == "" and dashboard.bar(5, 0) == ""
    assert dashboard.bar(10, 10, width=2) == "██"
    assert dashboard.bar(1, 16, width=2) == "▏"
    assert dashboard.bar(11, 16, width=2) == "█▍"
