"""The one module that writes status to DynamoDB: every conditional write goes through here.

Rules (../shared/DESIGN.md):
- create-if-absent for anything created once;
- transition-if-current for every status change;
- a counter moves in the same transaction as the transition that justifies it;
- a lost race is a normal result (``Outcome.STALE`` / ``Outcome.EXISTS``), never an escaping exception;
- FilterExpression never names a key attribute: callers filter in code (``query_all(keep=...)``);
- throttling is retried by botocore's adaptive mode; batch writes retry unprocessed items.

The client reaches DynamoDB Local through boto3's own ``AWS_ENDPOINT_URL_DYNAMODB``; unset, it reaches AWS.
"""

from __future__ import annotations

import threading
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import Enum
from typing import Any

import boto3
from boto3.dynamodb.types import TypeDeserializer
from botocore.config import Config
from botocore.exceptions import ClientError

BOTO_CONFIG = Config(retries={"mode": "adaptive", "max_attempts": 10}, max_pool_connections=64)

_local = threading.local()
_deserializer = TypeDeserializer()
_session: boto3.Session | None = None  # from a prefect-aws AwsCredentials block; None: boto3's default chain


def use_session(session: boto3.Session | None) -> None:
    """Talk to DynamoDB with ``session`` (credentials from a block) from now on, in every thread."""
    global _session
    _session = session
    _local.__dict__.clear()


def dynamodb():
    """A DynamoDB resource for this thread (boto3 resources are not thread-safe)."""
    resource = getattr(_local, "resource", None)
    if resource is None:
        factory = _session.resource if _session is not None else boto3.resource
        resource = factory("dynamodb", config=BOTO_CONFIG)
        _local.resource = resource
    return resource


def client():
    """The low-level client behind this thread's resource (it accepts plain Python values)."""
    return dynamodb().meta.client


def table(name: str):
    """A boto3 Table for ``name`` (cached per thread: building one costs as much as a request)."""
    tables = getattr(_local, "tables", None)
    if tables is None or getattr(_local, "tables_of", None) is not dynamodb():
        tables = _local.tables = {}
        _local.tables_of = dynamodb()
    if name not in tables:
        tables[name] = dynamodb().Table(name)
    return tables[name]


def reset_clients() -> None:
    """Forget this thread's client, e.g. after the endpoint variable changed."""
    _local.__dict__.clear()


class Outcome(str, Enum):
    """What a conditional write did."""

    APPLIED = "applied"  # the write took effect
    EXISTS = "exists"  # create-if-absent: the item was already there; nothing changed
    STALE = "stale"  # the item was not in the expected state (or absent); nothing changed


@dataclass(frozen=True)
class WriteResult:
    """The typed result of a conditional write; ``item`` is the item as it now stands, when known."""

    outcome: Outcome
    item: dict[str, Any] | None = None

    @property
    def applied(self) -> bool:
        return self.outcome is Outcome.APPLIED

    def __bool__(self) -> bool:  # `if store.transition(...):` reads naturally
        return self.applied


@dataclass(frozen=True)
class Increment:
    """An ``ADD`` on another item, written in the same transaction as a transition."""

    table: str
    key: Mapping[str, Any]
    amounts: Mapping[str, int | Decimal]


@dataclass(frozen=True)
class Condition:
    """An extra condition ANDed to a write: an expression plus its placeholders."""

    expression: str
    names: Mapping[str, str] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)


def _is_conditional_failure(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def _old_item(error: ClientError) -> dict[str, Any] | None:
    raw = error.response.get("Item")
    if not raw:
        return None
    return {k: _deserializer.deserialize(v) for k, v in raw.items()}


def to_plain(value: Any) -> Any:
    """DynamoDB's Decimals back to int/float, recursively (for JSON, artifacts and comparisons)."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, set):
        return {to_plain(v) for v in value}
    return value


def to_dynamo(value: Any) -> Any:
    """Python floats to Decimal (DynamoDB rejects float), recursively."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: to_dynamo(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_dynamo(v) for v in value]
    return value


# --------------------------------------------------------------------------- reads


def get_item(table_name: str, key: Mapping[str, Any], consistent: bool = True) -> dict[str, Any] | None:
    """One item by key (strongly consistent by default), or None."""
    return table(table_name).get_item(Key=dict(key), ConsistentRead=consistent).get("Item")


def query_all(
    table_name: str,
    keep: Callable[[dict[str, Any]], bool] | None = None,
    limit: int | None = None,
    **query: Any,
) -> Iterator[dict[str, Any]]:
    """Every item of a Query, following LastEvaluatedKey; ``keep`` filters in code (never on keys in DynamoDB)."""
    tbl = table(table_name)
    seen = 0
    while True:
        page = tbl.query(**query)
        for item in page.get("Items", []):
            if keep is None or keep(item):
                yield item
                seen += 1
                if limit is not None and seen >= limit:
                    return
        last = page.get("LastEvaluatedKey")
        if not last:
            return
        query["ExclusiveStartKey"] = last


def scan_all(table_name: str, keep: Callable[[dict[str, Any]], bool] | None = None, **scan: Any) -> Iterator[dict]:
    """Every item of a Scan (maintenance only; access patterns use Query)."""
    tbl = table(table_name)
    while True:
        page = tbl.scan(**scan)
        for item in page.get("Items", []):
            if keep is None or keep(item):
                yield item
        last = page.get("LastEvaluatedKey")
        if not last:
            return
        scan["ExclusiveStartKey"] = last


# --------------------------------------------------------------------------- writes


def create_if_absent(
    table_name: str,
    item: Mapping[str, Any],
    key_names: Sequence[str],
    condition: Condition | None = None,
) -> WriteResult:
    """Put ``item`` only if no item has its key: APPLIED, or EXISTS with the item already there."""
    names = {f"#k{i}": k for i, k in enumerate(key_names)}
    expression = " AND ".join(f"attribute_not_exists({n})" for n in names)
    values: dict[str, Any] = {}
    if condition:
        expression = f"({expression}) AND ({condition.expression})"
        names.update(condition.names)
        values.update(condition.values)
    kwargs: dict[str, Any] = dict(
        Item=to_dynamo(dict(item)),
        ConditionExpression=expression,
        ExpressionAttributeNames=names,
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
    )
    if values:
        kwargs["ExpressionAttributeValues"] = to_dynamo(values)
    try:
        table(table_name).put_item(**kwargs)
    except ClientError as error:
        if _is_conditional_failure(error):
            old = _old_item(error)
            return WriteResult(Outcome.EXISTS if old is not None else Outcome.STALE, old)
        raise
    return WriteResult(Outcome.APPLIED, dict(item))


def put_if(table_name: str, item: Mapping[str, Any], condition: Condition) -> WriteResult:
    """Put (replace) ``item`` only when ``condition`` holds on the current item: APPLIED or STALE."""
    kwargs: dict[str, Any] = dict(
        Item=to_dynamo(dict(item)),
        ConditionExpression=condition.expression,
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
    )
    if condition.names:
        kwargs["ExpressionAttributeNames"] = dict(condition.names)
    if condition.values:
        kwargs["ExpressionAttributeValues"] = to_dynamo(dict(condition.values))
    try:
        table(table_name).put_item(**kwargs)
    except ClientError as error:
        if _is_conditional_failure(error):
            return WriteResult(Outcome.STALE, _old_item(error))
        raise
    return WriteResult(Outcome.APPLIED, dict(item))


@dataclass
class _Update:
    """An UpdateItem's expression pieces, built from plain dicts."""

    sets: dict[str, Any]
    removes: Sequence[str]
    adds: Mapping[str, Any]
    names: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)

    def _name(self, attr: str) -> str:
        placeholder = f"#a{len(self.names)}"
        self.names[placeholder] = attr
        return placeholder

    def _value(self, value: Any) -> str:
        placeholder = f":v{len(self.values)}"
        self.values[placeholder] = to_dynamo(value)
        return placeholder

    def expression(self) -> str:
        parts = []
        if self.sets:
            parts.append("SET " + ", ".join(f"{self._name(a)} = {self._value(v)}" for a, v in self.sets.items()))
        if self.adds:
            parts.append("ADD " + ", ".join(f"{self._name(a)} {self._value(v)}" for a, v in self.adds.items()))
        if self.removes:
            parts.append("REMOVE " + ", ".join(self._name(a) for a in self.removes))
        return " ".join(parts)

    def status_condition(self, status_attr: str, expected: str | Sequence[str] | None, key: Mapping[str, Any]) -> str:
        if expected is None:  # only "the item exists"
            return f"attribute_exists({self._name(next(iter(key)))})"
        attr = self._name(status_attr)
        options = [expected] if isinstance(expected, str) else list(expected)
        if len(options) == 1:
            return f"{attr} = {self._value(options[0])}"
        return f"{attr} IN ({', '.join(self._value(o) for o in options)})"

    def add_condition(self, condition: Condition | None, expression: str) -> str:
        if condition is None:
            return expression
        self.names.update(condition.names)
        self.values.update(to_dynamo(dict(condition.values)))
        return f"({expression}) AND ({condition.expression})"


def transition(
    table_name: str,
    key: Mapping[str, Any],
    expected: str | Sequence[str] | None,
    new: str | None,
    *,
    status_attr: str = "status",
    set: Mapping[str, Any] | None = None,  # noqa: A002 - mirrors DynamoDB's SET
    remove: Sequence[str] = (),
    add: Mapping[str, Any] | None = None,
    condition: Condition | None = None,
    increments: Sequence[Increment] = (),
) -> WriteResult:
    """Move ``status_attr`` from ``expected`` (one value or any of several) to ``new``, only if it is current.

    ``expected=None`` only requires the item to exist (an update never creates an item here);
    ``new=None`` leaves the status as it is (a guarded attribute update). ``increments`` are ADDs on other
    items written in the same TransactWriteItems, so a retried transition never counts twice.
    Returns APPLIED with the new item, or STALE with the current item (None if absent).
    """
    sets = dict(set or {})
    if new is not None:
        sets[status_attr] = new
    update = _Update(sets=sets, removes=list(remove), adds=dict(add or {}))
    expression = update.expression()
    cond = update.status_condition(status_attr, expected, key)
    cond = update.add_condition(condition, cond)

    if not increments:
        kwargs: dict[str, Any] = dict(
            Key=dict(key),
            UpdateExpression=expression,
            ConditionExpression=cond,
            ExpressionAttributeNames=update.names,
            ReturnValues="ALL_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        if update.values:
            kwargs["ExpressionAttributeValues"] = update.values
        try:
            response = table(table_name).update_item(**kwargs)
        except ClientError as error:
            if _is_conditional_failure(error):
                return WriteResult(Outcome.STALE, _old_item(error))
            raise
        return WriteResult(Outcome.APPLIED, response.get("Attributes"))

    main: dict[str, Any] = {
        "TableName": table_name,
        "Key": dict(key),
        "UpdateExpression": expression,
        "ConditionExpression": cond,
        "ExpressionAttributeNames": update.names,
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    if update.values:
        main["ExpressionAttributeValues"] = update.values
    items: list[dict[str, Any]] = [{"Update": main}]
    for inc in increments:
        names = {f"#c{i}": attr for i, attr in enumerate(inc.amounts)}
        values = {f":c{i}": to_dynamo(amount) for i, amount in enumerate(inc.amounts.values())}
        items.append(
            {
                "Update": {
                    "TableName": inc.table,
                    "Key": dict(inc.key),
                    "UpdateExpression": "ADD " + ", ".join(f"{n} {v}" for n, v in zip(names, values)),
                    "ExpressionAttributeNames": names,
                    "ExpressionAttributeValues": values,
                }
            }
        )
    try:
        client().transact_write_items(TransactItems=items)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "TransactionCanceledException":
            reasons = error.response.get("CancellationReasons") or []
            if reasons and reasons[0].get("Code") == "ConditionalCheckFailed":
                raw = reasons[0].get("Item")
                current = {k: _deserializer.deserialize(v) for k, v in raw.items()} if raw else None
                return WriteResult(Outcome.STALE, current)
        raise
    return WriteResult(Outcome.APPLIED, get_item(table_name, key))


def put(table_name: str, item: Mapping[str, Any]) -> None:
    """Unconditional put, for append-only records (metrics) that no status depends on."""
    table(table_name).put_item(Item=to_dynamo(dict(item)))


def batch_put(table_name: str, items: Iterable[Mapping[str, Any]], key_names: Sequence[str] | None = None) -> int:
    """Write many items; boto3's batch_writer retries UnprocessedItems. Returns the count written."""
    count = 0
    kwargs = {"overwrite_by_pkeys": list(key_names)} if key_names else {}
    with table(table_name).batch_writer(**kwargs) as writer:
        for item in items:
            writer.put_item(Item=to_dynamo(dict(item)))
            count += 1
    return count


def batch_delete(table_name: str, keys: Iterable[Mapping[str, Any]]) -> int:
    """Delete many items by key; unprocessed items are retried by batch_writer. Returns the count."""
    count = 0
    with table(table_name).batch_writer() as writer:
        for key in keys:
            writer.delete_item(Key=dict(key))
            count += 1
    return count


def delete_if(table_name: str, key: Mapping[str, Any], condition: Condition | None = None) -> WriteResult:
    """Delete one item, optionally only when ``condition`` holds: APPLIED or STALE."""
    kwargs: dict[str, Any] = {"Key": dict(key), "ReturnValues": "ALL_OLD"}
    if condition:
        kwargs["ConditionExpression"] = condition.expression
        if condition.names:
            kwargs["ExpressionAttributeNames"] = dict(condition.names)
        if condition.values:
            kwargs["ExpressionAttributeValues"] = to_dynamo(dict(condition.values))
        kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    try:
        response = table(table_name).delete_item(**kwargs)
    except ClientError as error:
        if _is_conditional_failure(error):
            return WriteResult(Outcome.STALE, _old_item(error))
        raise
    return WriteResult(Outcome.APPLIED, response.get("Attributes"))


# --------------------------------------------------------------------------- bulk conditional writes

TRANSACTION_LIMIT = 100  # DynamoDB's maximum items per TransactWriteItems


def _entry_id(entry: Mapping[str, Any]) -> tuple:
    """(table, key) of one TransactItems entry: a transaction may name an item only once."""
    operation = next(iter(entry.values()))
    key = operation.get("Key")
    if key is None:  # a Put: its key attributes are the ones its attribute_not_exists condition names
        named = set(operation.get("ExpressionAttributeNames", {}).values())
        key = {k: v for k, v in operation["Item"].items() if k in named} or operation["Item"]
    return operation["TableName"], tuple(sorted((k, str(v)) for k, v in key.items()))


def _next_batch(pending: list[int], groups: Sequence[Sequence[Mapping[str, Any]]]) -> list[int]:
    """Groups for the next transaction: in order, <= 100 entries, no item twice; a group touching an item
    that an earlier pending group also touches waits for it, so writes to one item keep their order."""
    batch, used, blocked, size = [], set(), set(), 0
    for index in pending:
        ids = [_entry_id(entry) for entry in groups[index]]
        if size + len(ids) > TRANSACTION_LIMIT or used.intersection(ids) or blocked.intersection(ids):
            blocked.update(ids)
            continue
        batch.append(index)
        used.update(ids)
        size += len(ids)
    return batch


def transact_groups(groups: Sequence[Sequence[Mapping[str, Any]]]) -> list[list[dict[str, Any]] | None]:
    """Apply groups of TransactItems entries (Put/Update/Delete/ConditionCheck), each group all-or-nothing.

    Groups are packed into transactions of up to 100 entries. A transaction is all-or-nothing, so when some
    conditions fail the cancellation reasons say which groups lost; the others are sent again. Conflicts
    with concurrent transactions are retried with jittered backoff. Returns, per group, None when it was
    applied, else its cancellation reasons (each with the item as it stands, ``ALL_OLD``, raw).
    """
    results: list[Any] = [False] * len(groups)  # False: not decided yet
    pending = list(range(len(groups)))
    conflicts = 0
    while pending:
        batch = _next_batch(pending, groups)
        only = groups[batch[0]] if len(batch) == 1 else None
        if only is not None and len(only) == 1 and "Update" in only[0]:  # one update: no transaction needed
            try:
                client().update_item(**only[0]["Update"])
                results[batch[0]] = None
            except ClientError as error:
                if not _is_conditional_failure(error):
                    raise
                results[batch[0]] = [{"Code": "ConditionalCheckFailed", "Item": error.response.get("Item")}]
        else:
            try:
                client().transact_write_items(TransactItems=[entry for i in batch for entry in groups[i]])
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                    raise
                reasons = error.response.get("CancellationReasons") or []
                position, failed = 0, False
                for index in batch:
                    mine = reasons[position : position + len(groups[index])]
                    position += len(groups[index])
                    if any(r.get("Code") == "ConditionalCheckFailed" for r in mine):
                        results[index] = mine
                        failed = True
                if not failed:  # TransactionConflict / throttling: back off and send the batch again
                    conflicts += 1
                    if conflicts > 50:
                        raise
                    time.sleep(min(1.0, 0.01 * 2 ** min(conflicts, 6)) * random.random())
            else:
                for index in batch:
                    results[index] = None
        pending = [i for i in pending if results[i] is False]
    return results


def _run_each(operations: list[dict[str, Any]], lost: Outcome) -> list[WriteResult]:
    """One conditional write per operation at transaction throughput; ``lost`` (or STALE if absent) when its condition fails."""
    results = []
    for reasons in transact_groups([[operation] for operation in operations]):
        if reasons is None:
            results.append(WriteResult(Outcome.APPLIED, None))
            continue
        raw = reasons[0].get("Item")
        current = {k: _deserializer.deserialize(v) for k, v in raw.items()} if raw else None
        results.append(WriteResult(lost if current is not None else Outcome.STALE, current))
    return results


def create_many_if_absent(table_name: str, items: Sequence[Mapping[str, Any]], key_names: Sequence[str]) -> list[WriteResult]:
    """``create_if_absent`` for many items at transaction throughput; one result per item, in order."""
    names = {f"#k{i}": k for i, k in enumerate(key_names)}
    expression = " AND ".join(f"attribute_not_exists({n})" for n in names)
    operations = [
        {
            "Put": {
                "TableName": table_name,
                "Item": to_dynamo(dict(item)),
                "ConditionExpression": expression,
                "ExpressionAttributeNames": names,
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        for item in items
    ]
    results = _run_each(operations, Outcome.EXISTS)
    return [WriteResult(r.outcome, dict(item) if r.applied else r.item) for r, item in zip(results, items)]


def transition_many(
    table_name: str,
    changes: Sequence[tuple[Mapping[str, Any], str | Sequence[str] | None, str | None, Mapping[str, Any] | None]],
    *,
    status_attr: str = "status",
) -> list[WriteResult]:
    """``transition`` for many items: each change is (key, expected, new, extra SET attributes).

    Every item moves only if it is still in its expected state; one result per change, in order.
    """
    operations = []
    for key, expected, new, sets in changes:
        all_sets = dict(sets or {})
        if new is not None:
            all_sets[status_attr] = new
        update = _Update(sets=all_sets, removes=(), adds={})
        expression = update.expression()
        operation = {
            "TableName": table_name,
            "Key": dict(key),
            "UpdateExpression": expression,
            "ConditionExpression": update.status_condition(status_attr, expected, key),
            "ExpressionAttributeNames": update.names,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if update.values:
            operation["ExpressionAttributeValues"] = update.values
        operations.append({"Update": operation})
    return _run_each(operations, Outcome.STALE)
