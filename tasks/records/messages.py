"""Cumulus workflow messages -> execution and granule records (seed 004's field table), with schema checks.

A message is validated against a Cumulus message schema (``cumulus_meta``, ``meta``, ``payload.granules``);
an invalid one marks its granules failed when they can be identified and goes to the dead-letter archive
with the validation errors, as does an unparsable one and one whose granule id belongs to another collection.

Messages are written in arrival order. Granules are written before their execution record, so "the
execution already exists" (the queued rule) means an earlier message recorded it; a batch is split into
segments in which no execution repeats, so bulk writing gives the same result as one message at a time.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import ClientError
from jsonschema import Draft202012Validator

from tasks.core.object_store import open_url
from tasks.core.runtime import run_logger
from tasks.records import dead_letter
from tasks.records import rules as records
from tasks.records.rules import EXECUTION, GRANULE, RecordResult, Verdict

STATUSES = [records.QUEUED, records.RUNNING, records.COMPLETED, records.FAILED]
# epoch milliseconds up to 9999-12-31T23:59:59.999Z: a later time has no ISO date, and as a createdAt it would
# make every real event for the granule stale forever
MAX_EPOCH_MS = 253_402_300_799_999
EPOCH_MS: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_EPOCH_MS}

GRANULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["granuleId"],
    "properties": {
        "granuleId": {"type": "string", "minLength": 1, "maxLength": 1024},
        "status": {"enum": STATUSES},
        "files": {
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "properties": {
                    "size": {"type": "number", "minimum": 0},
                    "bucket": {"type": "string"},
                    "key": {"type": "string"},
                    "fileName": {"type": "string"},
                },
            },
        },
        "published": {"type": ["boolean", "null"]},
        "createdAt": EPOCH_MS,
        "sync_granule_duration": {"type": "number", "minimum": 0},
        "post_to_cmr_duration": {"type": "number", "minimum": 0},
    },
}

MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["cumulus_meta", "meta"],
    "properties": {
        "cumulus_meta": {
            "type": "object",
            "required": ["state_machine", "execution_name"],
            "properties": {
                "state_machine": {"type": "string", "pattern": r"^arn:aws[a-z-]*:states:[^:]*:[^:]*:stateMachine:[A-Za-z0-9_-]{1,80}$"},
                "execution_name": {"type": "string", "pattern": r"^[A-Za-z0-9_-]{1,80}$"},
                "workflow_start_time": EPOCH_MS,
                "workflow_stop_time": {**EPOCH_MS, "type": ["integer", "null"]},
            },
        },
        "meta": {
            "type": "object",
            "required": ["collection"],
            "properties": {
                "collection": {
                    "type": "object",
                    "required": ["name", "version"],
                    "properties": {"name": {"type": "string", "minLength": 1}, "version": {"type": "string", "minLength": 1}},
                },
                "status": {"enum": STATUSES},
                "provider": {"type": ["object", "string", "null"]},
                "workflow_name": {"type": "string"},
                "granule": {"type": "object"},
            },
        },
        "payload": {
            "type": ["object", "null"],
            "properties": {
                "granules": {"type": "array", "items": GRANULE_SCHEMA},
                "pdr": {"type": "object", "properties": {"name": {"type": "string"}}},
            },
        },
        "error": {"type": ["object", "null"]},
        "exception": {"type": ["object", "string", "null"]},
    },
}
_validator = Draft202012Validator(MESSAGE_SCHEMA)


class MessageError(ValueError):
    """A message that cannot be written: unparsable, schema-invalid, or against a write constraint."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind

    def as_dict(self) -> dict[str, str]:
        """``{"type": kind, "message": text}``: the error as recorded on an outcome."""
        return {"type": self.kind, "message": str(self)}


def message_id(raw: Mapping[str, Any] | str | bytes) -> str:
    """A stable id for a message (its content hash): archiving the same message twice writes one object."""
    data = raw if isinstance(raw, bytes) else (raw if isinstance(raw, str) else json.dumps(raw, sort_keys=True, default=str)).encode()
    return "msg-" + hashlib.sha256(data).hexdigest()[:24]


def decode(raw: bytes) -> str:
    """A message body's bytes as UTF-8, strictly: MessageError('InvalidUtf8') names the first bad byte's offset
    (a replaced character would change a granule id and write it under the changed id)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = raw[error.start:error.end].hex(" ")
        raise MessageError(
            "InvalidUtf8", f"message body is not valid UTF-8: byte offset {error.start} (0x{bad}: {error.reason})"
        ) from None


def parse(raw: Mapping[str, Any] | str | bytes) -> dict[str, Any]:
    """A message dict from a dict or a JSON body (text, or bytes that must be UTF-8); MessageError otherwise."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, bytes):
        raw = decode(raw)
    try:
        value = json.loads(raw)
    except (TypeError, ValueError) as error:
        raise MessageError("UnparsableMessage", f"message body is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise MessageError("UnparsableMessage", f"message body is JSON {type(value).__name__}, not an object")
    return value


def validate(message: Mapping[str, Any]) -> None:
    """MessageError('SchemaValidationError') listing every violation, or nothing."""
    problems = []
    for error in sorted(_validator.iter_errors(message), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in error.absolute_path) or "(message)"
        problems.append(f"{where}: {error.message}")
    status = (message.get("meta") or {}).get("status") if isinstance(message.get("meta"), dict) else None
    start = message["cumulus_meta"].get("workflow_start_time") if isinstance(message.get("cumulus_meta"), dict) else 0
    granules = (message.get("payload") or {}).get("granules") if isinstance(message.get("payload"), dict) else None
    for index, granule in enumerate(granules or []):
        if isinstance(granule, dict) and status is None and granule.get("status") is None:
            problems.append(f"payload/granules/{index}: no status (neither meta.status nor granule.status)")
        if isinstance(granule, dict) and start is None and granule.get("createdAt") is None:
            problems.append(f"payload/granules/{index}: no createdAt (neither cumulus_meta.workflow_start_time nor granule.createdAt)")
    if problems:
        raise MessageError("SchemaValidationError", "; ".join(problems))


def collection_id(message: Mapping[str, Any]) -> str:
    """``{name}___{version}`` of the message's ``meta.collection``."""
    collection = message["meta"]["collection"]
    return f"{collection['name']}___{collection['version']}"


def execution_arn(message: Mapping[str, Any]) -> str:
    """Derived from cumulus_meta.state_machine and cumulus_meta.execution_name."""
    meta = message["cumulus_meta"]
    return meta["state_machine"].replace(":stateMachine:", ":execution:") + ":" + meta["execution_name"]


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


def _error(message: Mapping[str, Any]) -> dict[str, Any]:
    error = message.get("error") or message.get("exception") or {}
    return error if isinstance(error, dict) else {"Error": "Exception", "Cause": str(error)}


def derive(message: Mapping[str, Any], now_ms: int) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(execution record or None, granule records) of a valid message, per the seed's field table."""
    cumulus_meta, meta = message["cumulus_meta"], message["meta"]
    payload = message.get("payload") or {}
    start = cumulus_meta.get("workflow_start_time")
    arn, collection = execution_arn(message), collection_id(message)
    provider = meta.get("provider")
    provider = provider.get("id") if isinstance(provider, dict) else provider
    common = {
        "collectionId": collection,
        "timestamp": now_ms,
        "updatedAt": now_ms,
        "duration": None if start is None else max(0, now_ms - start) / 1000,
        "processingStartDateTime": _iso(start),
        "processingEndDateTime": _iso(cumulus_meta.get("workflow_stop_time")),
    }
    granules = []
    for granule in payload.get("granules") or []:
        status = meta.get("status") or granule["status"]
        files = granule.get("files") or []
        granules.append(
            {
                **common,
                "granuleId": granule["granuleId"],
                "status": status,
                "execution": arn,
                "createdAt": start if start is not None else granule.get("createdAt"),
                "error": _error(message) if status in records.TERMINAL_ROLES else None,
                "files": files,
                "productVolume": sum(f.get("size") or 0 for f in files),
                "pdrName": (payload.get("pdr") or {}).get("name"),
                "provider": provider,
                "published": bool(granule.get("published") or False),
                "queryFields": (meta.get("granule") or {}).get("queryFields"),
                "timeToArchive": (granule.get("post_to_cmr_duration") or 0) / 1000,
                "timeToPreprocess": (granule.get("sync_granule_duration") or 0) / 1000,
            }
        )
    execution = None
    if meta.get("status") in EXECUTION.statuses.values():  # a queued message names an execution not started yet
        execution = {
            **common,
            "arn": arn,
            "name": cumulus_meta["execution_name"],
            "status": meta["status"],
            "createdAt": start if start is not None else min((g["createdAt"] for g in granules), default=None),
            "type": meta.get("workflow_name"),
            "error": _error(message) if meta["status"] in records.TERMINAL_ROLES else None,
        }
    return execution, granules


def _identities(message: Any, now_ms: int) -> list[dict[str, Any]]:
    """The granules of an invalid message that can still be identified (id and collection known)."""
    try:
        collection = collection_id(message)
        granules = message["payload"]["granules"]
    except (KeyError, TypeError):
        return []
    if not isinstance(collection, str) or not isinstance(granules, list) or "None" in collection.split("___"):
        return []
    start = (message.get("cumulus_meta") or {}).get("workflow_start_time") if isinstance(message.get("cumulus_meta"), dict) else None
    if not (isinstance(start, int) and not isinstance(start, bool) and 0 <= start <= MAX_EPOCH_MS):
        start = None  # an out-of-range createdAt would make the granule's real events stale forever
    found = []
    for granule in granules:
        granule_id = granule.get("granuleId") if isinstance(granule, dict) else None
        if isinstance(granule_id, str) and 0 < len(granule_id.encode()) <= records.KEY_BYTES:
            found.append(
                {
                    "granuleId": granule_id,
                    "collectionId": collection,
                    "createdAt": start,
                    "timestamp": now_ms,
                    "updatedAt": now_ms,
                }
            )
    return found


@dataclass
class MessageOutcome:
    id: str
    error: dict[str, str] | None = None  # None: every write applied or was dropped as stale
    results: list[RecordResult] = field(default_factory=list)
    archived_key: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the message had no error (every write applied or was dropped as stale)."""
        return self.error is None


@dataclass
class IngestReport:
    outcomes: list[MessageOutcome]

    def counts(self) -> dict[str, Any]:
        """Counts of messages (total, ok, archived, failed) and of record verdicts by record kind."""
        by_kind: dict[str, dict[str, int]] = {}
        for outcome in self.outcomes:
            for result in outcome.results:
                kind = by_kind.setdefault(result.kind, {v.value: 0 for v in Verdict})
                kind[result.verdict.value] += 1
        return {
            "messages": len(self.outcomes),
            "ok": sum(o.ok for o in self.outcomes),
            "archived": sum(o.archived_key is not None for o in self.outcomes),
            "failed": sum(not o.ok for o in self.outcomes),
            "records": by_kind,
        }

    def errors(self) -> dict[str, dict[str, str]]:
        """The error of each message that failed, by message id."""
        return {o.id: o.error for o in self.outcomes if o.error}


# the archive's error type for a record the rules rejected, by the rules' problem name
PROBLEM_TYPES = {"ScopeConflict": "GranuleCollectionConflict", "Unwritable": "UnwritableRecord"}


def _refused(error: ClientError) -> bool:
    """Whether DynamoDB refused the request's content (not an outage): a ValidationException, or a transaction
    cancelled because an item is invalid."""
    code = error.response.get("Error", {}).get("Code")
    reasons = error.response.get("CancellationReasons") or []
    return code == "ValidationException" or (
        code == "TransactionCanceledException" and any(r.get("Code") == "ValidationError" for r in reasons)
    )


def _refusal(error: ClientError) -> str:
    """DynamoDB's own words for a refused request (the item's reason, for a cancelled transaction)."""
    for reason in error.response.get("CancellationReasons") or []:
        if reason.get("Code") == "ValidationError":
            return reason.get("Message") or "ValidationError"
    return error.response.get("Error", {}).get("Message", str(error))


def _write_apart(kind: records.RecordKind, batch: list[dict[str, Any]]) -> list[RecordResult]:
    """``write_many``; when DynamoDB refuses a request as invalid, the records one by one, so only the record
    it refuses is rejected (the rules make writing again what already landed a no-op or a stale drop)."""
    try:
        return records.write_many(kind, batch)
    except ClientError as error:
        if not _refused(error):
            raise  # an outage, not this batch's content: the batch fails and is delivered again
        if len(batch) == 1:
            key, status = kind.key(batch[0]), batch[0].get(kind.status_attr)
            reason = f"DynamoDB refused the {kind.name} write: {_refusal(error)}"
            return [RecordResult(kind.name, key, status, Verdict.REJECTED, reason, problem="Unwritable")]
    return [result for record in batch for result in _write_apart(kind, [record])]


def _segments(entries: list[tuple[int, dict | None, list[dict]]]) -> list[list[tuple[int, dict | None, list[dict]]]]:
    """Split (index, execution, granules) into runs in which no execution arn repeats."""
    segments, current, seen = [], [], set()
    for entry in entries:
        arn = entry[2][0]["execution"] if entry[2] else (entry[1] or {}).get("arn")
        if arn in seen:
            segments.append(current)
            current, seen = [], set()
        current.append(entry)
        seen.add(arn)
    if current:
        segments.append(current)
    return segments


def ingest(
    messages: Sequence[Mapping[str, Any] | str | bytes],
    *,
    ids: Sequence[str] | None = None,
    now_ms: int | None = None,
    archive: bool = True,
    store=None,
) -> IngestReport:
    """Write the records of ``messages`` (in order) under the seed 004 rules; archive what is rejected."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    outcomes = [MessageOutcome(ids[i] if ids else message_id(raw)) for i, raw in enumerate(messages)]
    valid: list[tuple[int, dict | None, list[dict]]] = []
    parsed: list[Any] = [None] * len(messages)
    for index, raw in enumerate(messages):
        try:
            parsed[index] = parse(raw)
            validate(parsed[index])
        except MessageError as error:
            outcomes[index].error = error.as_dict()
            for identity in _identities(parsed[index], now_ms):
                try:
                    outcomes[index].results.append(records.mark_failed(GRANULE, identity, error.as_dict()))
                except ClientError as refused:  # the message is archived whatever DynamoDB says about the mark
                    if not _refused(refused):
                        raise
                    run_logger(__name__).warning("granule %s not marked failed: %s", identity["granuleId"], refused)
            continue
        try:
            execution, granules = derive(parsed[index], now_ms)
        except Exception as error:  # noqa: BLE001 - one message's odd value must not cost the batch its writes
            outcomes[index].error = MessageError("UnderivableMessage", f"{type(error).__name__}: {error}").as_dict()
            continue
        valid.append((index, execution, granules))

    for segment in _segments(valid):
        granule_owner = [index for index, _, granules in segment for _ in granules]
        results = _write_apart(GRANULE, [g for _, _, granules in segment for g in granules])
        for index, result in zip(granule_owner, results):
            outcomes[index].results.append(result)
        executions = [(index, execution) for index, execution, _ in segment if execution is not None]
        for (index, _), result in zip(executions, _write_apart(EXECUTION, [e for _, e in executions])):
            outcomes[index].results.append(result)

    for outcome in outcomes:
        rejected = [r for r in outcome.results if r.verdict is Verdict.REJECTED]
        if rejected and outcome.error is None:
            kind = PROBLEM_TYPES.get(rejected[0].problem, "RecordRejected")
            outcome.error = MessageError(kind, "; ".join(r.reason for r in rejected)).as_dict()
    if archive:
        for index, outcome in enumerate(outcomes):
            if outcome.error is not None:
                raw = messages[index]
                # what did not parse is kept as it came: text as ``body``, bytes (not UTF-8) byte for byte as ``raw``
                kept = {} if parsed[index] is not None else {"raw": raw} if isinstance(raw, bytes) else {
                    "body": raw if isinstance(raw, str) else json.dumps(raw, default=str)}
                outcome.archived_key = dead_letter.archive(outcome.id, outcome.error, message=parsed[index], **kept, store=store)
    return IngestReport(outcomes)


# what a byte that is not UTF-8 becomes under errors="surrogateescape" (and becomes again on encoding)
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _exact(text: str) -> str | bytes:
    """A message's text, or its original bytes when the file had bytes there that are not UTF-8."""
    return text.encode("utf-8", "surrogateescape") if _ESCAPED_BYTE.search(text) else text


def _list_items(text: str) -> list[tuple[Any, str]]:
    """Each element of the JSON list ``text`` (known to parse) with its source text."""
    decoder = json.JSONDecoder()
    index = _JSON_SPACE.match(text, text.index("[") + 1).end()
    items = []
    while text[index] != "]":
        value, end = decoder.raw_decode(text, index)
        items.append((value, text[index:end]))
        index = _JSON_SPACE.match(text, end).end()
        if text[index] == ",":
            index = _JSON_SPACE.match(text, index + 1).end()
    return items


def _element(value: Any, source_text: str) -> Any:
    """One element of a batch list; as its original bytes when they are not UTF-8 (a text body: the body's bytes)."""
    if not _ESCAPED_BYTE.search(source_text):
        return value
    try:
        return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else _exact(source_text)
    except UnicodeEncodeError:  # a body that also holds an escaped lone surrogate: keep the element as written
        return _exact(source_text)


def batch_from_text(text: str, source: str = "batch") -> list[Any]:
    """The messages of a batch file: a JSON list (of messages or of text bodies), one message, or one body per
    line (a line that is not JSON stays a raw body, to be archived as unparsable). Text decoded with
    errors="surrogateescape" (``batch_from_bytes``) gives each message with bytes that are not UTF-8 as its bytes."""
    try:
        value = json.loads(text)
    except ValueError:
        return [_exact(line) for line in text.splitlines() if line.strip()]
    if isinstance(value, dict):
        return [_exact(text.strip())]
    if not isinstance(value, list):
        raise ValueError(f"{source}: expected a JSON list of messages (or one message per line), not JSON {type(value).__name__}")
    return [_element(*item) for item in _list_items(text)] if _ESCAPED_BYTE.search(text) else value


def batch_from_bytes(data: bytes, source: str = "batch") -> list[Any]:
    """The messages of a batch file's bytes; a message that is not valid UTF-8 stays its exact bytes, so it is
    archived as InvalidUtf8 (and can be replayed once fixed) while the other messages are written."""
    return batch_from_text(data.decode("utf-8", "surrogateescape"), source)


def read_batch(url: str) -> list[Any]:
    """The messages of the batch file at an object-store URL (file:// or s3://)."""
    store, key = open_url(url)
    return batch_from_bytes(store.get_bytes(key), url)


def ingest_messages(messages: Sequence[dict[str, Any] | str] | None = None, messages_url: str | None = None) -> dict[str, Any]:
    """Write the records of a batch (text bodies or dicts, or the file at ``messages_url``); archive rejected messages."""
    if (messages is None) == (messages_url is None):
        raise ValueError("give the batch either as messages (text bodies) or as messages_url (an object-store URL), not both")
    report = ingest(read_batch(messages_url) if messages_url is not None else messages)
    return {**report.counts(), "errors": report.errors()}


def replay_archive(day: str, message_ids: list[str] | None) -> dict[str, Any]:
    """Reprocess archived messages of one day; delete what was written, move what failed to failed/."""

    def process(payloads: list[Any], ids: list[str]) -> list[dict | None]:
        """Ingest the payloads without archiving; each one's error, or None (written or dropped as stale)."""
        report = ingest(payloads, ids=ids, archive=False)
        return [o.error for o in report.outcomes]

    return dead_letter.replay(day, process, message_ids).as_dict()
