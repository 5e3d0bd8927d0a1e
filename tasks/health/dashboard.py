"""The ``pipeline-health`` dashboard: the last 24 hours of all five pipelines, from the metrics table and the records.

Seed 001 keeps its figures in a metrics table (``metric_type`` / ``timestamp`` in µs) and a CloudWatch dashboard
reads them. Here ``ndjson-ingest`` and ``ndjson-merge`` write the same rows, and this module reads them back into
one markdown artifact per health run: files per hour (a chart), backlog, merge MB/s, and per pipeline how many
pieces of work ended and how many of those failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from boto3.dynamodb.conditions import Key

from tasks.core import state_store
from tasks.phspectra import keys as phspectra_keys
from tasks.records import keys as records_keys
from tasks.core.config import object_store, table_name
from tasks.core.state_store import to_plain
from tasks.etl import ingest as etl
from tasks.gpu import jobs as gpu
from tasks.phspectra import survey
from tasks.video import jobs as video

HOURS = 24
BAR_WIDTH = 40
EIGHTHS = " ▏▎▍▌▋▊▉█"


def metric_rows(metric_type: str, since_us: int) -> list[dict[str, Any]]:
    """Rows of one metric type written since ``since_us`` (a Query on the seed's key, oldest first)."""
    condition = Key("metric_type").eq(metric_type) & Key("timestamp").gte(since_us)
    return [to_plain(r) for r in state_store.query_all(table_name(etl.METRICS), KeyConditionExpression=condition)]


def hourly(rows: Iterable[Mapping[str, Any]], value: str, now_us: int, hours: int = HOURS) -> list[float]:
    """Sum of ``value`` per hour over the last ``hours`` hours, oldest hour first."""
    sums = [0.0] * hours
    for row in rows:
        age_hours = int((now_us - int(row["timestamp"])) // 3_600_000_000)
        if 0 <= age_hours < hours:
            sums[hours - 1 - age_hours] += float(row.get(value) or 0)
    return sums


def bar(value: float, most: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of ``value`` against ``most``, in eighths of a character."""
    if most <= 0 or value <= 0:
        return ""
    eighths = max(1, round(value / most * width * 8))
    return "█" * (eighths // 8) + (EIGHTHS[eighths % 8] if eighths % 8 else "")


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float]) -> str:
    """A markdown bar chart (a fenced block, so the bars line up in the UI)."""
    most = max(values, default=0)
    lines = [f"{label}  {bar(v, most):<{BAR_WIDTH + 1}} {v:,.0f}" for label, v in zip(labels, values)]
    return f"**{title}**\n\n```\n" + "\n".join(lines) + "\n```"


@dataclass(frozen=True)
class Outcomes:
    """Work of one pipeline that ended in the window: how much, how much failed, and what the unit is."""

    pipeline: str
    unit: str
    ended: int
    failed: int

    def row(self) -> dict[str, Any]:
        """The pipeline as a dashboard table row."""
        rate = f"{self.failed / self.ended:.1%}" if self.ended else "-"
        return {"pipeline": self.pipeline, "unit": self.unit, "ended": self.ended, "failed": self.failed, "failure rate": rate}


def _outcomes(pipeline: str, unit: str, items: Iterable[Mapping[str, Any]], status: str, ok: str, bad: str,
              since: Callable[[Mapping[str, Any]], bool]) -> Outcomes:
    ended = [item for item in items if item.get(status) in (ok, bad) and since(item)]
    return Outcomes(pipeline, unit, len(ended), sum(1 for item in ended if item.get(status) == bad))


def etl_outcomes(ingests: Sequence[Mapping[str, Any]], merges: Sequence[Mapping[str, Any]]) -> Outcomes:
    """ETL files: ingested in the window; failed = quarantined at ingest + failed in a merge."""
    files = sum(int(r.get("files") or 0) for r in ingests)
    failed = sum(int(r.get("quarantined") or 0) for r in ingests) + sum(int(r.get("files_failed") or 0) for r in merges)
    return Outcomes("etl", "files", files, min(failed, files) if files else failed)


def pipeline_outcomes(since_iso: str, since_epoch_ms: int) -> list[Outcomes]:
    """phspectra runs, video jobs, GPU jobs and records executions that ended in the window (maintenance reads)."""
    after = lambda *attrs: lambda item: max((str(item.get(a) or "") for a in attrs), default="") >= since_iso  # noqa: E731
    runs = state_store.scan_all(survey.runs_table(), keep=lambda item: item["SK"] == phspectra_keys.RUN_SK)
    executions = state_store.scan_all(table_name("executions"))
    return [
        _outcomes("phspectra", "runs", runs, "status", survey.RUN_COMPLETED, survey.RUN_FAILED, after("completed_at", "created_at")),
        _outcomes("video", "jobs", video.list_jobs(), "status", video.COMPLETED, video.FAILED,
                  after("completed_at", "failed_at", "created_at")),
        _outcomes("gpu", "jobs", gpu.list_jobs(), "job_status", gpu.JOB_COMPLETE, gpu.JOB_FAILED, after("updated_at", "created_at")),
        _outcomes("records", "executions", executions, "status", "completed", "failed",
                  lambda item: int(item.get("createdAt") or 0) >= since_epoch_ms),
    ]


def merge_mb_per_s(merges: Sequence[Mapping[str, Any]]) -> float | None:
    """Input MB merged per second of merge time, over the window's merges that did the work (None: none did)."""
    done = [r for r in merges if not r.get("skipped") and float(r.get("seconds") or 0) > 0]
    seconds = sum(float(r["seconds"]) for r in done)
    return round(sum(float(r.get("input_mb") or 0) for r in done) / seconds, 1) if seconds else None


def dashboard(backlog: int, now_us: int | None = None) -> tuple[str, list[dict[str, Any]]]:
    """The dashboard's markdown and its per-pipeline rows, for the 24 hours before ``now_us``."""
    now_us = now_us or time.time_ns() // 1000
    since_us = now_us - HOURS * 3_600_000_000
    ingests, merges = metric_rows("ingest", since_us), metric_rows("merge", since_us)
    since_iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since_us / 1e6))
    outcomes = [etl_outcomes(ingests, merges), *pipeline_outcomes(since_iso, since_us // 1000)]
    hour_labels = [time.strftime("%H:00", time.gmtime(now_us / 1e6 - (HOURS - 1 - h) * 3600)) for h in range(HOURS)]
    files = hourly(ingests, "tracked", now_us)
    rate = merge_mb_per_s(merges)
    dead_letters = sum(1 for _ in object_store().list(records_keys.DEAD_LETTER_PREFIX))
    rows = [o.row() for o in outcomes]
    table = "\n".join(
        ["| pipeline | ended (24 h) | failed | failure rate |", "|---|---:|---:|---:|"]
        + [f"| {r['pipeline']} | {r['ended']} {r['unit']} | {r['failed']} | {r['failure rate']} |" for r in rows]
    )
    markdown = "\n\n".join([
        "# Pipelines, last 24 hours",
        f"**ETL:** {sum(files):,.0f} files tracked · backlog {backlog} pending · "
        f"merge {'-' if rate is None else f'{rate} MB/s'} over {len(merges)} merge(s) · "
        f"**records:** {dead_letters} message(s) in the dead-letter archive",
        bar_chart("ETL files tracked per hour (UTC)", hour_labels, files),
        table,
    ])
    return markdown, rows
