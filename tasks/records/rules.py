"""Status writes from asynchronous events, with the seed 004 write constraints, for any record kind.

Every constraint lives here, each one a DynamoDB ConditionExpression evaluated atomically with its write, so
the rules hold under concurrency (nothing is read first and decided in Python). A kind's ``upsert`` says which
rules its writes follow:

- ``ATTEMPT`` (any status record): ``queued``/``running`` writes touch only the status and the kind's timestamp
  attributes of an existing record (a new record is inserted whole: other attributes are written with
  ``if_not_exists``), and are dropped as stale when the incoming createdAt is older than the record's, or when
  the record already holds a terminal state of the same createdAt (same attempt); ``completed``/``failed``
  writes overwrite every given attribute, only when createdAt is newer or equal;
- ``GRANULE`` (seed 004, Cumulus's granule upsert): as ``ATTEMPT``, but a light write applies over any record of
  an older or the same createdAt, and, when the granule exists, only while (running) the linked execution is
  not completed/failed, or (queued) the linked execution does not exist; a new granule is inserted whatever the
  execution's state;
- ``EXECUTION`` (Cumulus's execution upsert): ``running`` inserts a new record whole and otherwise touches only
  createdAt, the timestamps and originalPayload (never the status); ``completed``/``failed`` overwrite;
- ``PDR`` (Cumulus's PDR upsert): every write overwrites, only when createdAt is newer or equal, and a running
  write also only when it comes from another execution or carries more progress.

Common to all: a record id is unique across scopes (collections): a write for the same id under another scope
is rejected, never applied; a record that can be identified but not validated is marked failed without
touching a terminal record; an attribute given as ``REMOVE`` is removed by an overwriting write (a light write
ignores it); a record DynamoDB could not store never reaches a request (it would fail the whole transaction):
text fields over half an item are cut with a visible mark (``fit``), and a record that still does not fit, or
holds a number DynamoDB cannot hold, is rejected (``Verdict.REJECTED``, problem ``Unwritable``) on its own.

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
from tasks.core.errors import RefusedInput
from tasks.core.runtime import run_logger

QUEUED, RUNNING, COMPLETED, FAILED = "queued", "running", "completed", "failed"
LIGHT_ROLES = (QUEUED, RUNNING)
TERMINAL_ROLES = (COMPLETED, FAILED)


class Upsert(str, Enum):
    """Which rules a kind's writes follow (see the module docstring)."""

    ATTEMPT = "attempt"
    GRANULE = "granule"
    EXECUTION = "execution"
    PDR = "pdr"


class _Remove:
    """The value of an attribute an overwriting write removes (a message gave it as null)."""

    def __repr__(self) -> str:
        return "REMOVE"


REMOVE = _Remove()


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
    execution_kind: RecordKind | None = None  # the kind the execution records are
    terminal_removes: tuple[str, ...] = ()  # removed by a terminal write that does not give them (a stale error)
    upsert: Upsert = Upsert.ATTEMPT

    def light(self, role: str) -> bool:
        """Whether a write of ``role`` touches only the status and timestamps of an existing record."""
        if self.upsert is Upsert.PDR:
            return False
        return role == RUNNING if self.upsert is Upsert.EXECUTION else role in LIGHT_ROLES

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
EXECUTION = RecordKind(
    "execution",
    "executions",
    ("arn",),
    statuses=NOT_QUEUED,
    upsert=Upsert.EXECUTION,
    light_attrs=("timestamp", "updatedAt", "originalPayload"),
)
GRANULE = RecordKind(
    "granule",
    "granules",
    ("granuleId",),
    scope_attr="collectionId",
    execution_attr="execution",
    execution_kind=EXECUTION,
    upsert=Upsert.GRANULE,
)
# a PDR name is not tied to one collection (no scope); its running writes compare executions and progress
PDR = RecordKind("pdr", "pdrs", ("pdrName",), statuses=NOT_QUEUED, execution_attr="execution", upsert=Upsert.PDR)


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


class Unwritable(RefusedInput):
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


def storable(value: Any) -> bool:
    """Whether DynamoDB can hold every number in ``value``."""
    try:
        _serializer.serialize(state_store.to_dynamo(value))
    except (TypeError, ValueError, decimal.DecimalException):
        return False
    return True


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
            raise Unwritable(
                f"{kind.name} {attr} is {item_bytes(record[attr])} bytes: over DynamoDB's {KEY_BYTES}-byte key limit"
            )
    for attr, value in record.items():
        if value is not REMOVE and not storable(value):
            raise Unwritable(
                f"{kind.name} {attr} holds a number DynamoDB cannot store "
                "(over 38 digits, beyond 1e125, NaN or Infinity)"
            )
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


class Step(str, Enum):
    """Which write a record gets: ``WRITE`` (one guarded write), or for an insert-first kind's light write,
    ``INSERT`` (only when the record does not exist) then ``UPDATE`` (the guarded update of the existing one)."""

    WRITE = "write"
    INSERT = "insert"
    UPDATE = "update"


def first_step(kind: RecordKind, role: str) -> Step:
    """``INSERT`` for a light write of a kind that inserts a new record whole and touches only the light
    attributes of an existing one (Cumulus's granule and execution upserts), else ``WRITE``."""
    return Step.INSERT if kind.light(role) and kind.upsert in (Upsert.GRANULE, Upsert.EXECUTION) else Step.WRITE


def _record_condition(
    kind: RecordKind, record: Mapping[str, Any], role: str, e: state_store.Expression, step: Step
) -> str | None:
    """The ConditionExpression on the record's own item for a write of ``role`` (None: the write always applies)."""
    if kind.upsert is Upsert.EXECUTION and step is Step.WRITE:
        return None  # Cumulus's execution upsert has no guard: a running write never touches the status instead
    if step is Step.INSERT:
        return f"attribute_not_exists({e.name(kind.key_attrs[0])})"
    if kind.upsert is Upsert.EXECUTION:
        return f"attribute_exists({e.name(kind.key_attrs[0])})"

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
    elif kind.upsert is Upsert.ATTEMPT and kind.light(role):  # newer, or same attempt and not terminal yet
        t = e.value(created)
        parts.append(f"(attribute_not_exists({ca}) OR {ca} < {t} OR ({ca} = {t} AND NOT ({terminal()})))")
    else:  # newer or equal createdAt
        parts.append(f"(attribute_not_exists({ca}) OR {ca} <= {e.value(created)})")
    if kind.upsert is Upsert.PDR and role == RUNNING and record.get(kind.execution_attr) and "progress" in record:
        ex, progress = e.name(kind.execution_attr), e.name("progress")
        parts.append(
            f"(attribute_not_exists({ex}) OR {ex} <> {e.value(record[kind.execution_attr])} "
            f"OR {progress} < {e.value(record['progress'])})"
        )
    if step is Step.UPDATE:
        return " AND ".join([f"attribute_exists({e.name(kind.key_attrs[0])})", *parts])
    absent = f"attribute_not_exists({e.name(kind.key_attrs[0])})"
    return f"{absent} OR {parts[0]}" if len(parts) == 1 else f"{absent} OR ({' AND '.join(parts)})"


def _update_expression(
    kind: RecordKind, record: Mapping[str, Any], role: str, e: state_store.Expression, step: Step
) -> str:
    """Overwriting (or inserting): SET every given attribute, REMOVE those given as ``REMOVE``. Light: SET the
    status (not for executions), createdAt and the light attributes; the others only if absent (``WRITE``) or
    not at all (``UPDATE``)."""
    light = kind.light(role) and step is not Step.INSERT
    touch = {kind.created_attr, *kind.light_attrs}
    if kind.upsert is not Upsert.EXECUTION:
        touch.add(kind.status_attr)
    sets = []
    for attr, value in record.items():
        if attr in kind.key_attrs or value is None or value is REMOVE:
            continue
        if not light or attr in touch:
            sets.append(f"{e.name(attr)} = {e.value(value)}")
        elif step is Step.WRITE:
            name = e.name(attr)
            sets.append(f"{name} = if_not_exists({name}, {e.value(value)})")
    expression = "SET " + ", ".join(sets)
    if light or step is Step.INSERT:
        return expression
    removes = [e.name(a) for a, v in record.items() if v is REMOVE and a not in kind.key_attrs]
    removes += [e.name(a) for a in kind.terminal_removes if role in TERMINAL_ROLES and record.get(a) is None]
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
    step: Step = Step.WRITE

    def items(self) -> list[dict[str, Any]]:
        """The transaction items: the Update, then the ConditionCheck if any."""
        return [{"Update": self.update}] + ([{"ConditionCheck": self.check}] if self.check else [])


def plan(
    kind: RecordKind,
    record: Mapping[str, Any],
    table: str,
    execution_table: str | None = None,
    step: Step | None = None,
) -> _Op:
    """The guarded write for ``record`` (its status in the kind's vocabulary) as transaction items; ``step``:
    which write (default: the first one, ``first_step``)."""
    record = {k: v for k, v in record.items() if v is not None}
    role = kind.role(record.get(kind.status_attr))
    key = kind.key(record)
    if kind.scope_attr and record.get(kind.scope_attr) in (None, ""):
        raise ValueError(f"{kind.name} {key}: no {kind.scope_attr}")
    step = step or first_step(kind, role)
    e = state_store.Expression()
    update_expression = _update_expression(kind, record, role, e, step)
    condition = _record_condition(kind, record, role, e, step)
    update = e.entry(table, key, condition, update_expression)
    check = None if step is Step.INSERT else _execution_check(kind, record, role, execution_table or "")
    return _Op(kind, record, role, update, check, step)


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
        if kind.upsert is Upsert.PDR and op.role == RUNNING:
            return (
                Verdict.STALE,
                "running write of the same execution without more progress "
                f"({record.get('progress')} <= {current.get('progress')})",
                current,
            )
        return (
            Verdict.STALE,
            f"{kind.status_attr} already {current.get(kind.status_attr)} for this {kind.created_attr}",
            current,
        )
    if len(reasons) > 1 and reasons[1].get("Code") == "ConditionalCheckFailed":
        execution = _from_raw(reasons[1].get("Item")) or {}
        ex_status = execution.get(op.kind.execution_kind.status_attr)
        why = "already exists" if op.role == QUEUED else f"is already {ex_status}"
        return Verdict.STALE, f"execution {record[kind.execution_attr]} {why} ({op.role} write dropped)", current
    return Verdict.STALE, "condition failed", current


def _from_raw(raw: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return state_store.to_plain(state_store.item_from_raw(raw))


# --------------------------------------------------------------------------- the writer


def _apply(
    ops: list[tuple[int, _Op]], table: str, execution_table: str | None
) -> list[tuple[_Op, list[dict[str, Any]] | None]]:
    """Each op through ``transact_groups``, in record order for each item; an insert that found the record is
    followed by the guarded update of it before the next write of the same item is sent. Returns, per op, the
    last write made and its outcome (None: applied, else the cancellation reasons)."""
    outcomes: list[tuple[_Op, list[dict[str, Any]] | None]] = [(op, None) for _, op in ops]
    seen: Counter = Counter()
    rounds: dict[int, list[int]] = {}  # the n-th write of each item goes in round n
    for position, (_, op) in enumerate(ops):
        item = tuple(sorted((k, str(v)) for k, v in op.update["Key"].items()))
        rounds.setdefault(seen[item], []).append(position)
        seen[item] += 1
    two_step = any(op.step is Step.INSERT for _, op in ops)
    for round_ in [rounds[n] for n in sorted(rounds)] if two_step else [list(range(len(ops)))]:
        for position, reasons in zip(round_, state_store.transact_groups([ops[p][1].items() for p in round_])):
            outcomes[position] = (ops[position][1], reasons)
        found = [p for p in round_ if ops[p][1].step is Step.INSERT and outcomes[p][1] is not None]
        updates = [plan(ops[p][1].kind, ops[p][1].record, table, execution_table, Step.UPDATE) for p in found]
        for position, update, reasons in zip(
            found, updates, state_store.transact_groups([u.items() for u in updates]) if updates else []
        ):
            outcomes[position] = (update, reasons)
    return outcomes


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
            run_logger(__name__).warning(
                "%s %s: text cut to fit an item: %s", kind.name, kind.key(record), ", ".join(cut)
            )
        ops.append((index, plan(kind, fitted, table, execution_table)))
        cuts.append(cut)
    outcomes = _apply(ops, table, execution_table)
    for (index, _), cut, (op, reasons) in zip(ops, cuts, outcomes):
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


def failed_mark(kind: RecordKind, identity: Mapping[str, Any], error: Mapping[str, Any]) -> dict[str, Any]:
    """The record that sets an identified but unvalidated record failed with ``error`` (see ``mark_failed``)."""
    return {**identity, kind.status_attr: kind.statuses[FAILED], "error": dict(error)}


def mark_failed(kind: RecordKind, identity: Mapping[str, Any], error: Mapping[str, Any]) -> RecordResult:
    """A record that could be identified but not validated: set it failed with the error (never over a
    terminal record, never across scopes). ``identity`` holds the key and scope attributes, timestamps, and
    createdAt when known (which then guards as for any terminal write)."""
    return write(kind, failed_mark(kind, identity, error))
