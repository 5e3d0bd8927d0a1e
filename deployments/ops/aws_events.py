"""`pipelines aws-events setup --pipeline …`: the SQS queues that make data arrival start a pipeline in AWS.

Creates the pipeline's dead-letter queue, its queue (the seed's visibility timeout, 20 s long polls, redrive
to the dead-letter queue after 3 receives), and for object pipelines the queue policy that lets the bucket
send and a QueueConfiguration for the input prefix merged into the bucket's notification configuration
(every other configuration is kept). Running it again changes nothing and says so (``changed: []``).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlparse

import boto3

from tasks.core.state_store import BOTO_CONFIG
from tasks.landing import sqs

OBJECT_CREATED = ["s3:ObjectCreated:*"]


def _same(have: str | None, want: str) -> bool:
    """Whether a queue attribute already has the wanted value (JSON policies compared as documents)."""
    if have is None:
        return False
    if want.startswith("{"):
        return _plain(json.loads(have)) == _plain(json.loads(want))
    return have == want


def _plain(document: Any) -> Any:
    """A JSON document with numbers as strings (SQS returns maxReceiveCount as either)."""
    if isinstance(document, dict):
        return {k: _plain(v) for k, v in document.items()}
    if isinstance(document, list):
        return [_plain(v) for v in document]
    return str(document)


def ensure_queue(client, name: str, attributes: dict[str, str], changed: list[str]) -> tuple[str, str]:
    """The queue ``name`` with ``attributes`` (created, or its differing attributes set); (URL, ARN)."""
    try:
        url = client.get_queue_url(QueueName=name)["QueueUrl"]
    except client.exceptions.QueueDoesNotExist:
        url = client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        changed.append(f"created queue {name}")
    else:
        have = client.get_queue_attributes(QueueUrl=url, AttributeNames=list(attributes)).get("Attributes", {})
        differ = {k: v for k, v in attributes.items() if not _same(have.get(k), v)}
        if differ:
            client.set_queue_attributes(QueueUrl=url, Attributes=differ)
            changed.append(f"set {', '.join(sorted(differ))} of queue {name}")
    arn = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, arn


def allow_bucket(client, url: str, arn: str, bucket: str, changed: list[str]) -> None:
    """Add (or correct) the queue policy statement that lets ``bucket`` send its notifications; others kept."""
    sid = f"s3-{bucket}-sends"
    statement = {
        "Sid": sid,
        "Effect": "Allow",
        "Principal": {"Service": "s3.amazonaws.com"},
        "Action": "sqs:SendMessage",
        "Resource": arn,
        "Condition": {"ArnLike": {"aws:SourceArn": f"arn:aws:s3:::{bucket}"}},
    }
    current = client.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"]).get("Attributes", {}).get("Policy")
    policy = json.loads(current) if current else {"Version": "2012-10-17", "Statement": []}
    statements = policy.get("Statement", [])
    statements = statements if isinstance(statements, list) else [statements]
    if statement in statements:
        return
    policy["Statement"] = [s for s in statements if s.get("Sid") != sid] + [statement]
    client.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(policy)})
    changed.append(f"queue policy: {bucket} may send")


def _rules(configuration: dict[str, Any]) -> dict[str, str]:
    rules = configuration.get("Filter", {}).get("Key", {}).get("FilterRules", [])
    return {rule["Name"].lower(): rule["Value"] for rule in rules}


def notify_queue(s3, bucket: str, prefix: str, arn: str, pipeline: str, changed: list[str]) -> None:
    """Merge one QueueConfiguration (objects created under ``prefix`` → the queue) into the bucket's
    notification configuration, keeping every other configuration; nothing is written when it is there."""
    current = s3.get_bucket_notification_configuration(Bucket=bucket)
    current.pop("ResponseMetadata", None)
    ours = {
        "Id": f"pipelines-{pipeline}-arrivals",
        "QueueArn": arn,
        "Events": OBJECT_CREATED,
        "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": prefix}]}},
    }
    queues = current.get("QueueConfigurations", [])
    if any(
        q["QueueArn"] == arn and sorted(q["Events"]) == OBJECT_CREATED and _rules(q) == {"prefix": prefix}
        for q in queues
    ):
        return
    current["QueueConfigurations"] = [q for q in queues if q.get("Id") != ours["Id"]] + [ours]
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration=current)
    changed.append(f"s3://{bucket}/{prefix}: objects created notify the queue")


def setup(
    pipeline: str, bucket: str | None = None, prefix: str | None = None, session: boto3.Session | None = None
) -> dict[str, Any]:
    """Create or correct ``pipeline``'s queue, dead-letter queue and (object pipelines) bucket notification."""
    spec = sqs.queue_spec(pipeline)
    session = session or sqs.aws_session() or boto3
    client = session.client("sqs", config=BOTO_CONFIG)
    queue_name, dead_letter_name = sqs.queue_names(pipeline)
    changed: list[str] = []
    dead_letter_url, dead_letter_arn = ensure_queue(client, dead_letter_name, sqs.dead_letter_attributes(), changed)
    url, arn = ensure_queue(client, queue_name, sqs.queue_attributes(spec, dead_letter_arn), changed)
    result = {
        "pipeline": pipeline,
        "queue_url": url,
        "queue_arn": arn,
        "dead_letter_url": dead_letter_url,
        "visibility_timeout_s": spec.visibility_timeout_s,
        "max_receive_count": sqs.MAX_RECEIVE_COUNT,
    }
    if spec.mode == sqs.OBJECTS:
        store = urlparse(sqs.landing_store_url(pipeline))
        bucket = bucket or (store.netloc if store.scheme == "s3" else None)
        if not bucket:
            raise ValueError(f"the {pipeline} store is not on S3: give --bucket")
        if prefix is None:
            base = store.path.strip("/") if store.netloc == bucket else ""
            prefix = f"{base}/{spec.input_prefix}" if base else spec.input_prefix
        allow_bucket(client, url, arn, bucket, changed)
        notify_queue(session.client("s3", config=BOTO_CONFIG), bucket, prefix, arn, pipeline, changed)
        result.update(bucket=bucket, prefix=prefix)
    return result | {"changed": changed}


def register(subparsers) -> None:
    """Add the ``aws-events`` subcommands: setup."""
    group = subparsers.add_parser("aws-events", help="S3 → SQS arrival queues that start the pipelines in AWS")
    commands = group.add_subparsers(dest="command", required=True)
    make = commands.add_parser("setup", help="queue + dead-letter queue (+ bucket notification); idempotent")
    make.add_argument("--pipeline", required=True, choices=sorted(sqs.landing_queues()))
    make.add_argument("--bucket", help="bucket whose new objects are notified (default: the pipeline's store's)")
    make.add_argument(
        "--prefix", help="key prefix notified (default: the store's prefix + the pipeline's input prefix)"
    )
    make.set_defaults(handler=lambda a: setup(a.pipeline, a.bucket, a.prefix))
