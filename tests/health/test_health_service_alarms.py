"""The seed's service alarms: real flow runs on the test server, metrics and records in DynamoDB Local, a landing
dead-letter queue on moto's SQS."""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import UTC

import boto3
import pytest

from blocks.health import HealthThresholds
from tasks.core import limits, state_store
from tasks.core.runtime import iso_ago, now_iso
from tasks.etl import alarms as etl_alarms
from tasks.etl.pipeline import MANIFEST_BUILDER_TIMEOUT_S
from tasks.gpu import alarms as gpu_alarms
from tasks.health import service_alarms
from tasks.records import alarms as records_alarms
from tasks.video import alarms as video_alarms
from tests.helpers.health import make_dead_letter

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

LIMITS = HealthThresholds()


def a_run_of(flow_name: str, *states) -> str:
    """A flow run of ``flow_name`` (never executed) moved through ``states``; its unique name."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    @flow(name=flow_name)
    def stand_in() -> None:
        """Never run: the test sets its run's states."""

    name = f"alarm-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(stand_in, name=name)
        for state in states:
            client.set_flow_run_state(run.id, state, force=True)
    return name


def test_failed_timed_out_waiting_and_running_runs_raise_their_seed_alarms():
    from prefect.states import Failed, Running, Scheduled

    failed = a_run_of("ndjson-merge", Running(), Failed(message="boom"))
    crashed_elsewhere = a_run_of("video-process", Running(), Failed(message="boom"))
    timed_out = a_run_of("ndjson-merge", Running(), Failed(name="TimedOut", message="Flow run exceeded timeout"))
    waiting = a_run_of("ndjson-merge", Scheduled(name="AwaitingConcurrencySlot"))
    running = a_run_of("gpu-job", Running())
    not_ours = a_run_of("someone-elses-flow", Running(), Failed())

    assert service_alarms.flow_runs_failed(LIMITS.model_copy(update={"failed_runs_5min_max": 0})).firing
    assert etl_alarms.etl_merge_runs_failed(LIMITS.model_copy(update={"failed_merge_runs_5min_max": 0})).firing
    merges = service_alarms.flow_runs(states=("FAILED", "CRASHED"), ended_within_s=300, flows=("ndjson-merge",))
    assert {failed, timed_out} <= {r.name for r in merges} and crashed_elsewhere not in {r.name for r in merges}
    every_failed = service_alarms.flow_runs(states=("FAILED", "CRASHED"), ended_within_s=300)
    assert {failed, crashed_elsewhere, timed_out} <= {r.name for r in every_failed} and not_ours not in {
        r.name for r in every_failed
    }
    assert timed_out in {r.name for r in service_alarms.flow_runs(names=("TimedOut",), ended_within_s=300)}
    assert service_alarms.flow_runs_timed_out(LIMITS).firing
    assert waiting in {r.name for r in service_alarms.flow_runs(names=("AwaitingConcurrencySlot",))}
    assert service_alarms.flow_runs_waiting(LIMITS.model_copy(update={"waiting_runs_max": 0})).firing
    assert running in {r.name for r in service_alarms.flow_runs(states=("RUNNING",))}
    assert service_alarms.flow_runs_active(LIMITS.model_copy(update={"active_runs_max": 0})).firing


def test_a_run_past_80_percent_of_its_timeout_raises_duration_high(monkeypatch):
    from prefect.states import Running

    monkeypatch.setattr(limits, "flow_timeouts", lambda: {"pipeline-health": 2.0})
    run = a_run_of("pipeline-health", Running())
    assert run not in service_alarms.flow_runs_near_timeout(LIMITS).detail  # just started
    time.sleep(2)
    alarm = service_alarms.flow_runs_near_timeout(LIMITS)
    assert alarm.firing and f"{run} (pipeline-health, " in alarm.detail


def test_merge_file_failures_count_the_last_five_minutes_of_the_metrics_table(health, tables):
    now = time.time_ns() // 1000
    for at, failed in ((now - 60_000_000, 7), (now - 120_000_000, 5), (now - 600_000_000, 50)):
        state_store.put(
            tables["etl_metrics"],
            {"metric_type": "merge", "timestamp": at, "manifest": f"m{failed}", "files_failed": failed, "ttl": 0},
        )
    alarm = etl_alarms.etl_merge_file_failures(LIMITS)
    assert (alarm.value, alarm.threshold, alarm.firing) == (12, 10, True)
    assert alarm.detail == "12 file(s) failed by merges in 5 min: m5: 5, m7: 7"  # oldest first


def test_the_other_seeds_failure_rates_per_hour(health, tables):
    recent, old = now_iso(), iso_ago(2 * 3600)
    for task_id, job_id, retry, at in (("t1", "j1", "0", recent), ("t2", "j1", "1", recent), ("t3", "j2", "2", old)):
        state_store.put(
            tables["ecs_task"], {"ecs_task_id": task_id, "job_id": job_id, "retry": retry, "created_at": at}
        )
    assert (
        gpu_alarms.gpu_restarts(LIMITS.model_copy(update={"gpu_restarts_hour_max": 0})).detail
        == "1 GPU job restart(s) in the last hour: j1 (retry 1)"
    )
    for job_id, at in (("v1", recent), ("v2", old)):
        state_store.put(
            tables["video_jobs"], {"job_id": job_id, "status": "failed", "failed_at": at, "failure_reason": "bad"}
        )
    alarm = video_alarms.video_jobs_failed(LIMITS)
    assert (alarm.value, alarm.firing, alarm.detail) == (1, True, "1 video job(s) failed in the last hour: v1: bad")
    make_dead_letter("m-1"), make_dead_letter("m-2")
    alarm = records_alarms.records_archived(LIMITS)
    assert (alarm.value, alarm.firing) == (2, False)  # 2 of 10 an hour


def test_the_landing_dead_letter_queue_depth_in_aws(aws, monkeypatch):
    from tasks.landing.sqs import queue_names, queue_url_variable

    assert service_alarms.landing_dead_letter_queues(LIMITS) == []  # no queue set up: the local file watch
    queue, dead_letter = queue_names("etl")
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    dlq = sqs.create_queue(QueueName=dead_letter)["QueueUrl"]
    for i in range(2):
        sqs.send_message(QueueUrl=dlq, MessageBody=f"poison {i}")
    monkeypatch.setenv(queue_url_variable("etl"), url)
    (alarm,) = service_alarms.landing_dead_letter_queues(LIMITS)
    assert (alarm.name, alarm.value, alarm.firing) == ("landing-dead-letter-queue-etl", 2, True)


def test_duration_high_covers_the_ingest_steps_past_80_percent_of_the_manifest_builder_timeout(monkeypatch):
    from prefect import task
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    @task(name="track-and-batch-files")
    def stand_in() -> None:
        """Never run: the test sets its run's state."""

    assert limits.task_timeouts()["track-and-batch-files"] == MANIFEST_BUILDER_TIMEOUT_S == 180  # seed 001
    monkeypatch.setattr(limits, "task_timeouts", lambda: {"track-and-batch-files": 2.0})
    name = f"track-and-batch-files-{uuid.uuid4().hex[:3]}"
    with get_client(sync_client=True) as client:
        client.create_task_run(stand_in, flow_run_id=None, dynamic_key=name, name=name, state=Running())
    assert name not in service_alarms.flow_runs_near_timeout(LIMITS).detail  # just started
    time.sleep(2)
    alarm = service_alarms.flow_runs_near_timeout(LIMITS)
    assert alarm.firing and f"{name} (track-and-batch-files, " in alarm.detail and alarm.severity == "WARNING"


class _Raw:
    """The raw body of a made-up HTTP response, as botocore reads it."""

    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_):
        yield self.body


def test_throttled_dynamodb_reads_the_client_retried_raise_the_read_throttle_alarm(tables):
    """Locally: DynamoDB Local never throttles, so the first two GetItem attempts are answered with DynamoDB's own
    ProvisionedThroughputExceededException; botocore's adaptive mode retries them (the third lands) and the alarm
    counts the two throttled attempts (state_store's retry hook)."""
    import json

    from botocore.awsrequest import AWSResponse
    from prefect.events.worker import EventsWorker

    table = tables["etl_file_tracking"]
    throttled = []

    def throttle(request, **_):
        if len(throttled) < 2:
            throttled.append(request.url)
            body = json.dumps(
                {
                    "__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                    "message": "The level of configured provisioned throughput for the table was exceeded.",
                }
            )
            return AWSResponse(
                request.url, 400, {"x-amzn-ErrorType": "ProvisionedThroughputExceededException"}, _Raw(body.encode())
            )
        return None

    state_store.reset_clients()
    events = state_store.client().meta.events
    events.register_first("before-send.dynamodb.GetItem", throttle, unique_id="test-throttle")
    try:
        assert (
            state_store.get_item(table, {"date_prefix": "2026-01-01", "file_key": "none.ndjson"}) is None
        )  # retried, then read
    finally:
        events.unregister("before-send.dynamodb.GetItem", unique_id="test-throttle")
    assert len(throttled) == 2
    EventsWorker.drain_all()
    strict = LIMITS.model_copy(update={"read_throttles_5min_max": 1})
    for _ in range(50):
        alarms = {a.name: a for a in etl_alarms.dynamodb_throttles(strict)}
        if alarms["etl-tracking-read-throttles"].value == 2:
            break
        time.sleep(0.2)
    read, write = alarms["etl-tracking-read-throttles"], alarms["etl-tracking-write-throttles"]
    assert (read.value, read.firing, read.severity) == (2, True, "WARNING") and table in read.detail
    assert (write.value, write.firing) == (0, False)


def test_the_dynamodb_throttle_alarms_read_cloudwatch_in_aws(aws, s3_endpoint, tables, monkeypatch):
    from datetime import datetime

    from tasks.core.config import table_name

    monkeypatch.delenv("AWS_ENDPOINT_URL_DYNAMODB")  # DynamoDB is AWS's: its metrics are CloudWatch's
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", s3_endpoint)  # moto's CloudWatch
    table = table_name("etl_file_tracking")
    cloudwatch = boto3.client("cloudwatch")
    for metric, value in (("ReadThrottleEvents", 8), ("WriteThrottleEvents", 2)):
        cloudwatch.put_metric_data(
            Namespace="AWS/DynamoDB",
            MetricData=[
                {
                    "MetricName": metric,
                    "Dimensions": [{"Name": "TableName", "Value": table}],
                    "Value": value,
                    "Timestamp": datetime.now(UTC),
                    "Unit": "Count",
                }
            ],
        )
    cloudwatch.put_metric_data(
        Namespace="AWS/DynamoDB",
        MetricData=[
            {  # another table's throttles do not count
                "MetricName": "WriteThrottleEvents",
                "Dimensions": [{"Name": "TableName", "Value": "someone-else"}],
                "Value": 50,
            }
        ],
    )
    alarms = {a.name: a for a in etl_alarms.dynamodb_throttles(LIMITS)}
    read, write = alarms["etl-tracking-read-throttles"], alarms["etl-tracking-write-throttles"]
    assert (read.value, read.threshold, read.firing) == (8, 5, True)  # the seed's > 5 in 5 min
    assert (write.value, write.firing) == (2, False)


def test_the_landing_dead_letter_queue_alarm_finds_the_queues_aws_events_setup_made(aws, capsys):
    from deployments import cli
    from tasks.landing.sqs import queue_url_variable

    assert not any(os.environ.get(queue_url_variable(p)) for p in ("etl", "video", "phspectra", "records"))  # as on ECS
    assert cli.main(["aws-events", "setup", "--pipeline", "etl"]) == 0
    dead_letter_url = json.loads(capsys.readouterr().out)["dead_letter_url"]
    boto3.client("sqs").send_message(QueueUrl=dead_letter_url, MessageBody="poison")
    (alarm,) = service_alarms.landing_dead_letter_queues(LIMITS)  # the other pipelines' queues: not set up here
    assert (alarm.name, alarm.value, alarm.firing) == ("landing-dead-letter-queue-etl", 1, True)
