"""The AWS event source: S3 object-created notifications (or plain workflow messages) read from an SQS queue.

    S3 ──ObjectCreated──> (SNS) ──> SQS queue ──receive (long poll)──> Arrival(s) ──ack──> DeleteMessageBatch
                                       │                                  └─release──> ChangeMessageVisibility
                                       └── redrive policy: after 3 receives a message goes to the queue's DLQ

One SQS message may carry several S3 records: each becomes an Arrival with the message's receipt, and the
message is deleted only once every one of them was acked. A body that does not parse (poison) is never
deleted here: it is released, and the queue's redrive policy moves it to the dead-letter queue after its
third receive. S3's ``s3:TestEvent`` (sent when a notification is configured) is deleted and yields nothing.
"""

from __future__ import annotations

import json
import logging
import pkgutil
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote_plus, urlparse

import boto3

from blocks import DynamoTables, ObjectStorage, load_config
from tasks.core import keys, registry
from tasks.core.config import object_store
from tasks.core.errors import RefusedInput
from tasks.core.registry import MESSAGES, OBJECTS, QueueSpec
from tasks.core.state_store import BOTO_CONFIG
from tasks.landing.settings import ListenerSettings
from tasks.landing.sources import Arrival

log = logging.getLogger(__name__)

MAX_BATCH = 10  # SQS: at most 10 messages per receive, 10 entries per batch call
MAX_WAIT_S = 20  # SQS: the longest long poll
RELEASE_BACKOFF_S = (30, 120, 300)  # visibility after a release, by how many times the message was received
SYSTEM_ATTRIBUTES = ["ApproximateReceiveCount", "SentTimestamp"]


MAX_RECEIVE_COUNT = 3  # every seed: a message is tried 3 times, then it goes to the dead-letter queue
DEAD_LETTER_RETENTION_S = 14 * 24 * 3600  # seed 001: the DLQ keeps messages 14 days


def dead_letter_attributes() -> dict[str, str]:
    """SQS attributes of every dead-letter queue (`aws-events setup` and infra/cloudformation.py apply them)."""
    return {"MessageRetentionPeriod": str(DEAD_LETTER_RETENTION_S)}


def queue_attributes(spec: QueueSpec, dead_letter_arn: str) -> dict[str, str]:
    """SQS attributes of ``spec``'s queue: the seed's visibility timeout, 20 s long polls, redrive after 3 receives."""
    redrive = {"deadLetterTargetArn": dead_letter_arn, "maxReceiveCount": MAX_RECEIVE_COUNT}
    return {
        "VisibilityTimeout": str(spec.visibility_timeout_s),
        "ReceiveMessageWaitTimeSeconds": str(MAX_WAIT_S),
        "RedrivePolicy": json.dumps(redrive),
    }


def landing_queues() -> dict[str, QueueSpec]:
    """Pipeline name -> its seed queue, for every pipeline with a landing (``tasks.core.registry``)."""
    return {pipeline: landing.queue for pipeline, landing in registry.landings().items()}


def queue_spec(pipeline: str) -> QueueSpec:
    """The seed queue of ``pipeline``; ValueError naming the known ones otherwise."""
    queues = landing_queues()
    if pipeline not in queues:
        raise ValueError(f"unknown pipeline {pipeline!r}: one of {', '.join(sorted(queues))}")
    return queues[pipeline]


def queue_names(pipeline: str) -> tuple[str, str]:
    """(queue, dead-letter queue) names of ``pipeline`` in the configured environment (the tables' ``env``)."""
    return queue_spec(pipeline).names(load_config(DynamoTables).env)


def queue_url_variable(pipeline: str) -> str:
    """``PIPELINES_<PIPELINE>_QUEUE_URL``: where a deployment names its queue outright."""
    queue_spec(pipeline)
    return ListenerSettings.pattern_name(f"{pipeline}_QUEUE_URL")


def queue_url_set(pipeline: str) -> str | None:
    """The queue URL ``PIPELINES_<PIPELINE>_QUEUE_URL`` sets (None: unset)."""
    queue_spec(pipeline)
    return ListenerSettings.read_pattern(f"{pipeline}_QUEUE_URL")


def aws_session() -> boto3.Session | None:
    """The object storage block's credentials (the bucket's account owns the queues); None: boto3's default chain."""
    credentials = load_config(ObjectStorage).aws_credentials
    return credentials.get_boto3_session() if credentials is not None else None


def landing_store_url(pipeline: str) -> str:
    """The store whose objects reach ``pipeline``'s queue: the one its landing names (the ETL's input store), else
    the pipeline object store."""
    queue_spec(pipeline)
    store = registry.pipeline(pipeline).landing.store
    return pkgutil.resolve_name(store)() if store else object_store().url


def object_url(bucket: str, key: str) -> str:
    """``s3://bucket/key``: the URL the object stores use for an S3 object."""
    return f"s3://{bucket}/{key}"


class PoisonMessage(RefusedInput):
    """A message whose body is not what the queue should carry."""


def _iso_from_millis(millis: str | None) -> str:
    moment = datetime.fromtimestamp(int(millis) / 1000, UTC) if millis else datetime.now(UTC)
    return moment.isoformat()


def s3_records(body: str) -> list[dict[str, Any]] | None:
    """The S3 event records of a message body (SNS-wrapped or not); None for S3's test event; PoisonMessage else."""
    try:
        document = json.loads(body)
        if isinstance(document, dict) and document.get("Type") == "Notification" and "Message" in document:
            document = json.loads(document["Message"])  # S3 → SNS → SQS
    except (TypeError, ValueError) as error:
        raise PoisonMessage(f"not JSON: {error}") from None
    if not isinstance(document, dict):
        raise PoisonMessage("not a JSON object")
    if document.get("Event") == "s3:TestEvent":
        return None
    records = document.get("Records")
    if not isinstance(records, list) or not records:
        raise PoisonMessage("no S3 event Records")
    for record in records:
        try:
            fields = record["s3"]["bucket"]["name"], record["s3"]["object"]["key"], record["eventName"]
        except (TypeError, KeyError):
            raise PoisonMessage("an S3 record without eventName, bucket name or object key") from None
        if not all(isinstance(value, str) for value in fields):
            raise PoisonMessage(
                f"an S3 record whose eventName, bucket name or object key is not a string: {fields!r}"[:300]
            )
    return records


class SqsSource:
    """EventSource over one SQS queue: S3 notifications (``mode="objects"``) or plain messages (``"messages"``).

    ``store_url`` (s3://bucket/prefix) is the store the listener watches: arrivals' keys are relative to it and
    objects outside it are logged and deleted (no pipeline of this listener can take them).
    ``visibility_timeout_s`` overrides the queue's own for messages received here (None: the queue's)."""

    def __init__(
        self,
        queue_url: str,
        session: boto3.Session | None = None,
        mode: str = OBJECTS,
        store_url: str | None = None,
        visibility_timeout_s: int | None = None,
        release_backoff_s: Sequence[int] = RELEASE_BACKOFF_S,
    ):
        if mode not in (OBJECTS, MESSAGES):
            raise ValueError(f"unknown mode {mode!r}: {OBJECTS!r} or {MESSAGES!r}")
        if not release_backoff_s:
            raise ValueError("release_backoff_s needs at least one delay")
        self.queue_url, self.mode = queue_url, mode
        self.visibility_timeout_s = visibility_timeout_s
        self.release_backoff_s = tuple(int(s) for s in release_backoff_s)
        self._bucket, self._prefix = self._store_root(store_url)
        self._client = (session or boto3).client("sqs", config=BOTO_CONFIG)
        self._lock = threading.Lock()
        self._unacked: dict[str, set[Arrival]] = {}  # receipt -> arrivals of that message not acked yet

    @staticmethod
    def _store_root(store_url: str | None) -> tuple[str | None, str]:
        if not store_url:
            return None, ""
        parsed = urlparse(store_url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"SQS arrivals come from S3: store_url must be s3://bucket[/prefix], not {store_url!r}")
        prefix = parsed.path.strip("/")
        return parsed.netloc, f"{prefix}/" if prefix else ""

    @classmethod
    def for_pipeline(cls, pipeline: str, **options: Any) -> SqsSource:
        """The source of ``pipeline``'s seed queue: ``PIPELINES_<PIPELINE>_QUEUE_URL``, else the queue named in
        its landing's queue spec for the configured env, looked up in the account of the object storage credentials."""
        spec, variable = queue_spec(pipeline), queue_url_variable(pipeline)
        session = options.pop("session", None) or aws_session()
        url = queue_url_set(pipeline)
        if not url:
            name = queue_names(pipeline)[0]
            client = (session or boto3).client("sqs", config=BOTO_CONFIG)
            try:
                url = client.get_queue_url(QueueName=name)["QueueUrl"]
            except client.exceptions.QueueDoesNotExist:
                raise LookupError(
                    f"no SQS queue {name!r} for {pipeline}: run `python -m deployments.cli aws-events setup "
                    f"--pipeline {pipeline}` or set {variable}"
                ) from None
        if spec.mode == OBJECTS:
            options.setdefault("store_url", landing_store_url(pipeline))
        return cls(url, session=session, mode=spec.mode, **options)

    # ------------------------------------------------------------------ EventSource

    def receive(self, max_items: int = 10, wait_seconds: float = 20.0) -> list[Arrival]:
        """Arrivals of up to ``max_items`` messages from one long poll (then quick polls while full batches keep
        coming); a message with several S3 records gives one arrival each."""
        arrivals: list[Arrival] = []
        taken, wait = 0, int(min(max(wait_seconds, 0), MAX_WAIT_S))
        while taken < max_items:
            request = dict(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(MAX_BATCH, max_items - taken),
                WaitTimeSeconds=wait,
                AttributeNames=SYSTEM_ATTRIBUTES,
            )
            if self.visibility_timeout_s is not None:
                request["VisibilityTimeout"] = self.visibility_timeout_s
            messages = self._client.receive_message(**request).get("Messages", [])
            for message in messages:
                arrivals += self._arrivals(message)
            taken += len(messages)
            if len(messages) < request["MaxNumberOfMessages"]:
                break
            wait = 0  # the queue had a full batch: take what else is there without waiting
        return arrivals

    def ack(self, arrivals: Sequence[Arrival]) -> None:
        """Delete each message once all of its arrivals are acked (DeleteMessageBatch, 10 at a time)."""
        done = []
        with self._lock:
            for arrival in arrivals:
                waiting = self._unacked.get(arrival.receipt or "")
                if waiting is None:
                    continue
                waiting.discard(arrival)
                if not waiting:
                    del self._unacked[arrival.receipt]
                    done.append(arrival.receipt)
        self._delete(done)

    def release(self, arrivals: Sequence[Arrival], reason: str) -> None:
        """Offer these arrivals' messages again after a backoff by receive count (30 s, 120 s, 300 s); the whole
        message comes back, with any of its arrivals acked already (the pipelines' writes make that a no-op)."""
        delays: dict[str, int] = {}
        with self._lock:
            for arrival in arrivals:
                if arrival.receipt and self._unacked.pop(arrival.receipt, None) is not None:
                    delays[arrival.receipt] = self._backoff(arrival.receive_count)
        for arrival in arrivals:
            if arrival.receipt in delays:
                log.warning(
                    "released %s (receive %d) for %ss: %s",
                    arrival.url,
                    arrival.receive_count,
                    delays[arrival.receipt],
                    reason,
                )
        self._change_visibility(delays)

    def close(self) -> None:
        """Give messages not acked back at once (visibility 0), so the next source need not wait them out."""
        with self._lock:
            receipts, self._unacked = list(self._unacked), {}
        self._change_visibility({receipt: 0 for receipt in receipts})

    # ------------------------------------------------------------------ helpers

    def _backoff(self, receive_count: int) -> int:
        return self.release_backoff_s[min(max(receive_count, 1), len(self.release_backoff_s)) - 1]

    def _arrivals(self, message: dict[str, Any]) -> list[Arrival]:
        """The arrivals a message carries (registered as unacked under its receipt); none for a test event, an
        event other than ObjectCreated or an object outside the store (deleted), or a poison body (released)."""
        attributes = message.get("Attributes", {})
        receipt, message_id = message["ReceiptHandle"], message["MessageId"]
        count = int(attributes.get("ApproximateReceiveCount", 1))
        if self.mode == MESSAGES:
            found = [
                Arrival(
                    url=self.queue_url,
                    key="",
                    size=None,
                    event_time=_iso_from_millis(attributes.get("SentTimestamp")),
                    event_id=message_id,
                    body=message.get("Body", ""),
                    receipt=receipt,
                    receive_count=count,
                )
            ]
        else:
            try:
                records = s3_records(message.get("Body", ""))
                found = [] if records is None else [a for r in records if (a := self._object(r, receipt, count))]
            except PoisonMessage as error:
                log.error(
                    "poison message %s on %s (receive %d): %s; released, the queue's redrive policy sends it to "
                    "the dead-letter queue",
                    message_id,
                    self.queue_url,
                    count,
                    error,
                )
                self._change_visibility({receipt: self._backoff(count)})
                return []
            if records is None:
                log.info("S3 test event %s on %s: deleted", message_id, self.queue_url)
        if not found:
            self._delete([receipt])
            return []
        with self._lock:
            self._unacked[receipt] = set(found)
        return found

    def _object(self, record: dict[str, Any], receipt: str, count: int) -> Arrival | None:
        """The Arrival of one S3 record; None (with one log line) for one this source does not hand on."""
        bucket, obj = record["s3"]["bucket"]["name"], record["s3"]["object"]
        key = unquote_plus(obj["key"])  # S3 sends keys URL-encoded, spaces as '+'
        url = object_url(bucket, key)
        if not str(record["eventName"]).startswith("ObjectCreated:"):
            log.info("%s for %s: not an object created, nothing to do", record["eventName"], url)
            return None
        if self._bucket is not None and (bucket != self._bucket or not key.startswith(self._prefix)):
            log.warning(
                "%s is outside s3://%s/%s, the store this listener watches: ignored", url, self._bucket, self._prefix
            )
            return None
        relative = key[len(self._prefix) :]
        try:
            keys.safe_key(relative)
        except keys.InvalidKey as error:
            log.warning("%s: %s; ignored (no pipeline may read it)", url, error)
            return None
        size = obj.get("size")
        event_id = obj.get("sequencer") or f"{key}@{obj.get('eTag', '')}"  # a duplicate S3 send: the same id
        return Arrival(
            url=url,
            key=relative,
            size=int(size) if size is not None else None,
            event_time=record.get("eventTime") or _iso_from_millis(None),
            event_id=event_id,
            receipt=receipt,
            receive_count=count,
        )

    def _delete(self, receipts: Sequence[str]) -> None:
        for start in range(0, len(receipts), MAX_BATCH):
            entries = [{"Id": str(n), "ReceiptHandle": r} for n, r in enumerate(receipts[start : start + MAX_BATCH])]
            for failed in self._client.delete_message_batch(QueueUrl=self.queue_url, Entries=entries).get("Failed", []):
                # its receipt expired (the message is visible again): the next delivery is acked again, a no-op
                log.warning(
                    "could not delete a message from %s: %s", self.queue_url, failed.get("Message", failed.get("Code"))
                )

    def _change_visibility(self, delays: dict[str, int]) -> None:
        items = list(delays.items())
        for start in range(0, len(items), MAX_BATCH):
            entries = [
                {"Id": str(n), "ReceiptHandle": r, "VisibilityTimeout": s}
                for n, (r, s) in enumerate(items[start : start + MAX_BATCH])
            ]
            for failed in self._client.change_message_visibility_batch(QueueUrl=self.queue_url, Entries=entries).get(
                "Failed", []
            ):
                log.warning(
                    "could not release a message on %s: %s", self.queue_url, failed.get("Message", failed.get("Code"))
                )
