"""The AWS arrival path against moto's server: `aws-events setup` → bucket notification → SQS → SqsSource.

moto serves S3 and SQS on one loopback endpoint (tests/helpers/s3.py); S3 sends its notifications to the queue the
setup configured, as AWS does. Listing uses ListObjectsV2's sizes, never a HEAD per object.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC

import boto3
import pytest

from deployments import cli
from tasks.core import state_store
from tasks.core.object_store import ListedObject, LocalStore, ObjectStore, S3Store
from tasks.etl import ingest as etl
from tasks.etl import keys
from tasks.landing.listing import listed_arrivals
from tasks.landing.sqs import SqsSource
from tests.helpers.crashpoints import REPO_ROOT, child_env
from tests.helpers.s3 import s3_client

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

DAY = "2026-02-01"


def sqs():
    """A plain SQS client of the moto server (to look at the queues)."""
    return boto3.client("sqs")


def setup(pipeline: str, capsys, *extra: str) -> dict:
    """`python -m deployments.cli aws-events setup --pipeline …`, its JSON output."""
    assert cli.main(["aws-events", "setup", "--pipeline", pipeline, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def counts(queue_url: str) -> tuple[int, int]:
    """(visible, in flight) messages of a queue."""
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = sqs().get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return int(attributes[names[0]]), int(attributes[names[1]])


def receive_until(source: SqsSource, n: int, deadline_s: float = 30) -> list:
    """Arrivals received until there are ``n`` (or the deadline passes)."""
    got, deadline = [], time.monotonic() + deadline_s
    while len(got) < n and time.monotonic() < deadline:
        got += source.receive(wait_seconds=1)
    return got


@pytest.fixture
def small_files(monkeypatch):
    """ETL settings for small files: 1 KiB ± 99%, 2 files per manifest."""
    for name, value in {
        "ETL_EXPECTED_FILE_SIZE_MB": "0.001",
        "ETL_SIZE_TOLERANCE_PERCENT": "99",
        "ETL_MAX_FILES_PER_MANIFEST": "2",
        "ETL_NUM_STATUS_SHARDS": "2",
    }.items():
        monkeypatch.setenv(name, value)


@contextlib.contextmanager
def s3_requests():
    """Counts S3 requests by operation, of every client the code makes meanwhile (boto3's default session)."""
    requests, events = Counter(), boto3._get_default_session().events

    def count(model, **_):
        return requests.update([model.name])

    events.register("before-call.s3", count)
    try:
        yield requests
    finally:
        events.unregister("before-call.s3", count)


def s3_event(bucket: str, *events: tuple[str, str]) -> str:
    """An S3 notification body with one record per (event name, key) (keys URL-encoded, as S3 sends them)."""
    from urllib.parse import quote_plus

    records = [
        {
            "eventName": name,
            "eventTime": "2026-02-01T00:00:00.000Z",
            "s3": {"bucket": {"name": bucket}, "object": {"key": quote_plus(k), "size": 3, "sequencer": f"0{n}"}},
        }
        for n, (name, k) in enumerate(events)
    ]
    return json.dumps({"Records": records})


# --------------------------------------------------------------------------- setup


def test_setup_creates_queue_dead_letter_queue_and_notification_and_twice_changes_nothing(aws, capsys):
    bucket, s3 = aws, s3_client(os.environ["AWS_ENDPOINT_URL_S3"])
    other = sqs().create_queue(QueueName=f"other-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    other_arn = sqs().get_queue_attributes(QueueUrl=other, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    theirs = {
        "Id": "someone-else",
        "QueueArn": other_arn,
        "Events": ["s3:ObjectCreated:*"],
        "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "elsewhere/"}]}},
    }
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={"QueueConfigurations": [theirs]})

    first = setup("etl", capsys)
    env = os.environ["TABLE_ENV"]
    assert first["changed"] == [
        f"created queue ndjson-parquet-dlq-{env}",
        f"created queue ndjson-parquet-file-events-{env}",
        f"queue policy: {bucket} may send",
        f"s3://{bucket}/pipelines/pipeline/input/: objects created notify the queue",
    ]
    assert (first["bucket"], first["prefix"], first["visibility_timeout_s"]) == (
        bucket,
        "pipelines/pipeline/input/",
        360,
    )
    attributes = sqs().get_queue_attributes(QueueUrl=first["queue_url"], AttributeNames=["All"])["Attributes"]
    dead_letter_arn = sqs().get_queue_attributes(QueueUrl=first["dead_letter_url"], AttributeNames=["All"])[
        "Attributes"
    ]
    assert (attributes["VisibilityTimeout"], attributes["ReceiveMessageWaitTimeSeconds"]) == ("360", "20")
    redrive = json.loads(attributes["RedrivePolicy"])
    assert (redrive["deadLetterTargetArn"], int(redrive["maxReceiveCount"])) == (dead_letter_arn["QueueArn"], 3)
    assert dead_letter_arn["MessageRetentionPeriod"] == str(14 * 24 * 3600)
    (statement,) = json.loads(attributes["Policy"])["Statement"]
    assert statement["Condition"] == {"ArnLike": {"aws:SourceArn": f"arn:aws:s3:::{bucket}"}}
    configured = s3.get_bucket_notification_configuration(Bucket=bucket)["QueueConfigurations"]
    assert sorted((q["Id"], q["QueueArn"]) for q in configured) == sorted(
        [("someone-else", other_arn), ("pipelines-etl-arrivals", first["queue_arn"])]
    )

    again = setup("etl", capsys)
    assert again["changed"] == [] and again["queue_url"] == first["queue_url"]
    assert s3.get_bucket_notification_configuration(Bucket=bucket)["QueueConfigurations"] == configured

    # S3's test event (sent when the notification was configured) is deleted and yields nothing
    source = SqsSource.for_pipeline("etl")
    assert source.receive(wait_seconds=1) == [] and counts(first["queue_url"]) == (0, 0)


def test_records_queue_carries_messages_in_batches_of_ten(aws, capsys):
    made = setup("records", capsys)
    assert made["visibility_timeout_s"] == 150 and "bucket" not in made
    bodies = [json.dumps({"n": n}) for n in range(12)]
    for body in bodies:
        sqs().send_message(QueueUrl=made["queue_url"], MessageBody=body)
    source = SqsSource.for_pipeline("records", visibility_timeout_s=60)
    batch = source.receive(max_items=10, wait_seconds=1)
    assert len(batch) == 10 and {(a.url, a.key, a.size) for a in batch} == {(made["queue_url"], "", None)}
    source.ack(batch)
    rest = source.receive(max_items=10, wait_seconds=1)
    assert sorted(a.body for a in batch + rest) == sorted(bodies)
    assert len({a.event_id for a in batch + rest}) == 12
    source.ack(rest)
    assert counts(made["queue_url"]) == (0, 0)


def test_for_pipeline_finds_the_queue_by_variable_or_by_its_seed_name(aws, capsys, monkeypatch):
    with pytest.raises(ValueError, match="unknown pipeline 'nope'"):
        SqsSource.for_pipeline("nope")
    with pytest.raises(LookupError, match="aws-events setup --pipeline video"):
        SqsSource.for_pipeline("video")  # its queue was never set up
    monkeypatch.setenv("PIPELINES_VIDEO_QUEUE_URL", "http://127.0.0.1:1/123456789012/named-outright")
    assert SqsSource.for_pipeline("video").queue_url == "http://127.0.0.1:1/123456789012/named-outright"
    monkeypatch.delenv("PIPELINES_VIDEO_QUEUE_URL")
    made = setup("video", capsys)
    assert (made["prefix"], made["visibility_timeout_s"]) == ("pipelines/input/", 900)
    assert SqsSource.for_pipeline("video").queue_url == made["queue_url"]


# --------------------------------------------------------------------------- arrivals


def test_an_object_put_is_one_arrival_offered_again_until_acked(aws, capsys):
    made, bucket = setup("etl", capsys), aws
    source = SqsSource.for_pipeline("etl", visibility_timeout_s=2)
    assert source.receive(wait_seconds=1) == []  # the test event
    key = f"pipelines/pipeline/input/{DAY}/report 1 é+ü.ndjson"
    s3_client(os.environ["AWS_ENDPOINT_URL_S3"]).put_object(Bucket=bucket, Key=key, Body=b"{}\n{}\n")

    (arrival,) = receive_until(source, 1)
    assert (arrival.url, arrival.key, arrival.size, arrival.receive_count) == (
        f"s3://{bucket}/{key}",
        f"pipeline/input/{DAY}/report 1 é+ü.ndjson",
        6,
        1,
    )
    assert source.receive(wait_seconds=0) == []  # in flight
    (again,) = receive_until(source, 1)  # not acked: offered again once the visibility timeout passed
    assert (again.url, again.event_id, again.receive_count) == (arrival.url, arrival.event_id, 2)
    source.ack([again])
    assert counts(made["queue_url"]) == (0, 0)


def test_a_poison_message_goes_to_the_dead_letter_queue_after_three_receives(aws, capsys, caplog):
    made = setup("etl", capsys)
    source = SqsSource.for_pipeline("etl", release_backoff_s=(0,))
    assert source.receive(wait_seconds=1) == []  # the test event
    sqs().send_message(QueueUrl=made["queue_url"], MessageBody="not json {")
    with caplog.at_level(logging.ERROR, logger="tasks.landing.sqs"):
        for _ in range(4):  # received 3 times (released each time); the 4th receive moves it to the DLQ
            assert source.receive(wait_seconds=1) == []
    poison = [r.getMessage() for r in caplog.records if r.getMessage().startswith("poison message")]
    assert len(poison) == 3 and all("not JSON" in line for line in poison)
    assert counts(made["queue_url"]) == (0, 0)
    (dead,) = sqs().receive_message(QueueUrl=made["dead_letter_url"], WaitTimeSeconds=1)["Messages"]
    assert dead["Body"] == "not json {"


def test_a_message_with_several_records_is_deleted_once_all_are_acked(aws, capsys):
    made, bucket = setup("etl", capsys), aws
    source = SqsSource.for_pipeline("etl", visibility_timeout_s=60, release_backoff_s=(0,))
    assert source.receive(wait_seconds=1) == []  # the test event
    created, removed = "ObjectCreated:Put", "ObjectRemoved:Delete"
    body = s3_event(
        bucket,
        (created, "pipelines/a.ndjson"),
        (created, "pipelines/b c.ndjson"),
        (created, "elsewhere/x"),
        (removed, "pipelines/old.ndjson"),
    )
    sqs().send_message(QueueUrl=made["queue_url"], MessageBody=json.dumps({"Type": "Notification", "Message": body}))

    # S3 → SNS → SQS: an arrival per object created in the store; none for the one outside it or the removal
    first, second = sorted(source.receive(wait_seconds=1), key=lambda a: a.key)
    assert (first.key, second.key, first.receipt == second.receipt) == ("a.ndjson", "b c.ndjson", True)
    source.release([first], "a test gives it back")
    first, second = sorted(receive_until(source, 2), key=lambda a: a.key)  # the whole message again
    assert (first.receive_count, second.receive_count) == (2, 2)
    source.ack([first])
    assert counts(made["queue_url"]) == (0, 1)  # still held for the record not acked
    source.ack([second])
    assert counts(made["queue_url"]) == (0, 0)


def test_etl_on_s3_from_arrivals_tracks_each_file_once_when_events_come_twice(aws, capsys, tables, small_files):
    made, store, config = (
        setup("etl", capsys),
        ObjectStore.from_url(os.environ["OBJECT_STORE_BASE_URL"]),
        etl.settings(),
    )
    source = SqsSource.for_pipeline("etl", visibility_timeout_s=2)
    assert source.receive(wait_seconds=1) == []  # the test event
    names = [f"part-{i}.ndjson" for i in range(3)]
    for name in names:
        store.put_bytes(keys.input_key(DAY, name), b'{"id": 1}\n' * 40)

    outcomes = []
    with s3_requests() as requests:
        for _delivery in range(2):  # the first consumer dies before its ack: the same events come again
            arrivals = receive_until(source, 3)
            checks = etl.validate_files([a.url for a in arrivals], config, [a.size for a in arrivals])
            outcomes.append(etl.track_and_batch(checks, config))
    source.ack(arrivals)

    assert requests["HeadObject"] == 0 and requests["PutObject"] == 1  # one manifest, no HEAD per file
    assert [(o["tracked"], o["already_tracked"], len(o["manifests"])) for o in outcomes] == [(3, 0, 1), (0, 3, 0)]
    files = [i for i in state_store.scan_all(tables["etl_file_tracking"]) if not keys.is_meta_record(i["file_key"])]
    assert sorted((i["file_key"], etl.base_status(i)) for i in files) == [
        ("part-0.ndjson", "manifested"),
        ("part-1.ndjson", "manifested"),
        ("part-2.ndjson", "pending"),
    ]
    assert counts(made["queue_url"]) == (0, 0)


def test_a_listener_killed_mid_batch_loses_nothing(aws, capsys, tmp_path):
    made, store = setup("etl", capsys), ObjectStore.from_url(os.environ["OBJECT_STORE_BASE_URL"])
    assert SqsSource.for_pipeline("etl").receive(wait_seconds=1) == []  # the test event
    for i in range(4):
        store.put_bytes(keys.input_key(DAY, f"part-{i}.ndjson"), b"{}\n")
    child = (
        "import sys, time\nfrom tasks.landing.sqs import SqsSource\n"
        "source = SqsSource.for_pipeline('etl', visibility_timeout_s=3)\n"
        "got = []\nwhile len(got) < 4:\n    got += source.receive(wait_seconds=1)\n"
        "print(' '.join(sorted(a.event_id for a in got)), flush=True)\ntime.sleep(600)\n"
    )
    log = open(tmp_path / "listener.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-c", child], env=child_env(), cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=log, text=True
    )
    try:
        taken = process.stdout.readline().split()
        assert len(taken) == 4, (tmp_path / "listener.log").read_text()[-3000:]
    finally:
        process.send_signal(signal.SIGKILL)  # mid-batch: received, nothing acked
        process.wait(timeout=30)
        log.close()
    assert process.returncode == -signal.SIGKILL
    source = SqsSource.for_pipeline("etl", visibility_timeout_s=60)
    again = receive_until(source, 4)
    assert sorted(a.event_id for a in again) == taken and {a.receive_count for a in again} == {2}
    source.ack(again)
    assert counts(made["queue_url"]) == (0, 0)


# --------------------------------------------------------------------------- listing


def test_list_objects_returns_sizes_with_no_head_request(aws):
    session = boto3.Session()
    requests = Counter()
    session.events.register("before-call.s3", lambda model, **_: requests.update([model.name]))
    store = S3Store(aws, "pipelines", session=session)
    sizes = {keys.input_key(DAY, f"part-{i}.ndjson"): 10 + i for i in range(3)}
    for key, size in sizes.items():
        store.put_bytes(key, b"x" * size)
    store.put_bytes("elsewhere/other.ndjson", b"x")
    requests.clear()

    listed = store.list_objects(keys.INPUT_PREFIX)
    assert [(o.key, o.size, o.url) for o in listed] == [(k, s, store.url_for(k)) for k, s in sorted(sizes.items())]
    assert requests == Counter({"ListObjectsV2": 1})
    assert all(o.last_modified.endswith("+00:00") for o in listed)

    arrivals = listed_arrivals(f"s3://{aws}/pipelines/{keys.INPUT_PREFIX}")
    assert [(a.url, a.key, a.size) for a in arrivals] == [
        (o.url, o.key.removeprefix(keys.INPUT_PREFIX), o.size) for o in listed
    ]


def test_local_list_objects_skips_unfinished_writes(tmp_path):
    store = LocalStore(tmp_path)
    store.put_bytes("in/a.ndjson", b"abc")
    store.put_bytes("in/sub/b.ndjson", b"abcdef")
    (tmp_path / "in" / ".c.ndjson.x1.part").write_bytes(b"half")  # a writer killed mid-write
    listed = store.list_objects("in/")
    assert [(o.key, o.size, o.url) for o in listed] == [
        ("in/a.ndjson", 3, store.url_for("in/a.ndjson")),
        ("in/sub/b.ndjson", 6, store.url_for("in/sub/b.ndjson")),
    ]
    assert isinstance(listed[0], ListedObject) and etl.landing_objects(store.url_for("in")) == [
        ListedObject(o.key.removeprefix("in/"), o.size, o.url, o.last_modified) for o in listed
    ]


def test_ndjson_ingest_over_an_s3_landing_prefix_validates_with_the_listing_sizes(
    aws, tables, monkeypatch, small_files
):
    from flows.etl import ndjson_ingest

    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", "10")  # 3 files: no full batch, so no merge to start
    store = ObjectStore.from_url(os.environ["OBJECT_STORE_BASE_URL"])
    for i in range(3):
        store.put_bytes(keys.input_key(DAY, f"part-{i}.ndjson"), b'{"id": 1}\n' * 40)
    with s3_requests() as requests:
        summary = ndjson_ingest(merge_deployment="ndjson-merge/none-needed")
    assert (summary["files"], summary["tracked"], summary["quarantined"], summary["manifests"]) == (3, 3, 0, [])
    assert requests["HeadObject"] == 0 and requests["ListObjectsV2"] == 1


def test_a_record_whose_key_is_not_a_string_goes_to_the_dead_letter_queue_with_its_reason(aws, capsys, caplog):
    made = setup("etl", capsys)
    source = SqsSource.for_pipeline("etl", release_backoff_s=(0,))
    assert source.receive(wait_seconds=1) == []  # the test event
    record = {"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": aws}, "object": {"key": 12345, "size": 3}}}
    body = json.dumps({"Records": [record]})
    sqs().send_message(QueueUrl=made["queue_url"], MessageBody=body)
    with caplog.at_level(logging.ERROR, logger="tasks.landing.sqs"):
        for _ in range(4):  # never a crash: released 3 times, then the redrive policy takes it
            assert source.receive(wait_seconds=1) == []
    poison = [r.getMessage() for r in caplog.records if r.getMessage().startswith("poison message")]
    assert len(poison) == 3 and all("not a string" in line for line in poison)
    (dead,) = sqs().receive_message(QueueUrl=made["dead_letter_url"], WaitTimeSeconds=1)["Messages"]
    assert dead["Body"] == body


def test_keys_with_hash_question_mark_and_percent_reach_their_object(aws, capsys):
    from tasks.core.object_store import object_version, open_url

    setup("etl", capsys)
    source = SqsSource.for_pipeline("etl", visibility_timeout_s=60)
    assert source.receive(wait_seconds=1) == []  # the test event
    names = [
        f"pipeline/input/{DAY}/a#1.ndjson",
        f"pipeline/input/{DAY}/b?x=1.ndjson",
        f"pipeline/input/{DAY}/c%41 +.ndjson",
    ]
    client = s3_client(os.environ["AWS_ENDPOINT_URL_S3"])
    for n, name in enumerate(names):
        client.put_object(Bucket=aws, Key=f"pipelines/{name}", Body=b"x" * (n + 1))
    arrivals = sorted(receive_until(source, 3), key=lambda a: a.key)
    assert [a.key for a in arrivals] == names  # decoded once, as S3 encoded them
    for n, arrival in enumerate(arrivals):
        store, key = open_url(arrival.url)
        assert (key, store.get_bytes(key), object_version(arrival.url)[0]) == (
            f"pipelines/{names[n]}",
            b"x" * (n + 1),
            n + 1,
        )


def test_a_queue_whose_oldest_message_waits_too_long_raises_the_listener_behind_alarm(aws, capsys, monkeypatch):
    """The AWS half of `landing-listener-behind`: CloudWatch's ApproximateAgeOfOldestMessage of a landing queue."""
    from datetime import datetime, timedelta

    from blocks.health import HealthThresholds
    from tasks.health import listeners
    from tasks.landing.sqs import queue_names

    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", os.environ["AWS_ENDPOINT_URL_SQS"])
    setup("etl", capsys)
    assert listeners.oldest_message_age("etl") == 0.0  # set up, no figure yet: nothing waits
    assert listeners.oldest_message_age("video") is None  # never set up here

    def age(seconds: float, minutes_ago: float) -> None:
        boto3.client("cloudwatch").put_metric_data(
            Namespace="AWS/SQS",
            MetricData=[
                {
                    "MetricName": "ApproximateAgeOfOldestMessage",
                    "Dimensions": [{"Name": "QueueName", "Value": queue_names("etl")[0]}],
                    "Timestamp": datetime.now(UTC) - timedelta(minutes=minutes_ago),
                    "Value": seconds,
                    "Unit": "Seconds",
                }
            ],
        )

    age(60, minutes_ago=3)
    alarm = listeners.listeners_behind(HealthThresholds())
    assert not alarm.firing  # a minute: the listener keeps up
    age(listeners.LISTENER_BACKLOG_S + 100, minutes_ago=1)
    assert listeners.oldest_message_age("etl") == listeners.LISTENER_BACKLOG_S + 100  # the 5 minutes' maximum
    alarm = listeners.listeners_behind(HealthThresholds())
    assert alarm.firing and f"etl queue (oldest message {listeners.LISTENER_BACKLOG_S + 100} s)" in alarm.detail
