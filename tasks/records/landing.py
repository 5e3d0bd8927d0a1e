"""Workflow messages arrive and are written (seed 004's SQS batches of 10), in AWS and locally.

    AWS:   the workflow-message queue ──(SqsSource, a message per arrival)──┐
    local: records/incoming/*.json|*.ndjson (one message, a JSON list, or  ├─> batches of 10 ─> records-ingest
           one message per line; the documented stand-in for the queue) ──┘      (records or dead-letter archive)
                                            ──> a file moved to records/processed/{date}/ ──> ack
                                                (a different file of the same name there: its name gets its hash)

An arrival is acked only once every message it carries is written: to the records, or to the dead-letter
archive with its error (records-ingest's own rules). A file that is no batch at all (JSON that is neither a
message nor a list) goes to the archive whole, as an unparsable body. Writing a message twice changes nothing
(the stale-write rules; the archive keys a message by its content), so a listener that died before the move
or the ack only makes the next one write the same again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from tasks.core import keys
from tasks.core.config import object_store
from tasks.core.object_store import ObjectNotFound, rename
from tasks.core.runtime import run_logger, today_iso
from tasks.landing.listener import Landed, Outcome, emit_landed
from tasks.landing.sources import Arrival
from tasks.records import dead_letter
from tasks.records import keys as records_keys
from tasks.records import messages as records_messages

PIPELINE = "records"
BATCH = 10  # the seed's SQS batch size
SUFFIXES = list(records_keys.MESSAGE_SUFFIXES)

# ingest(text bodies) -> (the batch's summary, the records-ingest flow run that wrote it, or None)
Ingest = Callable[[list[str]], tuple[dict[str, Any], str | None]]


def ingest_in_process(bodies: list[str]) -> tuple[dict[str, Any], str | None]:
    """records-ingest's task body, without a flow run (for callers outside Prefect)."""
    return records_messages.ingest_messages(bodies), None


def bodies_of(arrival: Arrival) -> list[str]:
    """The text bodies an arrival carries: an SQS message's body, or every message of a dropped file.

    InvalidKey for a file outside ``records/incoming/``; ObjectNotFound for one gone since (e.g. already moved).
    """
    if arrival.body is not None:
        return [arrival.body]
    records_keys.records_processed_key(today_iso(), arrival.key)  # InvalidKey unless it lies under records/incoming/
    data = object_store().get_bytes(arrival.key)
    try:  # the same strict decode as a batch at messages_url: a message that is not UTF-8 stays its bytes
        found = records_messages.batch_from_bytes(data, arrival.key)
    except ValueError as error:  # JSON, but no message and no list: the whole file is one unparsable body
        try:  # kept as it came: text, or the exact bytes of a file that is not UTF-8
            kept: dict[str, Any] = {"body": data.decode("utf-8")}
        except UnicodeDecodeError:
            kept = {"raw": data}
        dead_letter.archive(
            records_messages.message_id(data), {"type": "UnreadableBatch", "message": str(error)}, **kept
        )
        return []
    undecodable = [m for m in found if isinstance(m, bytes)]
    if undecodable:  # no text body for a flow run's parameters: archived here (InvalidUtf8), as records-ingest would
        records_messages.ingest(undecodable)
    return [m if isinstance(m, str) else json.dumps(m) for m in found if not isinstance(m, bytes)]


def processed_key(store, key: str) -> str:
    """Where a written file goes under ``records/processed/{date}/``: its own name, unless a different file of
    that name is there already (then the name carries its content hash: a file set aside never replaces another)."""
    target = records_keys.records_processed_key(today_iso(), key)
    if not store.exists(target):
        return target
    data = store.get_bytes(key)
    if store.get_bytes(target) == data:
        return target  # the same file again: replacing it loses nothing
    path = PurePosixPath(target)
    return str(path.with_name(f"{path.stem}.{hashlib.sha256(data).hexdigest()[:16]}{path.suffix}"))


def set_aside(arrival: Arrival) -> None:
    """A written file leaves ``records/incoming/`` for ``records/processed/{date}/`` (a message has nothing to move)."""
    if arrival.body is None:
        store = object_store()
        rename(store, arrival.key, processed_key(store, arrival.key))


def handle_messages(arrivals: list[Arrival], ingest: Ingest = ingest_in_process) -> Outcome:
    """The records listener's handler: every message of the arrivals, in order, through ``ingest`` in batches of
    10; an arrival is done once all its messages are written, offered again when any batch of them failed."""
    log = run_logger(__name__)
    outcome = Outcome()
    landed: list[Landed] = []
    carried: list[tuple[Arrival, list[str]]] = []
    for arrival in arrivals:
        try:
            carried.append((arrival, bodies_of(arrival)))
        except keys.InvalidKey as error:
            log.warning("ignored %s: %s", arrival.url, error)
            landed.append((arrival, "ignored", []))
            outcome.done.append(arrival)
        except ObjectNotFound:
            log.info("%s is gone (written and set aside already?): nothing to write", arrival.url)
            landed.append((arrival, "gone", []))
            outcome.done.append(arrival)
        except Exception as error:  # noqa: BLE001 - the store or DynamoDB down: offered again later
            outcome.retry.append((arrival, f"{type(error).__name__}: {error}"))
    queue = [(index, body) for index, (_, bodies) in enumerate(carried) for body in bodies]
    runs: dict[int, list[str]] = {index: [] for index in range(len(carried))}
    failed: dict[int, str] = {}
    for start in range(0, len(queue), BATCH):
        batch = queue[start : start + BATCH]
        owners = sorted({index for index, _ in batch})
        try:
            summary, flow_run_id = ingest([body for _, body in batch])
        except Exception as error:  # noqa: BLE001 - nothing acked: these arrivals come again
            failed.update({index: f"{type(error).__name__}: {error}" for index in owners})
            continue
        log.info("wrote %d message(s): %d ok, %d archived", summary["messages"], summary["ok"], summary["archived"])
        for index in owners:
            runs[index].append(flow_run_id)
    for index, (arrival, _) in enumerate(carried):
        if index in failed:
            outcome.retry.append((arrival, failed[index]))
            continue
        try:
            set_aside(arrival)
        except Exception as error:  # noqa: BLE001 - written but still in incoming/: writing it again changes nothing
            outcome.retry.append((arrival, f"{type(error).__name__}: {error}"))
            continue
        landed.append((arrival, "written", [r for r in runs[index] if r]))
        outcome.done.append(arrival)
    emit_landed(PIPELINE, landed)
    return outcome
