"""The seeds' service alarms that read the orchestrator rather than the records: errors, timeouts, throttles,
concurrency and duration from the Prefect API; merge failures from the ETL metrics table; the other seeds'
failure rates per hour. Each returns an ``Alarm`` like the record checks in ``checks``.

Seed 001's 15 CloudWatch alarms and where each one went: README, "Alarms (`pipeline-health`)".
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

import boto3

from blocks.health import HealthThresholds
from tasks.core import limits, state_store
from tasks.records import keys
from tasks.core.config import object_store, table_name
from tasks.core.runtime import iso_ago
from tasks.health.checks import Alarm, Check, _alarm
from tasks.health.dashboard import metric_rows
from tasks.video import jobs as video

# the flows whose runs count (never a maintenance or listener run's own failure twice)
PIPELINE_FLOWS = (
    "phspectra-survey", "phspectra-fit-chunks", "ndjson-ingest", "ndjson-merge", "gpu-job", "gpu-healthcheck",
    "video-process", "video-reassemble", "records-ingest", *limits.MAINTENANCE_FLOWS,
)
WINDOW_S = 5 * 60  # the seed's alarm period
HOUR_S = 3600


def _flow_runs(*, states: Iterable[str] = (), ended_within_s: float | None = None, names: Iterable[str] = (),
               flows: Iterable[str] = PIPELINE_FLOWS) -> list[Any]:
    """Flow runs of ``flows`` in these state types (or state names), optionally ended in the last seconds."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterEndTime, FlowRunFilterState, FlowRunFilterStateName,
        FlowRunFilterStateType,
    )

    state = FlowRunFilterState(
        type=FlowRunFilterStateType(any_=list(states)) if states else None,
        name=FlowRunFilterStateName(any_=list(names)) if names else None,
    )
    end = FlowRunFilterEndTime(after_=datetime.now(timezone.utc) - timedelta(seconds=ended_within_s)) if ended_within_s else None
    runs, offset = [], 0
    with get_client(sync_client=True) as client:
        while page := client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=list(flows))),
                                            flow_run_filter=FlowRunFilter(state=state, end_time=end), limit=200, offset=offset):
            runs += page
            offset += len(page)
            if len(page) < 200:
                break
    return runs


def _names(runs: Iterable[Any]) -> list[str]:
    return [f"{run.name} ({run.state.name})" if run.state else run.name for run in runs]


def flow_runs_failed(limits_: HealthThresholds) -> list[Alarm]:
    """Lambda-Errors and StepFunctions-ExecutionFailed: runs that ended Failed/Crashed in the last 5 minutes."""
    failed = _flow_runs(states=("FAILED", "CRASHED"), ended_within_s=WINDOW_S)
    merges = _flow_runs(states=("FAILED", "CRASHED"), ended_within_s=WINDOW_S, flows=("ndjson-merge",))
    return [
        _alarm("flow-runs-failed", "all", _names(failed), limits_.failed_runs_5min_max, "flow run(s) failed or crashed in 5 min"),
        _alarm("etl-merge-runs-failed", "etl", _names(merges), limits_.failed_merge_runs_5min_max, "merge run(s) failed in 5 min"),
    ]


def flow_runs_timed_out(limits_: HealthThresholds) -> Alarm:
    """StepFunctions-ExecutionTimeout: runs that ended TimedOut in the last 5 minutes."""
    timed_out = _flow_runs(names=("TimedOut",), ended_within_s=WINDOW_S)
    return _alarm("flow-runs-timed-out", "all", _names(timed_out), 0, "flow run(s) timed out in 5 min")


def flow_runs_waiting(limits_: HealthThresholds) -> Alarm:
    """Lambda-Throttles / StepFunctions-ExecutionThrottled: runs a concurrency limit holds back right now."""
    waiting = _flow_runs(names=("AwaitingConcurrencySlot",))
    return _alarm("flow-runs-waiting-for-a-slot", "all", _names(waiting), limits_.waiting_runs_max,
                  "flow run(s) waiting for a concurrency slot")


def flow_runs_active(limits_: HealthThresholds) -> Alarm:
    """Lambda-ConcurrentExecutions: pipeline flow runs running right now."""
    running = _flow_runs(states=("RUNNING",))
    return _alarm("flow-runs-active", "all", _names(running), limits_.active_runs_max, "flow run(s) running")


def _running_task_runs(names: Iterable[str]) -> list[tuple[str, Any]]:
    """(task name, run) of the task runs of ``names`` running right now (a run is named ``{task}-{suffix}``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterState, TaskRunFilterStateType

    wanted = set(names)
    running = TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(any_=["RUNNING"])))
    found, offset = [], 0
    with get_client(sync_client=True) as client:
        while page := client.read_task_runs(task_run_filter=running, limit=200, offset=offset):
            found += [(run.name.rsplit("-", 1)[0], run) for run in page if run.name.rsplit("-", 1)[0] in wanted]
            offset += len(page)
            if len(page) < 200:
                break
    return found


def flow_runs_near_timeout(limits_: HealthThresholds) -> Alarm:
    """Lambda-DurationHigh: running runs past ``duration_alarm_fraction`` of their flow's timeout, and the ingest's
    steps (the seed's manifest builder, 180 s) and the status update past that share of their task timeout."""
    now = datetime.now(timezone.utc)
    late = []
    for flow_name, timeout in limits.FLOW_TIMEOUT_S.items():
        for run in _flow_runs(states=("RUNNING",), flows=(flow_name,)):
            ran = (now - run.start_time).total_seconds() if run.start_time else 0
            if ran > limits_.duration_alarm_fraction * timeout:
                late.append(f"{run.name} ({flow_name}, {ran:.0f} s of {timeout:.0f})")
    for task_name, run in _running_task_runs(limits.TASK_TIMEOUT_S):
        timeout = limits.TASK_TIMEOUT_S[task_name]
        ran = (now - run.start_time).total_seconds() if run.start_time else 0
        if ran > limits_.duration_alarm_fraction * timeout:
            late.append(f"{run.name} ({task_name}, {ran:.0f} s of {timeout:.0f})")
    return _alarm("flow-runs-near-timeout", "all", late, 0, f"run(s) past {limits_.duration_alarm_fraction:.0%} of their timeout")


THROTTLE_METRICS = {"read": "ReadThrottleEvents", "write": "WriteThrottleEvents"}


def _cloudwatch_throttles(table: str) -> dict[str, int]:
    """AWS: the table's throttle events in the last 5 minutes from CloudWatch's DynamoDB metrics."""
    from tasks.landing.sqs import aws_session

    cloudwatch = (aws_session() or boto3.Session()).client("cloudwatch")
    end = datetime.now(timezone.utc)
    counts = {}
    for kind, metric in THROTTLE_METRICS.items():
        points = cloudwatch.get_metric_statistics(
            Namespace="AWS/DynamoDB", MetricName=metric, Dimensions=[{"Name": "TableName", "Value": table}],
            # the end reaches one period past now: a datapoint of the current, unfinished minute counts too
            StartTime=end - timedelta(seconds=WINDOW_S), EndTime=end + timedelta(seconds=60), Period=60, Statistics=["Sum"],
        )["Datapoints"]
        counts[kind] = int(sum(point["Sum"] for point in points))
    return counts


def _client_throttles(table: str) -> dict[str, int]:
    """Locally: the throttled attempts the DynamoDB client retried in the last 5 minutes (state_store's events)."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter

    since = datetime.now(timezone.utc) - timedelta(seconds=WINDOW_S)
    counts = {}
    with get_client(sync_client=True) as client:
        for kind in THROTTLE_METRICS:
            wanted = EventFilter(occurred=EventOccurredFilter(since=since), event=EventNameFilter(name=[state_store.THROTTLE_EVENT]),
                                 resource=EventResourceFilter(id=[state_store.throttle_resource(kind, table)]))
            counts[kind] = client.read_events(filter=wanted, limit=1).total
    return counts


def dynamodb_throttles(limits_: HealthThresholds) -> list[Alarm]:
    """FileTracking-ReadThrottle / -WriteThrottle: throttled reads and writes of the ETL tracking table in 5 minutes;
    in AWS from CloudWatch (``ReadThrottleEvents``/``WriteThrottleEvents``), with DynamoDB Local (an endpoint set)
    from the client's throttled attempts that botocore retried."""
    table = table_name("etl_file_tracking")
    counts = _client_throttles(table) if os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") else _cloudwatch_throttles(table)
    maxima = {"read": limits_.read_throttles_5min_max, "write": limits_.write_throttles_5min_max}
    return [Alarm(f"etl-tracking-{kind}-throttles", "etl", counts[kind], maxima[kind],
                  f"{counts[kind]} throttled {kind}(s) of {table} in 5 min") for kind in THROTTLE_METRICS]


def etl_merge_file_failures(limits_: HealthThresholds) -> Alarm:
    """GlueJob-Failures: files the merges failed in the last 5 minutes, from the metrics table."""
    since_us = time.time_ns() // 1000 - WINDOW_S * 1_000_000
    failed = [f"{row.get('manifest')}: {row.get('files_failed')}" for row in metric_rows("merge", since_us)
              if int(row.get("files_failed") or 0)]
    total = sum(int(part.rsplit(": ", 1)[1]) for part in failed)
    return Alarm("etl-merge-file-failures", "etl", total, limits_.merge_file_failures_5min_max,
                 f"{total} file(s) failed by merges in 5 min" + (f": {', '.join(failed[:5])}" if failed else ""))


def gpu_restarts(limits_: HealthThresholds) -> Alarm:
    """Seed 002: GPU job restarts in the last hour (tasks started for a retry > 0)."""
    since = iso_ago(HOUR_S)
    tasks_table = table_name("ecs_task")
    restarts = {
        f"{item['job_id']} (retry {item['retry']})"
        for item in state_store.scan_all(tasks_table)
        if str(item.get("retry", "0")) != "0" and str(item.get("created_at", "")) >= since
    }
    return _alarm("gpu-restarts-per-hour", "gpu", restarts, limits_.gpu_restarts_hour_max, "GPU job restart(s) in the last hour")


def video_jobs_failed(limits_: HealthThresholds) -> Alarm:
    """Seed 003: video jobs failed in the last hour."""
    since = iso_ago(HOUR_S)
    failed = [f"{job['job_id']}: {job.get('failure_reason', '')[:80]}" for job in video.list_jobs(video.FAILED)
              if str(job.get("failed_at", "")) >= since]
    return _alarm("video-jobs-failed-per-hour", "video", failed, limits_.video_failed_hour_max, "video job(s) failed in the last hour")


def records_archived(limits_: HealthThresholds) -> Alarm:
    """Seed 004: messages archived to the dead-letter archive in the last hour."""
    since = datetime.now(timezone.utc) - timedelta(seconds=HOUR_S)
    archived = [o.key for o in object_store().list_objects(keys.DEAD_LETTER_PREFIX)
                if datetime.fromisoformat(o.last_modified) >= since]
    return _alarm("records-archived-per-hour", "records", archived, limits_.records_archived_hour_max,
                  "message(s) archived in the last hour")


def landing_dead_letter_queues(limits_: HealthThresholds) -> list[Alarm]:
    """DLQ-Messages (AWS): messages in each landing queue's dead-letter queue, found by the name `aws-events setup`
    gives it; none where the landing is a file watch (a file:// store) or the queue was never set up."""
    from tasks.landing.sqs import SEED_QUEUES, aws_session, landing_store_url, queue_names, queue_url_variable

    alarms = []
    for pipeline in SEED_QUEUES:
        if not landing_store_url(pipeline).startswith("s3://") and not os.environ.get(queue_url_variable(pipeline)):
            continue  # the local stack has no queues: its landing is a file watch
        sqs = (aws_session() or boto3.Session()).client("sqs")
        try:
            url = sqs.get_queue_url(QueueName=queue_names(pipeline)[1])["QueueUrl"]
        except sqs.exceptions.QueueDoesNotExist:
            continue  # this pipeline's landing was not set up here (`aws-events setup --pipeline` makes it)
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
        depth = int(attributes["ApproximateNumberOfMessages"])
        alarms.append(Alarm(f"landing-dead-letter-queue-{pipeline}", pipeline, depth, limits_.dlq_messages_max,
                            f"{depth} message(s) in the {pipeline} landing dead-letter queue"))
    return alarms


CHECKS: dict[Check, tuple[str, ...]] = {
    flow_runs_failed: ("flow-runs-failed", "etl-merge-runs-failed"),
    flow_runs_timed_out: ("flow-runs-timed-out",),
    flow_runs_waiting: ("flow-runs-waiting-for-a-slot",),
    flow_runs_active: ("flow-runs-active",),
    flow_runs_near_timeout: ("flow-runs-near-timeout",),
    dynamodb_throttles: ("etl-tracking-read-throttles", "etl-tracking-write-throttles"),
    etl_merge_file_failures: ("etl-merge-file-failures",),
    gpu_restarts: ("gpu-restarts-per-hour",),
    video_jobs_failed: ("video-jobs-failed-per-hour",),
    records_archived: ("records-archived-per-hour",),
    landing_dead_letter_queues: ("landing-dead-letter-queue",),
}
