"""The one module that writes status to DynamoDB: every conditional write goes through here.

Rules (docs/design.md, "One state store, one set of rules"):
- create-if-absent for anything created once;
- transition-if-current for every status change;
- a counter moves in the same transaction as the transition that justifies it;
- a lost race is a normal result (``Outcome.STALE`` / ``Outcome.EXISTS``), never an escaping exception;
- FilterExpression never names a key attribute: callers filter in code (``query_all(keep=...)``);
- throttling is retried by botocore's adaptive mode; batch writes retry unprocessed items;
- a reason or error attribute is written without secrets (``tasks.core.redact``: URLs reduced, tokens masked);
- every conditional write is recognisably its own (``WRITE_TOKEN``): when botocore retries a write whose
  response was lost after it landed, the retry finds its own token and reads APPLIED, never STALE, and an
  update is never applied twice (its condition requires another token).

The client reaches DynamoDB Local through boto3's own ``AWS_ENDPOINT_URL_DYNAMODB``; unset, it reaches AWS.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import Enum
from typing import Any

import boto3
from boto3.dynamodb.types import TypeDeserializer
from botocore.config import Config
from botocore.exceptions import ClientError

from tasks.core import faults
from tasks.core.errors import Unavailable
from tasks.core.redact import redact_attribute

BOTO_CONFIG = Config(retries={"mode": "adaptive", "max_attempts": 10}, max_pool_connections=64)

_local = threading.local()
log = logging.getLogger(__name__)
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
        resource.meta.client.meta.events.register(
            "needs-retry.dynamodb", _report_throttle, unique_id="pipelines-throttles"
        )
        _local.resource = resource
    return resource


# --------------------------------------------------------------------------- throttling, as the client sees it

THROTTLING_CODES = frozenset({"ThrottlingException", "ProvisionedThroughputExceededException", "RequestLimitExceeded"})
READ_OPERATIONS = frozenset({"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"})
THROTTLE_EVENT = "dynamodb.throttled"


def throttle_resource(kind: str, table_name: str) -> str:
    """The resource id of a table's throttled reads or writes (``kind``: read/write) in ``THROTTLE_EVENT``."""
    return f"dynamodb.{kind}.{table_name}"


def tables_in(request_body: bytes | str | None) -> list[str]:
    """The tables a DynamoDB request names (TableName, RequestItems' keys, TransactItems' TableName)."""
    try:
        body = json.loads(request_body or "{}")
    except ValueError:
        return []
    names = [body["TableName"]] if "TableName" in body else list(body.get("RequestItems", {}))
    names += [op["TableName"] for item in body.get("TransactItems", []) for op in item.values() if "TableName" in op]
    return sorted(set(names))


def _report_throttle(response=None, operation=None, request_dict=None, **_: Any) -> None:
    """botocore's needs-retry hook: a throttled attempt (retried by the adaptive mode, or the last one) becomes a
    Prefect event per table, which the throttle alarms count; it never decides the retry (returns None)."""
    if not response or operation is None:
        return None
    code = (response[1] or {}).get("Error", {}).get("Code")
    if code not in THROTTLING_CODES:
        return None
    kind = "read" if operation.name in READ_OPERATIONS else "write"
    try:
        from prefect.events import emit_event

        for name in tables_in((request_dict or {}).get("body")):
            emit_event(
                event=THROTTLE_EVENT,
                resource={
                    "prefect.resource.id": throttle_resource(kind, name),
                    "dynamodb.table": name,
                    "dynamodb.kind": kind,
                },
                payload={"operation": operation.name, "code": code},
            )
    except Exception:  # a report must never fail the request it reports on
        log.debug("throttle report failed", exc_info=True)
    return None


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


def _send(operation: str, target: str, request: Callable[..., Any], **kwargs: Any) -> Any:
    """Send one write request; the crash-point injector (``faults``, tests only) sits on either side of it."""
    if not faults.armed:
        return request(**kwargs)
    number = faults.before("dynamodb", operation, target)
    try:
        response = request(**kwargs)
    except ClientError:  # answered and refused (a failed condition): dying now is a crash after this write too
        faults.after(number, operation, target)
        raise
    faults.after(number, operation, target)
    return response


@contextlib.contextmanager
def _batch(operation: str, table_name: str, **kwargs: Any) -> Iterator[Any]:
    """boto3's batch_writer for ``table_name``, as one crash point (its flushes land together)."""
    number = faults.before("dynamodb", operation, table_name) if faults.armed else 0
    with table(table_name).batch_writer(**kwargs) as writer:
        yield writer
    if faults.armed:
        faults.after(number, operation, table_name)


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
        """Whether the write took effect."""
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

    def __and__(self, other: Condition) -> Condition:
        """Both conditions (their placeholders must differ)."""
        if set(self.names) & set(other.names) or set(self.values) & set(other.values):
            raise ValueError(f"conditions share placeholders: {self.expression!r} and {other.expression!r}")
        return Condition(
            f"({self.expression}) AND ({other.expression})",
            {**self.names, **other.names},
            {**self.values, **other.values},
        )


def unchanged(seen: Mapping[str, Any], tag: str = "u") -> Condition:
    """A condition that each attribute still has the value seen (None: still absent)."""
    parts, names, values = [], {}, {}
    for i, (attr, value) in enumerate(seen.items()):
        names[f"#{tag}{i}"] = attr
        if value is None:
            parts.append(f"attribute_not_exists(#{tag}{i})")
        else:
            values[f":{tag}{i}"] = value
            parts.append(f"#{tag}{i} = :{tag}{i}")
    return Condition(" AND ".join(parts), names, values)


WRITE_TOKEN = "write_token"  # set by every conditional Put/Update: whose write the item last took
_TOKEN_NAME, _TOKEN_VALUE = "#wtok", ":wtok"


def new_token() -> str:
    """A fresh write token (one per write request entry)."""
    return uuid.uuid4().hex


def with_token(operation: Mapping[str, Any], token: str) -> dict[str, Any]:
    """A copy of a Put or Update body that records ``token``; an Update also requires another token to be there.

    So a retry of an Update that already landed fails its condition instead of applying twice, and the item
    returned with the failure carries ``token``: the write was ours (``is_mine``).
    """
    body = dict(operation)
    if "Item" in body:
        body["Item"] = {**body["Item"], WRITE_TOKEN: token}
        return body
    update = body.get("UpdateExpression", "")
    setting = f"SET {_TOKEN_NAME} = {_TOKEN_VALUE}"
    body["UpdateExpression"] = (
        f"{setting}, {update[4:]}" if update.startswith("SET ") else f"{setting} {update}".strip()
    )
    fresh = f"(attribute_not_exists({_TOKEN_NAME}) OR {_TOKEN_NAME} <> {_TOKEN_VALUE})"
    condition = body.get("ConditionExpression")
    body["ConditionExpression"] = f"({condition}) AND {fresh}" if condition else fresh
    body["ExpressionAttributeNames"] = {**body.get("ExpressionAttributeNames", {}), _TOKEN_NAME: WRITE_TOKEN}
    body["ExpressionAttributeValues"] = {**body.get("ExpressionAttributeValues", {}), _TOKEN_VALUE: token}
    body["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    return body


def _hide(item: dict[str, Any] | None) -> dict[str, Any] | None:
    """``item`` without its write token: bookkeeping of this module, never part of what callers read."""
    if item:
        item.pop(WRITE_TOKEN, None)
    return item


def is_mine(item: Mapping[str, Any] | None, token: str) -> bool:
    """Whether ``item`` (as a failed condition returned it) carries ``token``: our own write already landed."""
    return bool(item) and item.get(WRITE_TOKEN) == token


def _is_conditional_failure(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def _from_raw(raw: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A wire-format item as Python values, write token included (for ``is_mine``), or None."""
    if not raw:
        return None
    return {k: _deserializer.deserialize(v) for k, v in raw.items()}


def item_from_raw(raw: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An item in DynamoDB's wire format (``{"S": ...}``, as in cancellation reasons) as Python values, or None."""
    return _hide(_from_raw(raw))


def _old_item(error: ClientError) -> dict[str, Any] | None:
    return _from_raw(error.response.get("Item"))


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
    """Python floats to Decimal (DynamoDB rejects float), recursively; reason attributes without secrets (redact)."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: to_dynamo(redact_attribute(k, v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_dynamo(v) for v in value]
    return value


# --------------------------------------------------------------------------- reads


def get_item(table_name: str, key: Mapping[str, Any], consistent: bool = True) -> dict[str, Any] | None:
    """One item by key (strongly consistent by default), or None."""
    return _hide(table(table_name).get_item(Key=dict(key), ConsistentRead=consistent).get("Item"))


def get_many(table_name: str, keys: Iterable[Mapping[str, Any]], consistent: bool = True) -> list[dict[str, Any]]:
    """The items that exist for ``keys``, strongly consistent by default: BatchGetItem, 100 keys a request, keys
    DynamoDB leaves unprocessed (throttling) asked again with backoff. Any order; absent keys are simply missing."""
    wanted = list({tuple(sorted(dict(key).items())): dict(key) for key in keys}.values())  # a duplicate is refused
    found: list[dict[str, Any]] = []
    for start in range(0, len(wanted), 100):  # BatchGetItem's limit
        request = {table_name: {"Keys": wanted[start : start + 100], "ConsistentRead": consistent}}
        for attempt in range(20):
            response = dynamodb().batch_get_item(RequestItems=request)
            found.extend(_hide(item) for item in response["Responses"].get(table_name, []))
            request = response.get("UnprocessedKeys") or {}
            if not request:
                break
            time.sleep(min(1.0, 0.02 * 2**attempt) * random.random())
        else:
            raise RuntimeError(f"DynamoDB left keys unprocessed 20 times in a row ({table_name})")
    return found


class IndexNotReady(Unavailable, RuntimeError):
    """A query needs a GSI that is not ACTIVE yet (a new version's index still building) after ``INDEX_WAIT_S``."""


INDEX_WAIT_S = 300.0  # how long a query waits for its index: `up` and the deploy wait for the backfill themselves
_NOT_READY = ("does not have the specified index", "backfilling global secondary index")


def _held_until_index_ready(request: Callable[..., dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    """One Query/Scan page; one on a GSI that does not exist yet or is backfilling waits for it, as long as
    ``INDEX_WAIT_S``, so code of a new version never reads a half-built index as if it were complete."""
    deadline = time.monotonic() + INDEX_WAIT_S
    while True:
        try:
            return request(**kwargs)
        except ClientError as error:
            message = error.response.get("Error", {}).get("Message", "")
            if "IndexName" not in kwargs or not any(words in message for words in _NOT_READY):
                raise
            if time.monotonic() > deadline:
                raise IndexNotReady(
                    f"{kwargs['IndexName']} is not ready after {INDEX_WAIT_S:.0f} s ({message}); "
                    "`make up` (or the AWS deploy) adds it"
                ) from error
            time.sleep(1.0)


def scan_page(
    table_name: str, start: Mapping[str, Any] | None = None, limit: int = 100
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """One page of a Scan from ``start`` (a LastEvaluatedKey): its items and the key to go on from (None: the end)."""
    kwargs: dict[str, Any] = {"Limit": limit, "ConsistentRead": True}
    if start:
        kwargs["ExclusiveStartKey"] = dict(start)
    page = table(table_name).scan(**kwargs)
    return [_hide(item) for item in page.get("Items", [])], page.get("LastEvaluatedKey")


def _pages(request: Callable[..., dict[str, Any]], **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Every page of a Query or Scan, following LastEvaluatedKey."""
    while True:
        page = _held_until_index_ready(request, **kwargs)
        yield page
        last = page.get("LastEvaluatedKey")
        if not last:
            return
        kwargs["ExclusiveStartKey"] = last


def query_all(
    table_name: str,
    keep: Callable[[dict[str, Any]], bool] | None = None,
    limit: int | None = None,
    **query: Any,
) -> Iterator[dict[str, Any]]:
    """Every item of a Query, following LastEvaluatedKey; ``keep`` filters in code (never on keys in DynamoDB)."""
    seen = 0
    for page in _pages(table(table_name).query, **query):
        for item in page.get("Items", []):
            _hide(item)
            if keep is None or keep(item):
                yield item
                seen += 1
                if limit is not None and seen >= limit:
                    return


def count(table_name: str, **query: Any) -> int:
    """How many items a Query matches (``Select=COUNT``, every page)."""
    return sum(page["Count"] for page in _pages(table(table_name).query, Select="COUNT", **query))


def scan_all(table_name: str, keep: Callable[[dict[str, Any]], bool] | None = None, **scan: Any) -> Iterator[dict]:
    """Every item of a Scan (maintenance only; access patterns use Query)."""
    for page in _pages(table(table_name).scan, **scan):
        for item in page.get("Items", []):
            _hide(item)
            if keep is None or keep(item):
                yield item


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
    token = new_token()
    kwargs: dict[str, Any] = dict(
        Item=to_dynamo({**item, WRITE_TOKEN: token}),
        ConditionExpression=expression,
        ExpressionAttributeNames=names,
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
    )
    if values:
        kwargs["ExpressionAttributeValues"] = to_dynamo(values)
    try:
        _send("put", table_name, table(table_name).put_item, **kwargs)
    except ClientError as error:
        if _is_conditional_failure(error):
            old = _old_item(error)
            if is_mine(old, token):  # our own put, retried after its response was lost
                return WriteResult(Outcome.APPLIED, dict(item))
            return WriteResult(Outcome.EXISTS if old is not None else Outcome.STALE, _hide(old))
        raise
    return WriteResult(Outcome.APPLIED, dict(item))


class Expression:
    """Placeholders for one request's expressions: ``name``/``value`` hand out ``#a``/``:v`` tokens.

    Every conditional write builds its expressions through this class, including the raw TransactItems
    entries other modules pack into transactions (``entry``), so placeholders are never written by hand.
    """

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def name(self, attr: str) -> str:
        """The placeholder for attribute ``attr`` (one per attribute)."""
        for placeholder, existing in self.names.items():
            if existing == attr:
                return placeholder
        placeholder = f"#a{len(self.names)}"
        self.names[placeholder] = attr
        return placeholder

    def value(self, value: Any) -> str:
        """A new placeholder for ``value`` (floats become Decimal)."""
        placeholder = f":v{len(self.values)}"
        self.values[placeholder] = to_dynamo(value)
        return placeholder

    def one_of(self, attr: str, options: str | Sequence[str]) -> str:
        """``attr = :v`` for one option, ``attr IN (...)`` for several."""
        options = [options] if isinstance(options, str) else list(options)
        if len(options) == 1:
            return f"{self.name(attr)} = {self.value(options[0])}"
        return f"{self.name(attr)} IN ({', '.join(self.value(o) for o in options)})"

    def update(
        self, sets: Mapping[str, Any] | None = None, adds: Mapping[str, Any] | None = None, removes: Sequence[str] = ()
    ) -> str:
        """An UpdateExpression: SET, ADD and REMOVE clauses for the given attributes."""
        parts = []
        if sets:
            parts.append(
                "SET " + ", ".join(f"{self.name(a)} = {self.value(redact_attribute(a, v))}" for a, v in sets.items())
            )
        if adds:
            parts.append("ADD " + ", ".join(f"{self.name(a)} {self.value(v)}" for a, v in adds.items()))
        if removes:
            parts.append("REMOVE " + ", ".join(self.name(a) for a in removes))
        return " ".join(parts)

    def status_condition(self, status_attr: str, expected: str | Sequence[str] | None, key: Mapping[str, Any]) -> str:
        """The transition guard: the status is one of ``expected`` (None: only "the item exists")."""
        if expected is None:
            return f"attribute_exists({self.name(next(iter(key)))})"
        return self.one_of(status_attr, expected)

    def with_condition(self, condition: Condition | None, expression: str) -> str:
        """``expression`` ANDed with an extra ``Condition`` (its placeholders merged in)."""
        if condition is None:
            return expression
        self.names.update(condition.names)
        self.values.update(to_dynamo(dict(condition.values)))
        return f"({expression}) AND ({condition.expression})"

    def entry(
        self, table_name: str, key: Mapping[str, Any], condition: str | None, update: str | None = None
    ) -> dict[str, Any]:
        """A TransactItems operation body: an Update when ``update`` is given, else a ConditionCheck."""
        operation: dict[str, Any] = {"TableName": table_name, "Key": dict(key)}
        if update is not None:
            operation["UpdateExpression"] = update
        if condition is not None:
            operation["ConditionExpression"] = condition
            operation["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        if self.names:
            operation["ExpressionAttributeNames"] = self.names
        if self.values:
            operation["ExpressionAttributeValues"] = self.values
        return operation


def transition(
    table_name: str,
    key: Mapping[str, Any],
    expected: str | Sequence[str] | None,
    new: str | None,
    *,
    status_attr: str = "status",
    set: Mapping[str, Any] | None = None,  # mirrors DynamoDB's SET
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
    expr = Expression()
    expression = expr.update(sets, dict(add or {}), list(remove))
    cond = expr.with_condition(condition, expr.status_condition(status_attr, expected, key))
    token = new_token()
    main = with_token(expr.entry(table_name, key, cond, expression), token)

    if not increments:
        kwargs = {k: v for k, v in main.items() if k != "TableName"}
        try:
            response = _send("update", table_name, table(table_name).update_item, ReturnValues="ALL_NEW", **kwargs)
        except ClientError as error:
            if _is_conditional_failure(error):
                old = _old_item(error)
                return WriteResult(Outcome.APPLIED if is_mine(old, token) else Outcome.STALE, _hide(old))
            raise
        return WriteResult(Outcome.APPLIED, _hide(response.get("Attributes")))

    items: list[dict[str, Any]] = [{"Update": main}]
    for inc in increments:
        counter = Expression()
        items.append({"Update": counter.entry(inc.table, inc.key, None, counter.update(adds=inc.amounts))})
    try:
        _send("transact", table_name, client().transact_write_items, TransactItems=items)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "TransactionCanceledException":
            reasons = error.response.get("CancellationReasons") or []
            if reasons and reasons[0].get("Code") == "ConditionalCheckFailed":
                current = _from_raw(reasons[0].get("Item"))
                outcome = Outcome.APPLIED if is_mine(current, token) else Outcome.STALE  # APPLIED: it had landed
                return WriteResult(outcome, _hide(current))
        raise
    return WriteResult(Outcome.APPLIED, get_item(table_name, key))


def put(table_name: str, item: Mapping[str, Any]) -> None:
    """Unconditional put, for append-only records (metrics) that no status depends on."""
    _send("put", table_name, table(table_name).put_item, Item=to_dynamo(dict(item)))


def batch_put(table_name: str, items: Iterable[Mapping[str, Any]], key_names: Sequence[str] | None = None) -> int:
    """Write many items; boto3's batch_writer retries UnprocessedItems. Returns the count written."""
    count = 0
    kwargs = {"overwrite_by_pkeys": list(key_names)} if key_names else {}
    with _batch("batch_put", table_name, **kwargs) as writer:
        for item in items:
            writer.put_item(Item=to_dynamo(dict(item)))
            count += 1
    return count


def batch_delete(table_name: str, keys: Iterable[Mapping[str, Any]]) -> int:
    """Delete many items by key; unprocessed items are retried by batch_writer. Returns the count."""
    count = 0
    with _batch("batch_delete", table_name) as writer:
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
        response = _send("delete", table_name, table(table_name).delete_item, **kwargs)
    except ClientError as error:
        if _is_conditional_failure(error):
            return WriteResult(Outcome.STALE, _hide(_old_item(error)))
        raise
    return WriteResult(Outcome.APPLIED, _hide(response.get("Attributes")))


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


def _entry_table(entries: Sequence[Mapping[str, Any]]) -> str:
    """The table a transaction writes (the first entry's), for crash-point logs."""
    return next(iter(entries[0].values()))["TableName"]


# DynamoDB's 4 MB per TransactWriteItems, less room for what the estimate below does not see
TRANSACTION_BYTES = 4 * 1024 * 1024 - 64 * 1024


def _entry_bytes(entry: Mapping[str, Any]) -> int:
    """An upper bound of what one TransactItems entry adds to a transaction's payload (its JSON length)."""
    return len(json.dumps(entry, default=str))


def _next_batch(pending: list[int], groups: Sequence[Sequence[Mapping[str, Any]]]) -> list[int]:
    """Groups for the next transaction: in order, <= 100 entries and <= TRANSACTION_BYTES, no item twice; a
    group touching an item that an earlier pending group also touches waits for it, so writes to one item keep
    their order."""
    batch, used, blocked, size, nbytes = [], set(), set(), 0, 0
    for index in pending:
        ids = [_entry_id(entry) for entry in groups[index]]
        more = sum(_entry_bytes(entry) for entry in groups[index])
        full = size + len(ids) > TRANSACTION_LIMIT or (batch and nbytes + more > TRANSACTION_BYTES)
        if full or used.intersection(ids) or blocked.intersection(ids):
            blocked.update(ids)
            continue
        batch.append(index)
        used.update(ids)
        size += len(ids)
        nbytes += more
    return batch


def _tokened(entry: Mapping[str, Any], token: str) -> dict[str, Any]:
    """The TransactItems entry with ``token`` on its Update or conditional Put (an append-only Put needs none)."""
    return {
        kind: with_token(body, token) if kind == "Update" or kind == "Put" and "ConditionExpression" in body else body
        for kind, body in entry.items()
    }


def transact_groups(groups: Sequence[Sequence[Mapping[str, Any]]]) -> list[list[dict[str, Any]] | None]:
    """Apply groups of TransactItems entries (Put/Update/Delete/ConditionCheck), each group all-or-nothing.

    Groups are packed into transactions of up to 100 entries. A transaction is all-or-nothing, so when some
    conditions fail the cancellation reasons say which groups lost; the others are sent again. Conflicts
    with concurrent transactions are retried with jittered backoff. Returns, per group, None when it was
    applied, else its cancellation reasons (each with the item as it stands, ``ALL_OLD``, raw).
    """
    tokens = [[new_token() for _ in group] for group in groups]
    groups = [[_tokened(entry, token) for entry, token in zip(group, ts)] for group, ts in zip(groups, tokens)]

    def landed(index: int, reasons: Sequence[Mapping[str, Any]]) -> bool:
        """Whether group ``index``'s write had landed (a retry found its own token): then it was applied."""
        return any(is_mine(_from_raw(r.get("Item")), t) for r, t in zip(reasons, tokens[index]))

    results: list[Any] = [False] * len(groups)  # False: not decided yet
    pending = list(range(len(groups)))
    conflicts = 0
    while pending:
        batch = _next_batch(pending, groups)
        only = groups[batch[0]] if len(batch) == 1 else None
        if only is not None and len(only) == 1 and "Update" in only[0]:  # one update: no transaction needed
            try:
                _send("update", only[0]["Update"]["TableName"], client().update_item, **only[0]["Update"])
                results[batch[0]] = None
            except ClientError as error:
                if not _is_conditional_failure(error):
                    raise
                reasons = [{"Code": "ConditionalCheckFailed", "Item": error.response.get("Item")}]
                results[batch[0]] = None if landed(batch[0], reasons) else reasons
        else:
            try:
                entries = [entry for i in batch for entry in groups[i]]
                _send("transact", _entry_table(entries), client().transact_write_items, TransactItems=entries)
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                    raise
                reasons = error.response.get("CancellationReasons") or []
                position, failed = 0, False
                for index in batch:
                    mine = reasons[position : position + len(groups[index])]
                    position += len(groups[index])
                    if any(r.get("Code") == "ConditionalCheckFailed" for r in mine):
                        results[index] = None if landed(index, mine) else mine
                        failed = True
                if any(r.get("Code") == "ValidationError" for r in reasons):
                    raise  # an item DynamoDB refuses (e.g. over 400 KB): sending it again cannot succeed
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


def _run_each(
    operations: list[dict[str, Any]], lost: Outcome, also: Sequence[Sequence[Mapping[str, Any]]] = ()
) -> list[WriteResult]:
    """One conditional write per operation at transaction throughput; ``lost`` (or STALE if absent) when its condition
    fails. ``also[i]`` (if given) are entries that land in the same transaction as operation ``i``, or not at all."""
    groups = [[operation, *(also[i] if i < len(also) else ())] for i, operation in enumerate(operations)]
    results = []
    for reasons in transact_groups(groups):
        if reasons is None:
            results.append(WriteResult(Outcome.APPLIED, None))
            continue
        current = item_from_raw(reasons[0].get("Item"))
        results.append(WriteResult(lost if current is not None else Outcome.STALE, current))
    return results


def create_many_if_absent(
    table_name: str, items: Sequence[Mapping[str, Any]], key_names: Sequence[str]
) -> list[WriteResult]:
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
    also: Sequence[Sequence[Mapping[str, Any]]] = (),
    remove: Sequence[str] = (),
    conditions: Sequence[Condition | None] = (),
) -> list[WriteResult]:
    """``transition`` for many items: each change is (key, expected, new, extra SET attributes); ``remove``:
    attributes every change REMOVEs.

    Every item moves only if it is still in its expected state (and ``conditions[i]``, when given, holds for
    change ``i``); one result per change, in order. ``also[i]`` are TransactItems entries (e.g. ``put_entry``)
    written with change ``i`` in one transaction, so they land once with it (a retried transition that finds
    itself done writes them no second time).
    """
    return _run_each(_transition_entries(table_name, changes, status_attr, remove, conditions), Outcome.STALE, also)


def _transition_entries(
    table_name: str,
    changes: Sequence[tuple[Mapping[str, Any], str | Sequence[str] | None, str | None, Mapping[str, Any] | None]],
    status_attr: str = "status",
    remove: Sequence[str] = (),
    conditions: Sequence[Condition | None] = (),
) -> list[dict[str, Any]]:
    """The guarded TransactItems Updates of ``transition_many``'s changes, in order."""
    operations = []
    for i, (key, expected, new, sets) in enumerate(changes):
        all_sets = dict(sets or {})
        if new is not None:
            all_sets[status_attr] = new
        expr = Expression()
        update = expr.update(all_sets, None, list(remove))
        extra = conditions[i] if i < len(conditions) else None
        guard = expr.with_condition(extra, expr.status_condition(status_attr, expected, key))
        operations.append({"Update": expr.entry(table_name, key, guard, update)})
    return operations


def transition_entry(
    table_name: str,
    key: Mapping[str, Any],
    expected: str | Sequence[str] | None,
    new: str | None,
    sets: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One change as a guarded TransactItems Update (``transition``'s guard), to land with another table's change
    in one transaction (``transition_all``'s ``also``)."""
    return _transition_entries(table_name, [(key, expected, new, sets)])[0]


def transition_all(
    table_name: str,
    changes: Sequence[tuple[Mapping[str, Any], str | Sequence[str] | None, str | None, Mapping[str, Any] | None]],
    *,
    also: Sequence[Mapping[str, Any]] = (),
    conditions: Sequence[Condition | None] = (),
) -> bool:
    """``transition_many``'s changes and the ``also`` entries in ONE transaction: all land or none does (one
    request where ``transition_many`` may need several). True when they landed; False when any condition failed
    and nothing was written (the caller learns no more: it reads what stands and goes on item by item).
    Raises ValueError past one transaction's ``TRANSACTION_LIMIT`` entries."""
    entries = [*_transition_entries(table_name, changes, conditions=conditions), *also]
    if len(entries) > TRANSACTION_LIMIT:
        raise ValueError(f"{len(entries)} entries do not fit one transaction ({TRANSACTION_LIMIT})")
    (reasons,) = transact_groups([entries])
    return reasons is None


def put_entry(table_name: str, item: Mapping[str, Any]) -> dict[str, Any]:
    """A TransactItems Put of ``item`` with no condition (an append-only row: it lands with its transaction)."""
    return {"Put": {"TableName": table_name, "Item": to_dynamo(dict(item))}}
