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
- a record that can be identified but not validated is marked failed without touching a terminal record;
- a record DynamoDB could not store never reaches a request (it would fail the whole transaction): text fields
  over half an item are cut with a visible mark (``fit``), and a record that still does not fit, or holds a
  number DynamoDB cannot hold, is rejected (``Verdict.REJECTED``, problem ``Unwritable``) on its own.

A record *kind* says where and how: table, key attributes, scope (collection) attribute, status attribute and
its four values, createdAt attribute, the timestamps a light write may touch, and the execution link.
Dropped stale writes are results (``Verdict.STALE``), counted and logged, never exceptions.
"""

from __future__ import annotations

import copy
import decimal
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from boto3.dynamodb.types import TypeSerializer

from tasks.core import config, state_store
from tasks.core.runtime import run_logger

QUEUED, RUNNING, COMPLETED, FAILED = "queued", "running", "completed", "failed"
LIGHT_ROLES = (QUEUED, RUNNING)
TERMINAL_ROLES = (COMPLETED, FAILED)


@dataclass(frozen=True)
class RecordKind:
    """How one kind of status record is stored (table is a logical name from ``tasks.core.tables``)."""

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
        """The record's key attributes; ValueError if any is missing or empty."""
        missing = [k for k in self.key_attrs if record.get(k) in (None, "")]
        if missing:
            raise ValueError(f"{self.name}: record has no {', '.join(missing)}")
        return {k: record[k] for k in self.key_attrs}

    def table_name(self) -> str:
        """The physical name of this kind's table."""
        return config.table_name(self.table)


NOT_QUEUED = {RUNNING: "running", COMPLETED: "completed", FAILED: "failed"}  # executions and PDRs are never queued
EXECUTION = RecordKind("execution", "executions", ("arn",), statuses=NOT_QUEUED)
GRANULE = RecordKind(
    "granule", "granules", ("granuleId",), scope_attr="collectionId", execution_attr="execution", execution_kind=EXECUTION
)
# a PDR follows the granule rules (createdAt guard, light writes touch status and timestamps, terminal overwrites,
# running dropped once its execution finished); a PDR name is not tied to one collection (no scope)
PDR = RecordKind("pdr", "pdrs", ("pdrName",), statuses=NOT_QUEUED, execution_attr="execution", execution_kind=EXECUTION)


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
    problem: str = ""  # REJECTED: "ScopeConflict" (id under another scope) or "Unwritable" (DynamoDB cannot store it)
    cut: tuple[str, ...] = ()  # attribute paths whose text was cut to fit (see ``fit``)


def summarize(results: Sequence[RecordResult]) -> dict[str, int]:
    """``{"written": n, "stale": n, "rejected": n}``."""
    counts = Counter(r.verdict.value for r in results)
    return {v.value: counts.get(v.value, 0) for v in Verdict}


# --------------------------------------------------------------------------- what DynamoDB can store

ITEM_BYTES = 400 * 1024  # DynamoDB's item size limit
KEY_BYTES = 2048  # DynamoDB's partition key limit (a sort key's is 1024)
# an update keeps attributes an earlier record left (light writes add only absent ones; terminal writes keep the
# ones they do not give), so a record may use half an item: any two of them fit in one
RECORD_BYTES = ITEM_BYTES // 2 - 1024
KEEP_BYTES = 1024  # a cut text keeps at least this much
CUT_MARK = "…[cut {cut} of {total} bytes]"
_serializer = TypeSerializer()


class Unwritable(ValueError):
    """A record DynamoDB cannot store: a number out of its range, a key too long, or too large even when cut."""


def item_bytes(value: Any) -> int:
    """An upper bound of the size DynamoDB counts for ``value`` (an item: a dict of attributes)."""
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if value is None or isinstance(value, bool):
        return 1
    if isinstance(value, (int, float, decimal.Decimal)):
        return 21  # DynamoDB stores at most 38 digits in 21 bytes
    if isinstance(value, Mapping):
        return 3 + sum(len(str(k).encode()) + 1 + item_bytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return 3 + sum(1 + item_bytes(v) for v in value)
    return len(str(value).encode())


def _texts(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """(path, text) of every string inside ``value`` (dict values and list items, recursively)."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _texts(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _texts(v, (*path, i))


def _cut_text(text: str, keep: int) -> str:
    """``text`` cut to its first ``keep`` bytes (whole characters), with the mark saying how much went."""
    total = len(text.encode())
    kept = text.encode()[:keep].decode(errors="ignore")
    return kept + CUT_MARK.format(cut=total - len(kept.encode()), total=total)


def fit(kind: RecordKind, record: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The record as DynamoDB can store it, and the paths of the text fields cut (longest first, with a visible
    mark) to bring it within ``RECORD_BYTES``; ``Unwritable`` when it cannot be stored at all."""
    record = dict(record)
    for attr in kind.key_attrs:
        if item_bytes(record.get(attr)) > KEY_BYTES:
            raise Unwritable(f"{kind.name} {attr} is {item_bytes(record[attr])} bytes: over DynamoDB's {KEY_BYTES}-byte key limit")
    for attr, value in record.items():
        try:
            _serializer.serialize(state_store.to_dynamo(value))
        except (TypeError, ValueError, decimal.DecimalException):
            raise Unwritable(
                f"{kind.name} {attr} holds a number DynamoDB cannot store (over 38 digits, beyond 1e125, NaN or Infinity)"
            ) from None
    size = item_bytes(record)
    if size <= RECORD_BYTES:
        return record, ()
    record = copy.deepcopy(record)
    protected = {*kind.key_attrs, kind.status_attr, kind.created_attr, kind.scope_attr, kind.execution_attr}
    texts = sorted(((len(t.encode()), p) for p, t in _texts(record) if p[0] not in protected), key=lambda x: -x[0])
    cut = []
    for length, path in texts:
        if size <= RECORD_BYTES or length <= KEEP_BYTES + len(CUT_MARK) + 16:
            break
        holder = record
        for step in path[:-1]:
            holder = holder[step]
        new = _cut_text(holder[path[-1]], max(KEEP_BYTES, length - (size - RECORD_BYTES) - len(CUT_MARK) - 16))
        holder[path[-1]] = new
        size -= length - len(new.encode())
        cut.append("/".join(map(str, path)))
    if size > RECORD_BYTES:
        raise Unwritable(f"{kind.name} record is {size} bytes even with its text fields cut: over {RECORD_BYTES}")
    return record, tuple(cut)


# --------------------------------------------------------------------------- conditions


def _record_condition(kind: RecordKind, record: Mapping[str, Any], role: str, e: state_store.Expression) -> str:
    """The ConditionExpression on the record's own item for a write of ``role``."""
    absent = f"attribute_not_exists({e.name(kind.key_attrs[0])})"
    def terminal() -> str:
        """A condition: the stored status is a terminal one of this kind."""
        return e.one_of(kind.status_attr, [kind.statuses[r] for r in TERMINAL_ROLES if r in kind.statuses])

    parts = []
    if kind.scope_attr:
        parts.append(f"{e.name(kind.scope_attr)} = {e.value(record[kind.scope_attr])}")
    created = record.get(kind.created_attr)
    ca = e.name(kind.created_attr) if created is not None else ""
    if created is None:  # identifiable but unvalidated: mark failed, never over a terminal record
        parts.append(f"NOT ({terminal()})")
    elif role in TERMINAL_ROLES:  # newer or equal createdAt
        parts.append(f"(attribute_not_exists({ca}) OR {ca} <= {e.value(created)})")
    else:  # light: newer, or same attempt and not terminal yet
        t = e.value(created)
        parts.append(f"(attribute_not_exists({ca}) OR {ca} < {t} OR ({ca} = {t} AND NOT ({terminal()})))")
    return f"{absent} OR {parts[0]}" if len(parts) == 1 else f"{absent} OR ({' AND '.join(parts)})"


def _update_expression(kind: RecordKind, record: Mapping[str, Any], role: str, e: state_store.Expression) -> str:
    """Terminal: SET every given attribute. Light: SET status/createdAt/light attrs; others only if absent."""
    touch = {kind.status_attr, kind.created_attr, *kind.light_attrs}
    sets = []
    for attr, value in record.items():
        if attr in kind.key_attrs or value is None:
            continue
        if role in TERMINAL_ROLES or attr in touch:
            sets.append(f"{e.name(attr)} = {e.value(value)}")
        else:
            name = e.name(attr)
            sets.append(f"{name} = if_not_exists({name}, {e.value(value)})")
    expression = "SET " + ", ".join(sets)
    removes = [e.name(a) for a in kind.terminal_removes if role in TERMINAL_ROLES and record.get(a) is None]
    return expression + (" REMOVE " + ", ".join(removes) if removes else "")


def _execution_check(kind: RecordKind, record: Mapping[str, Any], role: str, table: str) -> dict[str, Any] | None:
    """The ConditionCheck on the linked execution: running needs it not finished, queued needs it absent."""
    ex = kind.execution_kind
    if ex is None or not kind.execution_attr or role not in LIGHT_ROLES or not record.get(kind.execution_attr):
        return None
    e = state_store.Expression()
    absent = f"attribute_not_exists({e.name(ex.key_attrs[0])})"
    if role == RUNNING:
        done = e.one_of(ex.status_attr, [ex.statuses[COMPLETED], ex.statuses[FAILED]])
        expression = f"{absent} OR NOT ({done})"
    else:
        expression = absent
    return e.entry(table, {ex.key_attrs[0]: record[kind.execution_attr]}, expression)


@dataclass
class _Op:
    """One guarded write: the record's Update and, for linked light writes, a ConditionCheck (all or nothing)."""

    kind: RecordKind
    record: dict[str, Any]
    role: str
    update: dict[str, Any]
    check: dict[str, Any] | None

    def items(self) -> list[dict[str, Any]]:
        """The transaction items: the Update, then the ConditionCheck if any."""
        return [{"Update": self.update}] + ([{"ConditionCheck": self.check}] if self.check else [])


def plan(kind: RecordKind, record: Mapping[str, Any], table: str, execution_table: str | None = None) -> _Op:
    """The guarded write for ``record`` (its status in the kind's vocabulary) as transaction items."""
    record = {k: v for k, v in record.items() if v is not None}
    role = kind.role(record.get(kind.status_attr))
    key = kind.key(record)
    if kind.scope_attr and record.get(kind.scope_attr) in (None, ""):
        raise ValueError(f"{kind.name} {key}: no {kind.scope_attr}")
    e = state_store.Expression()
    update_expression = _update_expression(kind, record, role, e)
    condition = _record_condition(kind, record, role, e)
    update = e.entry(table, key, condition, update_expression)
    return _Op(kind, record, role, update, _execution_check(kind, record, role, execution_table or ""))


def _explain(op: _Op, reasons: Sequence[Mapping[str, Any]]) -> tuple[Verdict, str, dict | None]:
    """Why a write did not apply, from the items DynamoDB returned with the cancellation."""
    kind, record = op.kind, op.record
    own = reasons[0] if reasons else {}
    current = _from_raw(own.get("Item"))
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
        execution = _from_raw(reasons[1].get("Item")) or {}
        ex_status = execution.get(op.kind.execution_kind.status_attr)
        why = "already exists" if op.role == QUEUED else f"is already {ex_status}"
        return Verdict.STALE, f"execution {record[kind.execution_attr]} {why} ({op.role} write dropped)", current
    return Verdict.STALE, "condition failed", current



def _from_raw(raw: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return state_store.to_plain(state_store.item_from_raw(raw))


# --------------------------------------------------------------------------- the writer


def write_many(kind: RecordKind, records: Sequence[Mapping[str, Any]], table: str | None = None) -> list[RecordResult]:
    """Write records of one kind under the rules, in transactions; one result per record, in order.

    Records for the same item are applied in list order (as if one by one)."""
    table = table or kind.table_name()
    execution_table = kind.execution_kind.table_name() if kind.execution_kind else None
    results: list[RecordResult | None] = [None] * len(records)
    ops, cuts = [], []
    for index, record in enumerate(records):
        try:
            fitted, cut = fit(kind, record)
        except Unwritable as error:  # rejected on its own: in a transaction it would fail every other record
            key, status = kind.key(record), record.get(kind.status_attr)
            run_logger(__name__).warning("%s %s %s write rejected: %s", kind.name, key, status, error)
            results[index] = RecordResult(kind.name, key, status, Verdict.REJECTED, str(error), problem="Unwritable")
            continue
        if cut:
            run_logger(__name__).warning("%s %s: text cut to fit an item: %s", kind.name, kind.key(record), ", ".join(cut))
        ops.append((index, plan(kind, fitted, table, execution_table)))
        cuts.append(cut)
    outcomes = state_store.transact_groups([op.items() for _, op in ops])
    for (index, op), cut, reasons in zip(ops, cuts, outcomes):
        key, status = op.update["Key"], op.record[kind.status_attr]
        if reasons is None:
            results[index] = RecordResult(kind.name, key, status, Verdict.WRITTEN, cut=cut)
            continue
        verdict, why, current = _explain(op, reasons)
        run_logger(__name__).info("%s %s %s write %s: %s", kind.name, key, status, verdict.value, why)
        problem = "ScopeConflict" if verdict is Verdict.REJECTED else ""
        results[index] = RecordResult(kind.name, key, status, verdict, why, current, problem, cut)
    return results  # type: ignore[return-value]  # every index is set


def write(kind: RecordKind, record: Mapping[str, Any], table: str | None = None) -> RecordResult:
    """One record under the rules (see ``write_many``)."""
    return write_many(kind, [record], table)[0]


def mark_failed(kind: RecordKind, identity: Mapping[str, Any], error: Mapping[str, Any]) -> RecordResult:
    """A record that could be identified but not validated: set it failed with the error (never over a
    terminal record, never across scopes). ``identity`` holds the key and scope attributes, timestamps, and
    createdAt when known (which then guards as for any terminal write)."""
    return write(kind, {**identity, kind.status_attr: kind.statuses[FAILED], "error": dict(error)})
