"""Cumulus workflow messages -> execution and granule records (seed 004's field table), with schema checks.

A message is validated against a Cumulus message schema (``cumulus_meta``, ``meta``, ``payload``); an invalid
one marks its granules failed when they can be identified and goes to the dead-letter archive with the
validation errors, as does an unparsable one (or one holding text UTF-8 cannot carry) and one whose granule id
belongs to another collection. Each granule of a valid message becomes Cumulus's API granule record and is
checked on its own against Cumulus's API granule schema: an invalid granule is marked failed and its message
goes to the archive, while the message's execution, PDR and valid granules are written (Cumulus writes each
granule on its own). Records are Cumulus's: a null the granule gives removes the value, an omitted one keeps
it; a running or queued granule stores no files; an execution's duration is its stop - start.

Messages are written in arrival order and, as in the seed, each message's execution first, then its PDR, then
its granules. A queued message writes no execution (nor PDR: neither is ever queued), so "the execution already
exists" (the queued rule) still means an earlier message recorded it; a batch is split into segments in which no
execution repeats, so bulk writing gives the same result as one message at a time.

Derived values the message does not carry: the CMR temporal values from each granule's CMR file (``cmr``), and
processing start/end from the execution's Prefect flow run when its name is a flow run id (``flow_runs``),
else the message's ``workflow_start_time``/``workflow_stop_time``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError
from jsonschema import Draft202012Validator

from tasks.core.errors import RefusedInput
from tasks.core.object_store import open_url
from tasks.records import cmr, dead_letter, flow_runs
from tasks.records import rules as records
from tasks.records.flow_runs import RunTimes, utc_iso
from tasks.records.rules import EXECUTION, GRANULE, PDR, RecordResult, Verdict

STATUSES = [records.QUEUED, records.RUNNING, records.COMPLETED, records.FAILED]
# epoch milliseconds up to 9999-12-31T23:59:59.999Z: a later time has no ISO date, and as a createdAt it would
# make every real event for the granule stale forever
MAX_EPOCH_MS = 253_402_300_799_999
EPOCH_MS: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_EPOCH_MS}

# Cumulus's API granule schema (@cumulus/api lib/schemas.js, ``granule``), restated: the record a message's
# granule becomes must match it, or the granule is marked failed and its message dead-lettered (seed 004)
_TEXT, _INTEGER, _NUMBER = {"type": "string"}, {"type": "integer"}, {"type": "number"}
_TEXT_FIELDS = (
    "granuleId",
    "pdrName",
    "collectionId",
    "execution",
    "cmrLink",
    "productVolume",
    "provider",
    "beginningDateTime",
    "endingDateTime",
    "processingStartDateTime",
    "processingEndDateTime",
    "lastUpdateDateTime",
    "productionDateTime",
)
API_GRANULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["granuleId", "collectionId", "status", "updatedAt"],
    "properties": {
        **{name: _TEXT for name in _TEXT_FIELDS},
        "status": {"type": "string", "enum": STATUSES},
        "published": {"type": "boolean"},
        **{name: _NUMBER for name in ("duration", "timeToPreprocess", "timeToArchive")},
        **{name: _INTEGER for name in ("timestamp", "createdAt", "updatedAt")},
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    **{
                        name: _TEXT
                        for name in ("bucket", "checksum", "checksumType", "fileName", "key", "source", "type")
                    },
                    **{name: _INTEGER for name in ("createdAt", "size", "updatedAt")},
                },
            },
        },
        "error": {"type": "object"},
        "queryFields": {"type": "object"},
    },
}
# and what DynamoDB's keys and the stale-write rules need besides: a createdAt with an ISO date
_granule_validator = Draft202012Validator({"allOf": [API_GRANULE_SCHEMA, {"properties": {"createdAt": EPOCH_MS}}]})

# Step Functions' own rule for an execution name (StartExecution ``name``): 1-80 characters, none of them white
# space, a bracket ``< > { } [ ]``, a wildcard ``? *``, a special character ``" # % \ ^ | ~ ` $ & , ; : /``, a
# control character (U+0000-001F, U+007F-009F), U+FFFE-FFFF, a surrogate or U+10FFFF. ``.``, ``+`` and letters
# beyond ASCII are allowed. The name only ever lands in the execution ARN (a DynamoDB key) and in flow run look-ups,
# never in an object key or a path; and ``/`` ``\`` ``:`` are refused anyway.
EXECUTION_NAME_PATTERN = (
    r"^[^\s<>{}\[\]?*\"#%\\^|~`$&,;:/\x00-\x1f\x7f-\x9f\ufffe\uffff\ud800-\udfff\U0010ffff]{1,80}\Z"
)

MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["cumulus_meta", "meta"],
    "properties": {
        "cumulus_meta": {
            "type": "object",
            "required": ["state_machine", "execution_name"],
            "properties": {
                "state_machine": {
                    "type": "string",
                    "pattern": r"^arn:aws[a-z-]*:states:[^:]*:[^:]*:stateMachine:[A-Za-z0-9_-]{1,80}\Z",
                },
                "execution_name": {"type": "string", "pattern": EXECUTION_NAME_PATTERN},
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
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "version": {"type": "string", "minLength": 1},
                    },
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
                "granules": {"type": "array"},  # each granule is checked on its own (``derive``)
                "pdr": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "PANSent": {"type": ["boolean", "null"]},
                        "PANmessage": {"type": ["string", "null"]},
                    },
                },
                # a PDR's executions by state: its stats count them
                **{state: {"type": ["array", "null"]} for state in ("running", "completed", "failed")},
            },
        },
        "error": {"type": ["object", "null"]},
        "exception": {"type": ["object", "string", "null"]},
    },
}
_validator = Draft202012Validator(MESSAGE_SCHEMA)


class MessageError(RefusedInput):
    """A message that cannot be written: unparsable, schema-invalid, or against a write constraint."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind

    def as_dict(self) -> dict[str, str]:
        """``{"type": kind, "message": text}``: the error as recorded on an outcome."""
        return {"type": self.kind, "message": str(self)}


def message_id(raw: Mapping[str, Any] | str | bytes) -> str:
    """A stable id for a message (its content hash): archiving the same message twice writes one object."""
    if isinstance(raw, bytes):
        data = raw
    else:  # a lone surrogate still hashes
        data = (raw if isinstance(raw, str) else json.dumps(raw, sort_keys=True, default=str)).encode(
            "utf-8", "surrogatepass"
        )
    return "msg-" + hashlib.sha256(data).hexdigest()[:24]


def decode(raw: bytes) -> str:
    """A message body's bytes as UTF-8, strictly: MessageError('InvalidUtf8') names the first bad byte's offset
    (a replaced character would change a granule id and write it under the changed id)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = raw[error.start : error.end].hex(" ")
        raise MessageError(
            "InvalidUtf8", f"message body is not valid UTF-8: byte offset {error.start} (0x{bad}: {error.reason})"
        ) from None


def parse(raw: Mapping[str, Any] | str | bytes) -> dict[str, Any]:
    """A message dict from a dict or a JSON body (text, or bytes that must be UTF-8); MessageError otherwise."""
    if isinstance(raw, Mapping):
        value: Any = dict(raw)
    else:
        if isinstance(raw, bytes):
            raw = decode(raw)
        try:
            value = json.loads(raw)
        except (TypeError, ValueError) as error:
            raise MessageError("UnparsableMessage", f"message body is not JSON: {error}") from None
        if not isinstance(value, dict):
            raise MessageError("UnparsableMessage", f"message body is JSON {type(value).__name__}, not an object")
    where = _lone_surrogate(value)
    if where is not None:  # from JSON's \ud800 escapes: no UTF-8 request (DynamoDB's, a log's) can carry it
        raise MessageError(
            "InvalidUnicode", f"{where}: text holds a lone surrogate (an unpaired \\ud800-\\udfff escape)"
        )
    return value


def _lone_surrogate(value: Any, path: str = "") -> str | None:
    """The path (printable) of the first text, a key or a string, in ``value`` that UTF-8 cannot encode, or None."""
    texts: list[tuple[str, Any]] = [(path or "(message)", value)]
    while texts:
        where, item = texts.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where
        elif isinstance(item, dict):
            for key, inner in item.items():
                inside = f"{where}/{str(key).encode('utf-8', 'backslashreplace').decode()}".removeprefix("(message)/")
                texts += [(inside, key), (inside, inner)]
        elif isinstance(item, list):
            texts.extend((f"{where}/{i}".removeprefix("(message)/"), inner) for i, inner in enumerate(item))
    return None


def _schema_problems(validator: Draft202012Validator, value: Any, prefix: str = "") -> list[str]:
    """Every violation of ``validator``'s schema by ``value``, as ``path: message``."""
    problems = []
    for error in sorted(validator.iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path]):
        where = "/".join([prefix, *map(str, error.absolute_path)] if prefix else map(str, error.absolute_path))
        problems.append(f"{where or '(message)'}: {error.message}")
    return problems


def validate(message: Mapping[str, Any]) -> None:
    """MessageError('SchemaValidationError') listing every violation of the message schema, or nothing (each
    granule is checked on its own, against Cumulus's API granule schema, by ``derive``)."""
    problems = _schema_problems(_validator, message)
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
    return None if ms is None else utc_iso(datetime.fromtimestamp(ms / 1000, UTC))


# what the Cumulus Message Adapter writes as ``exception`` when a step succeeded (Cumulus's message type:
# ``exception?: 'None' | object``): no error
NO_EXCEPTION = "None"


def _error(message: Mapping[str, Any]) -> dict[str, Any]:
    """The record's error: the message's ``error`` or ``exception`` object; ``{}`` for none (null, absent or the
    success value ``"None"``); any other value as Cumulus's ``parseException`` keeps it, ``{Error: "Unknown
    Error", Cause: value}``."""
    error = message.get("error") or message.get("exception")
    if error is None or error == NO_EXCEPTION:
        return {}
    return error if isinstance(error, dict) else {"Error": "Unknown Error", "Cause": str(error)}


def _provider(message: Mapping[str, Any]) -> Any:
    provider = message["meta"].get("provider")
    return provider.get("id") if isinstance(provider, dict) else provider


def _stamps(message: Mapping[str, Any], now_ms: int) -> dict[str, Any]:
    """collectionId, timestamp, updatedAt and duration: what every record of a message carries."""
    start = message["cumulus_meta"].get("workflow_start_time")
    return {
        "collectionId": collection_id(message),
        "timestamp": now_ms,
        "updatedAt": now_ms,
        "duration": None if start is None else max(0, now_ms - start) / 1000,
    }


@dataclass
class GranuleProblem:
    """A granule of a valid message that cannot be written: where, why, and its identity when it has one (then
    it is marked failed)."""

    where: str
    problems: list[str]
    identity: dict[str, Any] | None


# a payload kept on an execution record stays under a quarter of an item: the record keeps room for the rest
PAYLOAD_BYTES = records.RECORD_BYTES // 4
PAYLOAD_CUT = "…[payload of {size} bytes not kept: {why}]"


def _payload(payload: Any) -> Any:
    """A message payload as an execution record keeps it: ``REMOVE`` for null, a visible mark when DynamoDB
    could not keep it (too large, or a number it cannot hold: the execution is written all the same)."""
    if payload is None:
        return records.REMOVE
    size = records.item_bytes(payload)
    if size > PAYLOAD_BYTES:
        return PAYLOAD_CUT.format(size=size, why=f"over {PAYLOAD_BYTES} bytes")
    return payload if records.storable(payload) else PAYLOAD_CUT.format(size=size, why="a number DynamoDB cannot hold")


def _given(granule: Mapping[str, Any], attrs: Sequence[str]) -> dict[str, Any]:
    """The attributes the granule gives (``REMOVE`` for a null: an overwriting write removes it)."""
    return {a: records.REMOVE if granule[a] is None else granule[a] for a in attrs if a in granule}


def _seconds(value: Any) -> Any:
    """A duration in milliseconds as seconds (0 when not given); anything else as given, for the schema to name."""
    if value is None:
        return 0.0
    return value / 1000 if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _product_volume(files: Any) -> Any:
    """Cumulus's productVolume: the sum of the files' integer sizes, as text."""
    if not isinstance(files, list):
        return None
    sizes = [f.get("size") for f in files if isinstance(f, dict)]
    return str(sum(s for s in sizes if isinstance(s, int) and not isinstance(s, bool)))


def _granule_record(
    message: Mapping[str, Any], granule: Mapping[str, Any], common: Mapping[str, Any]
) -> dict[str, Any]:
    """The granule record of one message granule (Cumulus's API granule record, seed 004's field table)."""
    meta, payload = message["meta"], message.get("payload") or {}
    start = message["cumulus_meta"].get("workflow_start_time")
    status = meta.get("status") or granule.get("status")
    record = {
        **common,
        "granuleId": granule["granuleId"],
        "status": status,
        "execution": execution_arn(message),
        "createdAt": start if start is not None else granule.get("createdAt"),
        "error": _error(message),
        "pdrName": (payload.get("pdr") or {}).get("name"),
        "provider": _provider(message),
        "published": bool(granule.get("published") or False),
        "queryFields": (meta.get("granule") or {}).get("queryFields"),
        "timeToArchive": _seconds(granule.get("post_to_cmr_duration")),
        "timeToPreprocess": _seconds(granule.get("sync_granule_duration")),
        **_given(granule, ("cmrLink", "producerGranuleId", *cmr.TEMPORAL_ATTRS)),
    }
    if "files" in granule:  # omitted: the record keeps its files; null: none
        files = [] if granule["files"] is None else granule["files"]
        record["productVolume"] = _product_volume(files)
        if status not in records.LIGHT_ROLES:  # Cumulus stores no files for a running or queued granule
            record["files"] = files
    return record


def _api_view(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record as Cumulus's API shows it: without the attributes it removes or does not have."""
    return {k: v for k, v in record.items() if v is not None and v is not records.REMOVE}


def _granule(
    message: Mapping[str, Any], index: int, granule: Any, common: Mapping[str, Any], now_ms: int
) -> dict[str, Any] | GranuleProblem:
    """One message granule's record, or why it cannot be written."""
    where = f"payload/granules/{index}"
    if not isinstance(granule, dict) or granule.get("granuleId") in (None, ""):
        return GranuleProblem(where, [f"{where}: no granuleId"], None)
    record = _granule_record(message, granule, common)
    problems = _schema_problems(_granule_validator, _api_view(record), where)
    if record["status"] is None:
        problems.append(f"{where}: no status (neither meta.status nor granule.status)")
    if record["createdAt"] is None:
        problems.append(f"{where}: no createdAt (neither cumulus_meta.workflow_start_time nor granule.createdAt)")
    if problems:
        return GranuleProblem(where, problems, _identity(message, granule, now_ms))
    if "files" in record:
        record.update(cmr.granule_temporal(record["granuleId"], record["files"]))
    return record


def derive(
    message: Mapping[str, Any], now_ms: int, run: RunTimes | None = None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[GranuleProblem]]:
    """(execution record or None, granule records, granules that cannot be written) of a valid message, per the
    seed's field table and Cumulus's records; ``run``: the execution's Prefect flow run times, which win over the
    message's own."""
    cumulus_meta, meta = message["cumulus_meta"], message["meta"]
    payload = message.get("payload") or {}
    start, stop = cumulus_meta.get("workflow_start_time"), cumulus_meta.get("workflow_stop_time")
    common = {
        **_stamps(message, now_ms),
        "processingStartDateTime": (run and run.start) or _iso(start),
        "processingEndDateTime": (run and run.end) or _iso(stop),
    }
    granules, problems = [], []
    for index, granule in enumerate(payload.get("granules") or []):
        found = _granule(message, index, granule, common, now_ms)
        (problems if isinstance(found, GranuleProblem) else granules).append(found)
    execution = None
    status = meta.get("status")
    if status in EXECUTION.statuses.values():  # a queued message names an execution not started yet
        created = [g["createdAt"] for g in granules] + [
            p.identity["createdAt"] for p in problems if p.identity and p.identity["createdAt"] is not None
        ]
        execution = {
            **common,
            "arn": execution_arn(message),
            "name": cumulus_meta["execution_name"],
            "status": status,
            "createdAt": start if start is not None else min(created, default=None),
            # Cumulus's execution duration: stop - start, 0 while it has no stop time
            "duration": (stop - start) / 1000 if stop is not None and start is not None else 0,
            "type": meta.get("workflow_name"),
            "error": _error(message),
            "cumulusVersion": cumulus_meta.get("cumulus_version"),
            "parentArn": cumulus_meta.get("parentExecutionArn"),
            "asyncOperationId": cumulus_meta.get("asyncOperationId"),
            **_given(meta, ("workflow_tasks",)),
        }
        if "workflow_tasks" in execution:
            execution["tasks"] = execution.pop("workflow_tasks")
        if "payload" in message:
            execution["originalPayload" if status == records.RUNNING else "finalPayload"] = _payload(message["payload"])
    return execution, granules, problems


def derive_pdr(message: Mapping[str, Any], now_ms: int) -> dict[str, Any] | None:
    """The PDR record of a valid message (Cumulus's PDR record: ``pdrName``, stats of its executions by state,
    progress), or None: no ``payload.pdr``, a status a PDR never has (queued, none), or no createdAt."""
    payload, status = message.get("payload") or {}, message["meta"].get("status")
    pdr = payload.get("pdr")
    start = message["cumulus_meta"].get("workflow_start_time")
    if start is None:  # as for the execution: the earliest granule createdAt
        given = [g.get("createdAt") for g in payload.get("granules") or [] if isinstance(g, dict)]
        start = min((c for c in given if isinstance(c, int) and not isinstance(c, bool)), default=None)
    if not pdr or status not in PDR.statuses.values() or start is None:
        return None
    counts = {state: len(payload.get(state) or []) for state in ("running", "completed", "failed")}
    stats = {
        "processing": counts["running"],
        "completed": counts["completed"],
        "failed": counts["failed"],
        "total": sum(counts.values()),
    }
    progress = 100 * (stats["total"] - stats["processing"]) / stats["total"] if stats["total"] else 0
    return {
        **_stamps(message, now_ms),
        "pdrName": pdr["name"],
        "status": status,
        "provider": _provider(message),
        "progress": progress,
        "execution": execution_arn(message),
        "PANSent": bool(pdr.get("PANSent") or False),
        "PANmessage": pdr.get("PANmessage") or "N/A",
        "stats": stats,
        "createdAt": start,
    }


def _identity(message: Any, granule: Any, now_ms: int) -> dict[str, Any] | None:
    """A granule of an invalid message or an invalid granule, as ``mark_failed`` needs it (id and collection
    known, the id storable), or None."""
    try:
        collection = collection_id(message)
    except (KeyError, TypeError):
        return None
    if not isinstance(collection, str) or "None" in collection.split("___"):
        return None
    cumulus_meta = message.get("cumulus_meta")
    start = cumulus_meta.get("workflow_start_time") if isinstance(cumulus_meta, dict) else None
    if not (isinstance(start, int) and not isinstance(start, bool) and 0 <= start <= MAX_EPOCH_MS):
        start = None  # an out-of-range createdAt would make the granule's real events stale forever
    granule_id = granule.get("granuleId") if isinstance(granule, dict) else None
    if not isinstance(granule_id, str) or _lone_surrogate(granule_id) is not None:
        return None
    if not 0 < len(granule_id.encode()) <= records.KEY_BYTES:
        return None
    return {
        "granuleId": granule_id,
        "collectionId": collection,
        "createdAt": start,
        "timestamp": now_ms,
        "updatedAt": now_ms,
    }


def _identities(message: Any, now_ms: int) -> list[dict[str, Any]]:
    """The granules of an invalid message that can still be identified (id and collection known)."""
    payload = message.get("payload") if isinstance(message, dict) else None
    granules = payload.get("granules") if isinstance(payload, dict) else None
    found = [_identity(message, g, now_ms) for g in granules] if isinstance(granules, list) else []
    return [identity for identity in found if identity is not None]


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


def _segments(
    entries: list[tuple[int, dict | None, dict | None, list[dict]]],
) -> list[list[tuple[int, dict | None, dict | None, list[dict]]]]:
    """Split (index, execution, PDR, granules) into runs in which no execution arn repeats (a message without
    one, an invalid message, stands for an execution of its own)."""
    segments, current, seen = [], [], set()
    for entry in entries:
        arn = (entry[1] or {}).get("arn") or next((g.get("execution") for g in entry[3] if g.get("execution")), None)
        if arn is not None and arn in seen:
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
    parsed: list[Any] = [None] * len(messages)
    for index, raw in enumerate(messages):
        try:
            parsed[index] = parse(raw)
            validate(parsed[index])
        except MessageError as error:
            outcomes[index].error = error.as_dict()
    good = [index for index, outcome in enumerate(outcomes) if outcome.error is None]
    runs = flow_runs.run_times({parsed[index]["cumulus_meta"]["execution_name"] for index in good})
    # per message, in order: (index, execution, PDR, granule records: those to write, then the failed marks)
    entries: list[tuple[int, dict | None, dict | None, list[dict]]] = []
    for index, message in enumerate(parsed):
        if outcomes[index].error is not None:  # invalid: its identifiable granules are marked failed
            marks = [records.failed_mark(GRANULE, i, outcomes[index].error) for i in _identities(message, now_ms)]
            entries.append((index, None, None, marks))
            continue
        try:
            execution, granules, problems = derive(message, now_ms, runs.get(message["cumulus_meta"]["execution_name"]))
            pdr = derive_pdr(message, now_ms)
        except Exception as error:  # noqa: BLE001 - one message's odd value must not cost the batch its writes
            outcomes[index].error = MessageError("UnderivableMessage", f"{type(error).__name__}: {error}").as_dict()
            continue
        if pdr is not None and pdr.get("provider") is None:  # Cumulus's writePdr throws before any granule write
            outcomes[index].error = MessageError(
                "PdrWithoutProvider", f"PDR {pdr['pdrName']}: no meta.provider (a PDR record needs one)"
            ).as_dict()
            entries.append((index, execution, None, []))
            continue
        if problems:  # each granule is written on its own: the valid ones are, the invalid ones marked failed
            outcomes[index].error = MessageError(
                "SchemaValidationError", "; ".join(p for g in problems for p in g.problems)
            ).as_dict()
            granules += [
                records.failed_mark(GRANULE, g.identity, outcomes[index].error) for g in problems if g.identity
            ]
        entries.append((index, execution, pdr, granules))

    for segment in _segments(entries):  # the seed's order: executions, then PDRs, then granules
        for kind, owned in (
            (EXECUTION, [(index, execution) for index, execution, _, _ in segment if execution is not None]),
            (PDR, [(index, pdr) for index, _, pdr, _ in segment if pdr is not None]),
            (GRANULE, [(index, g) for index, _, _, granules in segment for g in granules]),
        ):
            for (index, _), result in zip(owned, _write_apart(kind, [record for _, record in owned])):
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
                kept = (
                    {}
                    if parsed[index] is not None
                    else {"raw": raw}
                    if isinstance(raw, bytes)
                    else {"body": raw if isinstance(raw, str) else json.dumps(raw, default=str)}
                )
                outcome.archived_key = dead_letter.archive(
                    outcome.id, outcome.error, message=parsed[index], **kept, store=store
                )
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
        raise ValueError(
            f"{source}: expected a JSON list of messages (or one message per line), not JSON {type(value).__name__}"
        )
    return [_element(*item) for item in _list_items(text)] if _ESCAPED_BYTE.search(text) else value


def batch_from_bytes(data: bytes, source: str = "batch") -> list[Any]:
    """The messages of a batch file's bytes; a message that is not valid UTF-8 stays its exact bytes, so it is
    archived as InvalidUtf8 (and can be replayed once fixed) while the other messages are written."""
    return batch_from_text(data.decode("utf-8", "surrogateescape"), source)


def read_batch(url: str) -> list[Any]:
    """The messages of the batch file at an object-store URL (file:// or s3://)."""
    store, key = open_url(url)
    return batch_from_bytes(store.get_bytes(key), url)


def ingest_messages(
    messages: Sequence[dict[str, Any] | str] | None = None, messages_url: str | None = None
) -> dict[str, Any]:
    """Write the records of a batch (text bodies or dicts, or the file at ``messages_url``); archive the rejected."""
    if (messages is None) == (messages_url is None):
        raise ValueError(
            "give the batch either as messages (text bodies) or as messages_url (an object-store URL), not both"
        )
    report = ingest(read_batch(messages_url) if messages_url is not None else messages)
    return {**report.counts(), "errors": report.errors()}


def replay_archive(day: str, message_ids: list[str] | None) -> dict[str, Any]:
    """Reprocess archived messages of one day; delete what was written, move what failed to failed/."""

    def process(payloads: list[Any], ids: list[str]) -> list[dict | None]:
        """Ingest the payloads without archiving; each one's error, or None (written or dropped as stale)."""
        report = ingest(payloads, ids=ids, archive=False)
        return [o.error for o in report.outcomes]

    return dead_letter.replay(day, process, message_ids).as_dict()
