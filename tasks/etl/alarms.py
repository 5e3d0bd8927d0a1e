"""What ``pipeline-health`` reads of the ETL pipeline: pending files and their age, failed manifests, the tracking
table's throttles, files failed by merges, a merge deployment paused too long, dates the catalog lacks; and its
dashboard figures (files per hour, backlog, merge MB/s)."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
from boto3.dynamodb.conditions import Key

from blocks.health import HealthThresholds
from tasks.core import state_store
from tasks.core.config import table_name
from tasks.core.runtime import iso_ago, now_iso
from tasks.core.state_store import to_plain
from tasks.etl import ingest as etl
from tasks.etl import keys
from tasks.etl.catalog import unregistered_dates
from tasks.health.checks import Alarm, count_alarm
from tasks.health.dashboard import HOURS, Figures, Outcomes, Window, bar_chart, hourly
from tasks.health.service_alarms import WINDOW_S, flow_runs, run_names


def metric_rows(metric_type: str, since_us: int) -> list[dict[str, Any]]:
    """Rows of one metric type written since ``since_us`` (a Query on the seed's key, oldest first)."""
    condition = Key("metric_type").eq(metric_type) & Key("timestamp").gte(since_us)
    return [to_plain(r) for r in state_store.query_all(table_name(etl.METRICS), KeyConditionExpression=condition)]


def _pending_files() -> list[dict[str, Any]]:
    """Every tracked file (not meta-record) pending in any status shard, through the status index."""
    statuses = [keys.sharded_status(etl.PENDING, n) for n in range(etl.settings().num_status_shards)] + [etl.PENDING]
    found = []
    for status in statuses:
        found += state_store.query_all(
            table_name(etl.TRACKING),
            keep=lambda item: not keys.is_meta_record(item["file_key"]),
            IndexName=etl.STATUS_INDEX,
            KeyConditionExpression=Key("status").eq(status),
        )
    return found


def pending_since(item: Mapping[str, Any]) -> str:
    """When a pending file became pending: its last status change (``updated_at``, written by every move back to
    ``pending#N``: release, reprocess, revalidation), else its creation; never the first ingest of a re-run file."""
    return str(item.get("updated_at") or item.get("created_at", ""))


def iterator_age(pending: Sequence[Mapping[str, Any]], batch: int, now: str | None = None) -> tuple[int, str | None]:
    """Seed IteratorAge: seconds the oldest pending file waited although its date had a full batch pending (a file
    of a date still filling its batch waits by design, never counted), and which file; (0, None) when none."""
    per_date = Counter(str(item["date_prefix"]) for item in pending)
    batchable = [item for item in pending if per_date[str(item["date_prefix"])] >= batch]
    if not batchable:
        return 0, None
    oldest = min(batchable, key=pending_since)
    waited = datetime.fromisoformat(now or now_iso()) - datetime.fromisoformat(pending_since(oldest))
    return max(0, int(waited.total_seconds())), f"{oldest['date_prefix']}/{oldest['file_key']}"


def etl_pending(limits: HealthThresholds) -> list[Alarm]:
    """ETL: files pending longer than ``pending_file_minutes`` (message age), pending files (queue depth), and the
    age of the batching backlog (iterator age, ``iterator_age_seconds``)."""
    pending = _pending_files()
    cutoff = iso_ago(limits.pending_file_minutes * 60)
    names = [f"{item['date_prefix']}/{item['file_key']}" for item in pending]
    late = [n for n, item in zip(names, pending) if pending_since(item) < cutoff]
    minutes = f"{limits.pending_file_minutes:g}"
    age, oldest = iterator_age(pending, etl.settings().max_files_per_manifest)
    return [
        count_alarm(
            "etl-files-pending-too-long", "etl", late, limits.late_pending_files_max, f"file(s) pending > {minutes} min"
        ),
        count_alarm("etl-files-pending", "etl", names, limits.pending_files_max, "file(s) pending"),
        Alarm(
            "etl-iterator-age",
            "etl",
            age,
            int(limits.iterator_age_seconds),
            f"oldest batchable pending file waited {age} s" + (f": {oldest}" if oldest else ""),
        ),
    ]


def etl_failed_manifests(limits: HealthThresholds) -> Alarm:
    """ETL: ``MANIFEST#`` records whose merge failed (a re-run moves them on, which clears the alarm)."""
    failed = state_store.query_all(
        table_name(etl.TRACKING),
        keep=lambda item: item["file_key"].startswith(keys.MANIFEST_PREFIX),
        IndexName=etl.STATUS_INDEX,
        KeyConditionExpression=Key("status").eq(etl.FAILED),
    )
    names = [f"{item['date_prefix']}/{keys.manifest_name_from_record_key(item['file_key'])}" for item in failed]
    return count_alarm("etl-failed-manifests", "etl", names, limits.failed_manifests_max, "failed manifest(s)")


def etl_merges_waiting_for_space(limits: HealthThresholds) -> Alarm:
    """ETL: ``MANIFEST#`` records a merge put back to ``pending`` when it met a full disk (ENOSPC seen), not yet
    merged since; the detail names each with the disk's error. The flush's restart clears it once space is freed."""
    waiting = state_store.query_all(
        table_name(etl.TRACKING),
        keep=lambda item: item["file_key"].startswith(keys.MANIFEST_PREFIX) and "waiting_for_space_since" in item,
        IndexName=etl.STATUS_INDEX,
        KeyConditionExpression=Key("status").eq(etl.PENDING),
    )
    names = [
        f"{item['date_prefix']}/{keys.manifest_name_from_record_key(item['file_key'])} "
        f"({item.get('waiting_reason', '')[:200]})"
        for item in waiting
    ]
    return count_alarm("etl-merges-waiting-for-space", "etl", names, 0, "manifest(s) waiting for disk space")


def etl_catalog_unregistered(limits: HealthThresholds) -> Alarm:
    """ETL: dates whose merged output is published but whose catalog registration (Glue on S3) failed and has not
    succeeded since, each with its reason; ``ndjson-flush-orphans`` and ``etl register`` retry them. Any is one
    too many: the date's rows are missing from every query of the table."""
    names = [f"{item['date_prefix']} ({str(item.get('error_message', ''))[:200]})" for item in unregistered_dates()]
    return count_alarm("etl-catalog-unregistered", "etl", names, 0, "date(s) not registered in the catalog")


THROTTLE_METRICS = {"read": "ReadThrottleEvents", "write": "WriteThrottleEvents"}


def _cloudwatch_throttles(table: str) -> dict[str, int]:
    """AWS: the table's throttle events in the last 5 minutes from CloudWatch's DynamoDB metrics."""
    from tasks.landing.sqs import aws_session

    cloudwatch = (aws_session() or boto3.Session()).client("cloudwatch")
    end = datetime.now(UTC)
    counts = {}
    for kind, metric in THROTTLE_METRICS.items():
        points = cloudwatch.get_metric_statistics(
            Namespace="AWS/DynamoDB",
            MetricName=metric,
            Dimensions=[{"Name": "TableName", "Value": table}],
            # the end reaches one period past now: a datapoint of the current, unfinished minute counts too
            StartTime=end - timedelta(seconds=WINDOW_S),
            EndTime=end + timedelta(seconds=60),
            Period=60,
            Statistics=["Sum"],
        )["Datapoints"]
        counts[kind] = int(sum(point["Sum"] for point in points))
    return counts


def _client_throttles(table: str) -> dict[str, int]:
    """Locally: the throttled attempts the DynamoDB client retried in the last 5 minutes (state_store's events)."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter

    since = datetime.now(UTC) - timedelta(seconds=WINDOW_S)
    counts = {}
    with get_client(sync_client=True) as client:
        for kind in THROTTLE_METRICS:
            wanted = EventFilter(
                occurred=EventOccurredFilter(since=since),
                event=EventNameFilter(name=[state_store.THROTTLE_EVENT]),
                resource=EventResourceFilter(id=[state_store.throttle_resource(kind, table)]),
            )
            counts[kind] = client.read_events(filter=wanted, limit=1).total
    return counts


def dynamodb_throttles(limits_: HealthThresholds) -> list[Alarm]:
    """FileTracking-ReadThrottle / -WriteThrottle: throttled reads and writes of the ETL tracking table in 5 minutes;
    in AWS from CloudWatch (``ReadThrottleEvents``/``WriteThrottleEvents``), with DynamoDB Local (an endpoint set)
    from the client's throttled attempts that botocore retried."""
    table = table_name("etl_file_tracking")
    counts = _client_throttles(table) if os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") else _cloudwatch_throttles(table)
    maxima = {"read": limits_.read_throttles_5min_max, "write": limits_.write_throttles_5min_max}
    return [
        Alarm(
            f"etl-tracking-{kind}-throttles",
            "etl",
            counts[kind],
            maxima[kind],
            f"{counts[kind]} throttled {kind}(s) of {table} in 5 min",
        )
        for kind in THROTTLE_METRICS
    ]


def etl_merge_runs_failed(limits_: HealthThresholds) -> Alarm:
    """Seed 001's GlueJob-Errors: merge runs that ended Failed/Crashed in the last 5 minutes."""
    merges = flow_runs(states=("FAILED", "CRASHED"), ended_within_s=WINDOW_S, flows=("ndjson-merge",))
    return count_alarm(
        "etl-merge-runs-failed",
        "etl",
        run_names(merges),
        limits_.failed_merge_runs_5min_max,
        "merge run(s) failed in 5 min",
    )


def etl_merge_file_failures(limits_: HealthThresholds) -> Alarm:
    """GlueJob-Failures: files the merges failed in the last 5 minutes, from the metrics table."""
    since_us = time.time_ns() // 1000 - WINDOW_S * 1_000_000
    failed = [
        f"{row.get('manifest')}: {row.get('files_failed')}"
        for row in metric_rows("merge", since_us)
        if int(row.get("files_failed") or 0)
    ]
    total = sum(int(part.rsplit(": ", 1)[1]) for part in failed)
    return Alarm(
        "etl-merge-file-failures",
        "etl",
        total,
        limits_.merge_file_failures_5min_max,
        f"{total} file(s) failed by merges in 5 min" + (f": {', '.join(failed[:5])}" if failed else ""),
    )


MERGE_FLOW = "ndjson-merge"


def paused_merge_deployments() -> dict[str, float]:
    """Each paused deployment of the merge flow (``flow/deployment``) → seconds since its last change on the server
    (pausing is one: a lower bound of how long it has been paused)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    now = datetime.now(UTC)
    with get_client(sync_client=True) as client:
        found = client.read_deployments(flow_filter=FlowFilter(name=FlowFilterName(any_=[MERGE_FLOW])))
    return {f"{MERGE_FLOW}/{d.name}": (now - d.updated).total_seconds() for d in found if d.paused and d.updated}


def etl_merge_paused(limits_: HealthThresholds) -> Alarm:
    """The merge deployment paused longer than ``merge_paused_minutes`` (its breaker open that long, or a pause that
    nothing resumes): every manifest waits ``pending`` meanwhile. The value is the longest pause in seconds."""
    from tasks.etl import breaker

    paused = paused_merge_deployments()
    longest = int(max(paused.values(), default=0))
    shown = []
    for name, seconds in sorted(paused.items(), key=lambda item: -item[1]):
        state = breaker.load(name)
        since = f" since {state.opened_at}" if state.opened_at else ""
        shown.append(f"{name} paused {int(seconds)} s (breaker {state.state}{since})")
    return Alarm(
        "etl-merge-paused",
        "etl",
        longest,
        int(limits_.merge_paused_minutes * 60),
        (f"{len(paused)} merge deployment(s) paused: " + ", ".join(shown)) if paused else "no merge deployment paused",
    )


def etl_outcomes(ingests: Sequence[Mapping[str, Any]], merges: Sequence[Mapping[str, Any]]) -> Outcomes:
    """ETL files: ingested in the window; failed = quarantined at ingest + failed in a merge."""
    files = sum(int(r.get("files") or 0) for r in ingests)
    failed = sum(int(r.get("quarantined") or 0) for r in ingests) + sum(int(r.get("files_failed") or 0) for r in merges)
    return Outcomes("etl", "files", files, min(failed, files) if files else failed)


def merge_mb_per_s(merges: Sequence[Mapping[str, Any]]) -> float | None:
    """Input MB merged per second of merge time, over the window's merges that did the work (None: none did)."""
    done = [r for r in merges if not r.get("skipped") and float(r.get("seconds") or 0) > 0]
    seconds = sum(float(r["seconds"]) for r in done)
    return round(sum(float(r.get("input_mb") or 0) for r in done) / seconds, 1) if seconds else None


def figures(window: Window) -> Figures:
    """Files ingested and failed in the window, files tracked per hour, the backlog and the merges' MB/s."""
    ingests, merges = metric_rows("ingest", window.since_us), metric_rows("merge", window.since_us)
    files = hourly(ingests, "tracked", window.now_us)
    rate = merge_mb_per_s(merges)
    backlog = window.readings.get("etl-files-pending") or 0
    return Figures(
        etl_outcomes(ingests, merges),
        summary=f"**ETL:** {sum(files):,.0f} files tracked · backlog {backlog} pending · "
        f"merge {'-' if rate is None else f'{rate} MB/s'} over {len(merges)} merge(s)",
        charts=(bar_chart("ETL files tracked per hour (UTC)", window.hour_labels(HOURS), files),),
    )


CHECKS = {
    etl_pending: ("etl-files-pending-too-long", "etl-files-pending", "etl-iterator-age"),
    etl_failed_manifests: ("etl-failed-manifests",),
    etl_catalog_unregistered: ("etl-catalog-unregistered",),
    etl_merges_waiting_for_space: ("etl-merges-waiting-for-space",),
}
SERVICE_CHECKS = {
    etl_merge_runs_failed: ("etl-merge-runs-failed",),
    dynamodb_throttles: ("etl-tracking-read-throttles", "etl-tracking-write-throttles"),
    etl_merge_file_failures: ("etl-merge-file-failures",),
    etl_merge_paused: ("etl-merge-paused",),
}
