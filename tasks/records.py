"""Status writes from asynchronous events, with the seed 004 write constraints, for any record kind.

Every constraint lives here, each one a DynamoDB ConditionExpression evaluated atomically with its write, so
the rules hold under concurrency (nothing is read first and decided in Python):

- ``queued``/``running`` writes touch only the status and the kind's timestamp attributes of an existing
  record (a new record is inserted whole: other attributes are written with ``if_not_exists``), and are
  dropped as stale when the incoming createdAt is older than the record's, when the record already holds a
  terminal state of the same createdAt (same attempt), when (running) the linked execution is
  completed/failed, or when (queued) the linked execution exists at all;
- ``completed``/``failed`` writes overwrite every given attribute, only when createdAt is newer or equal;
- a record id is unique across scopes (collections): a write for the same id under another scope is
  rejected, never applied;
- a record that can be identified but not validated is marked failed without touching a terminal record.

A record *kind* says where and how: table, key attributes, scope (collection) attribute, status attribute and
its four values, createdAt attribute, the timestamps a light write may touch, and the execution link.
Dropped stale writes are results (``Verdict.STALE``), counted and logged, never exceptions.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from boto3.dynamodb.types import TypeDeserializer

from tasks import config, state_store

QUEUED, RUNNING, COMPLETED, FAILED = "queued", "running", "completed", "failed"
LIGHT_ROLES = (QUEUED, RUNNING)
TERMINAL_ROLES = (COMPLETED, FAILED)

_deserializer = TypeDeserializer()


def run_logger(name: str = "records") -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a flow/task run (so drops show in the UI), else a standard logger."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # MissingContextError outside a run
        return logging.getLogger(name)


@dataclass(frozen=True)
class RecordKind:
    """How one kind of status record is stored (table is a logical name from ``tasks.tables``)."""

    name: str
    table: str
    key_attrs: tuple[str, ...]
    status_attr: str = "status"
    created_attr: str = "createdAt"
    scope_attr: str | None = None  # the "collection": an id is unique across scopes
    light_attrs: tuple[str, ...] = ("timestamp", "updatedAt")  # what queued/running may touch besides status/createdAt
    statuses: Mapping[str, str] = field(
        default_factory=lambda: {QUEUED: QUEUED, RUNNING: RUNNING, COMPLETED: COMPLETED, FAILED: FAILED}
    )
    execution_attr: str | None = None  # attribute holding the linked execution's key value
    execution_kind: "RecordKind | None" = None  # the kind the execution records are
    terminal_removes: tuple[str, ...] = ()  # removed by a terminal write that does not give them (a stale error)

    def role(self, status: str) -> str:
        """The seed role (queued/running/completed/failed) of one of this kind's status values."""
        for role, value in self.statuses.items():
            if value == status:
                return role
        raise ValueError(f"{self.name}: unknown status {status!r}; expected one of {sorted(self.statuses.values())}")

    def key(self, record: Mapping[str, Any]) -> dict[str, Any]:
        missing = [k for k in self.key_attrs if record.get(k) in (None, "")]
        if missing:
            raise ValueError(f"{self.name}: record has no {', '.join(missing)}")
        return {k: record[k] for k in self.key_attrs}

    def table_name(self) -> str:
        return config.table_name(self.table)


EXECUTION = RecordKind("execution", "executions", ("arn",), statuses={RUNNING: "running", COMPLETED: "completed", FAILED: "failed"})
GRANULE = RecordKind(
    "granule", "granules", ("granuleId",), scope_attr="collectionId", execution_attr="execution", execution_kind=EXECUTION
)
# our pipelines' records, e.g. a phspectra chunk item (seed 000): queued=PENDING, running=IN_PROGRESS, ...
PHSPECTRA_CHUNK = RecordKind(
    "phspectra-chunk",
    "phspectra_runs",
    ("PK", "SK"),
    created_attr="created_at",
    light_attrs=("started_at", "prefect_flow_run_id", "prefect_task_run_id"),
    terminal_removes=("error",),
    statuses={QUEUED: "PENDING", RUNNING: "IN_PROGRESS", COMPLETED: "COMPLETED", FAILED: "FAILED"},
)


class Verdict(str, Enum):
    WRITTEN = "written"
    STALE = "stale"  # out of order: dropped by the rules (counted and logged, not an error)
    REJECTED = "rejected"  # breaks a constraint (id under another scope): goes to the dead-letter archive


@dataclass(frozen=True)
class RecordResult:
    kind: str
    key: dict[str, Any]
    status: str
    verdict: Verdict
    reason: str = ""
    current: dict[str, Any] | None = None  # the stored record when the write did not apply


def summarize(results: Sequence[RecordResult]) -> dict[str, int]:
    """``{"written": n, "stale": n, "rejected": n}``."""
    counts = Counter(r.verdict.value for r in results)
    return {v.value: counts.get(v.value, 0) for v in Verdict}


# --------------------------------------------------------------------------- conditions


class _Expr:
    """Placeholders for one transaction item's expressions."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def n(self, attr: str) -> str:
        for placeholder, existing in self.names.items():
            if existing == attr:
                return placeholder
        placeholder = f"#n{len(self.names)}"
        self.names[placeholder] = attr
        return placeholder

    def v(self, value: Any) -> str:
        placeholder = f":v{len(self.values)}"
        self.values[placeholder] = state_store.to_dynamo(value)
        return placeholder

    def one_of(self, attr: str, options: Sequence[str]) -> str:
        return f"{self.n(attr)} IN ({', '.join(self.v(o) for o in options)})"


def _record_condition(kind: RecordKind, record: Mapping[str, Any], role: str, e: _Expr) -> str:
    """The ConditionExpression on the record's own item for a write of ``role``."""
    absent = f"attribute_not_exists({e.n(kind.key_attrs[0])})"
    def terminal() -> str:
        return e.one_of(kind.status_attr, [kind.statuses[r] for r in TERMINAL_ROLES if r in kind.statuses])

    parts = []
    if kind.scope_attr:
        parts.append(f"{e.n(kind.scope_attr)} = {e.v(record[kind.scope_attr])}")
    created = record.get(kind.created_attr)
    ca = e.n(kind.created_attr) if created is not None else ""
    if created is None:  # identifiable but unvalidated: mark failed, never over a terminal record
        parts.append(f"NOT ({terminal()})")
    elif role in TERMINAL_ROLES:  # newer or equal createdAt
        parts.append(f"(attribute_not_exists({ca}) OR {ca} <= {e.v(created)})")
    else:  # light: newer, or same attempt and not terminal yet
        t = e.v(created)
        parts.append(f"(attribute_not_exists({ca}) OR {ca} < {t} OR ({ca} = {t} AND NOT ({terminal()})))")
    return f"{absent} OR {parts[0]}" if len(parts) == 1 else f"{absent} OR ({' AND '.join(parts)})"


def _update_expression(kind: RecordKind, record: Mapping[str, Any], role: str, e: _Expr) -> str:
    """Terminal: SET every given attribute. Light: SET status/createdAt/light attrs; others only if absent."""
    touch = {kind.status_attr, kind.created_attr, *kind.light_attrs}
    sets = []
    for attr, value in record.items():
        if attr in kind.key_attrs or value is None:
            continue
        if role in TERMINAL_ROLES or attr in touch:
            sets.append(f"{e.n(attr)} = {e.v(value)}")
        else:
            name = e.n(attr)
            sets.append(f"{name} = if_not_exists({name}, {e.v(value)})")
    expression = "SET " + ", ".join(sets)
    removes = [e.n(a) for a in kind.terminal_removes if role in TERMINAL_ROLES and record.get(a) is None]
    return expression + (" REMOVE " + ", ".join(removes) if removes else "")


def _execution_check(kind: RecordKind, record: Mapping[str, Any], role: str, table: str) -> dict[str, Any] | None:
    """The ConditionCheck on the linked execution: running needs it not finished, queued needs it absent."""
    ex = kind.execution_kind
    if ex is None or not kind.execution_attr or role not in LIGHT_ROLES or not record.get(kind.execution_attr):
        return None
    e = _Expr()
    absent = f"attribute_not_exists({e.n(ex.key_attrs[0])})"
    if role == RUNNING:
        done = e.one_of(ex.status_attr, [ex.statuses[COMPLETED], ex.statuses[FAILED]])
        expression = f"{absent} OR NOT ({done})"
    else:
        expression = absent
    check = {
        "TableName": table,
        "Key": {ex.key_attrs[0]: record[kind.execution_attr]},
        "ConditionExpression": expression,
        "ExpressionAttributeNames": e.names,
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    if e.values:
        check["ExpressionAttributeValues"] = e.values
    return check


@dataclass
class _Op:
    """One guarded write: the record's Update and, for linked light writes, a ConditionCheck (all or nothing)."""

    kind: RecordKind
    record: dict[str, Any]
    role: str
    update: dict[str, Any]
    check: dict[str, Any] | None

    def items(self) -> list[dict[str, Any]]:
        return [{"Update": self.update}] + ([{"ConditionCheck": self.check}] if self.check else [])


def plan(kind: RecordKind, record: Mapping[str, Any], table: str, execution_table: str | None = None) -> _Op:
    """The guarded write for ``record`` (its status in the kind's vocabulary) as transaction items."""
    record = {k: v for k, v in record.items() if v is not None}
    role = kind.role(record.get(kind.status_attr))
    key = kind.key(record)
    if kind.scope_attr and record.get(kind.scope_attr) in (None, ""):
        raise ValueError(f"{kind.name} {key}: no {kind.scope_attr}")
    e = _Expr()
    update_expression = _update_expression(kind, record, role, e)
    condition = _record_condition(kind, record, role, e)
    update = {
        "TableName": table,
        "Key": key,
        "UpdateExpression": update_expression,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": e.names,
        "ExpressionAttributeValues": e.values,
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    return _Op(kind, record, role, update, _execution_check(kind, record, role, execution_table or ""))


def _explain(op: _Op, reasons: Sequence[Mapping[str, Any]]) -> tuple[Verdict, str, dict | None]:
    """Why a write did not apply, from the items DynamoDB returned with the cancellation."""
    kind, record = op.kind, op.record
    own = reasons[0] if reasons else {}
    current = _plain(own.get("Item"))
    if own.get("Code") == "ConditionalCheckFailed" and current is not None:
        if kind.scope_attr and current.get(kind.scope_attr) != record[kind.scope_attr]:
            return (
                Verdict.REJECTED,
                f"{'/'.join(map(str, kind.key(record).values()))} already exists under "
                f"{kind.scope_attr} {current.get(kind.scope_attr)!r}, not {record[kind.scope_attr]!r}",
                current,
            )
        theirs, ours = current.get(kind.created_attr), record.get(kind.created_attr)
        if ours is None:
            return Verdict.STALE, f"record is already {current.get(kind.status_attr)}", current
        if theirs is not None and theirs > ours:
            return Verdict.STALE, f"older {kind.created_attr} ({ours} < {theirs})", current
        return Verdict.STALE, f"{kind.status_attr} already {current.get(kind.status_attr)} for this {kind.created_attr}", current
    if len(reasons) > 1 and reasons[1].get("Code") == "ConditionalCheckFailed":
        execution = _plain(reasons[1].get("Item")) or {}
        ex_status = execution.get(op.kind.execution_kind.status_attr)
        why = "already exists" if op.role == QUEUED else f"is already {ex_status}"
        return Verdict.STALE, f"execution {record[kind.execution_attr]} {why} ({op.role} write dropped)", current
    return Verdict.STALE, "condition failed", current


def _plain(raw: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not raw:
        return None
    return state_store.to_plain({k: _deserializer.deserialize(v) for k, v in raw.items()})


# --------------------------------------------------------------------------- the writer


def write_many(kind: RecordKind, records: Sequence[Mapping[str, Any]], table: str | None = None) -> list[RecordResult]:
    """Write records of one kind under the rules, in transactions; one result per record, in order.

    Records for the same item are applied in list order (as if one by one)."""
    table = table or kind.table_name()
    execution_table = kind.execution_kind.table_name() if kind.execution_kind else None
    ops = [plan(kind, record, table, execution_table) for record in records]
    outcomes = state_store.transact_groups([op.items() for op in ops])
    results = []
    for op, reasons in zip(ops, outcomes):
        key, status = op.update["Key"], op.record[kind.status_attr]
        if reasons is None:
            results.append(RecordResult(kind.name, key, status, Verdict.WRITTEN))
            continue
        verdict, why, current = _explain(op, reasons)
        run_logger().info("%s %s %s write %s: %s", kind.name, key, status, verdict.value, why)
        results.append(RecordResult(kind.name, key, status, verdict, why, current))
    return results


def write(kind: RecordKind, record: Mapping[str, Any], table: str | None = None) -> RecordResult:
    """One record under the rules (see ``write_many``)."""
    return write_many(kind, [record], table)[0]


def mark_failed(kind: RecordKind, identity: Mapping[str, Any], error: Mapping[str, Any]) -> RecordResult:
    """A record that could be identified but not validated: set it failed with the error (never over a
    terminal record, never across scopes). ``identity`` holds the key and scope attributes, timestamps, and
    createdAt when known (which then guards as for any terminal write)."""
    return write(kind, {**identity, kind.status_attr: kind.statuses[FAILED], "error": dict(error)})
