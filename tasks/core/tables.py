"""How a DynamoDB table is declared and made: keys, GSIs and TTL attribute, created if missing, refused if different.

Each pipeline declares its tables, with the seeds' exact names, keys, GSIs and TTL attributes, in its
``pipeline.py`` (``tasks.core.registry``). Table names are configurable (``blocks.DynamoTables``, env
``TABLE_<LOGICAL_NAME>``); the seed names are the defaults. ``ensure_tables`` creates what is missing, adds what
DynamoDB adds to a live table (a new GSI, one at a time, waited for until backfilled; a TTL attribute), and refuses
what it cannot change in place (key schema, key types, an index's keys) with the steps that move the items to a
table of the new schema; it never drops or rewrites a table.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from tasks.core import state_store
from tasks.core.errors import PipelineError


@dataclass(frozen=True)
class Index:
    name: str
    hash_key: str
    range_key: str | None = None


@dataclass(frozen=True)
class TableSpec:
    """Key schema of one table (all key attributes are strings, as in the seeds)."""

    hash_key: str
    range_key: str | None = None
    gsis: tuple[Index, ...] = ()
    ttl_attribute: str | None = None
    # attribute types other than S for key attributes (none of the seeds needs it except the metrics table)
    key_types: dict[str, str] = field(default_factory=dict)

    def key_schema(self) -> list[tuple[str, str]]:
        """(attribute, ``HASH``/``RANGE``) pairs of the table's primary key."""
        schema = [(self.hash_key, "HASH")]
        if self.range_key:
            schema.append((self.range_key, "RANGE"))
        return schema


class SchemaMismatch(PipelineError, RuntimeError):
    """A table exists with other keys than the project's; it is left untouched, and the message says the steps."""


def create_request(name: str, spec: TableSpec) -> dict:
    attrs = {k: spec.key_types.get(k, "S") for k, _ in spec.key_schema()}
    gsis = []
    for index in spec.gsis:
        schema = [{"AttributeName": index.hash_key, "KeyType": "HASH"}]
        attrs.setdefault(index.hash_key, spec.key_types.get(index.hash_key, "S"))
        if index.range_key:
            schema.append({"AttributeName": index.range_key, "KeyType": "RANGE"})
            attrs.setdefault(index.range_key, spec.key_types.get(index.range_key, "S"))
        gsis.append({"IndexName": index.name, "KeySchema": schema, "Projection": {"ProjectionType": "ALL"}})
    request = {
        "TableName": name,
        "KeySchema": [{"AttributeName": k, "KeyType": t} for k, t in spec.key_schema()],
        "AttributeDefinitions": [{"AttributeName": k, "AttributeType": t} for k, t in attrs.items()],
        "BillingMode": "PAY_PER_REQUEST",
    }
    if gsis:
        request["GlobalSecondaryIndexes"] = gsis
    return request


@dataclass(frozen=True)
class SchemaChanges:
    """How an existing table differs from its spec: what DynamoDB adds online, and what it cannot change in place."""

    new_indexes: tuple[Index, ...] = ()  # UpdateTable GlobalSecondaryIndexUpdates Create, one at a time
    ttl_missing: bool = False  # UpdateTimeToLive
    refused: tuple[str, ...] = ()  # key schema, key types, an index's keys, another TTL attribute


def index_keys(index: Index) -> set[tuple[str, str]]:
    return {(index.hash_key, "HASH")} | ({(index.range_key, "RANGE")} if index.range_key else set())


def schema_changes(name: str, spec: TableSpec, description: dict, ttl: dict | None = None) -> SchemaChanges:
    """Compare an existing table's ``description`` (and its ``ttl`` description, when read) with ``spec``."""
    refused = []
    want = set(spec.key_schema())
    have = {(k["AttributeName"], k["KeyType"]) for k in description["KeySchema"]}
    if want != have:
        refused.append(f"{name}: key schema is {sorted(have)}, expected {sorted(want)}")
    types = {a["AttributeName"]: a["AttributeType"] for a in description.get("AttributeDefinitions", [])}
    key_attributes = [attr for attr, _ in spec.key_schema()]
    key_attributes += [attr for index in spec.gsis for attr, _ in index_keys(index)]
    for attr in dict.fromkeys(key_attributes):
        expected_type = spec.key_types.get(attr, "S")
        if attr in types and types[attr] != expected_type:
            refused.append(f"{name}: key {attr} has type {types[attr]}, expected {expected_type}")
    have_gsis = {
        g["IndexName"]: {(k["AttributeName"], k["KeyType"]) for k in g["KeySchema"]}
        for g in description.get("GlobalSecondaryIndexes", [])
    }
    new_indexes = []
    for index in spec.gsis:
        if index.name not in have_gsis:
            new_indexes.append(index)
        elif have_gsis[index.name] != index_keys(index):
            have_keys, want_keys = sorted(have_gsis[index.name]), sorted(index_keys(index))
            refused.append(f"{name}: GSI {index.name} keys are {have_keys}, expected {want_keys}")
    ttl_missing = False
    if spec.ttl_attribute and ttl is not None:
        enabled = ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
        if enabled and ttl.get("AttributeName") not in (None, spec.ttl_attribute):
            refused.append(f"{name}: TTL attribute is {ttl['AttributeName']}, expected {spec.ttl_attribute}")
        ttl_missing = not enabled
    return SchemaChanges(tuple(new_indexes), ttl_missing, tuple(refused))


def schema_differences(name: str, spec: TableSpec, description: dict) -> list[str]:
    """What differs between an existing table's description and ``spec`` (empty when they agree)."""
    changes = schema_changes(name, spec, description)
    return [*changes.refused, *(f"{name}: GSI {index.name} is missing" for index in changes.new_indexes)]


def refusal(name: str, logical: str | None, refused: Sequence[str]) -> str:
    """The refusal of a change DynamoDB cannot make in place: what differs, and the steps that make it."""
    variable = f"TABLE_{(logical or 'LOGICAL_NAME').upper()}"
    logical = logical or "LOGICAL_NAME"
    new = f"{name}-2"
    return (
        f"Refusing to use table {name}: its schema differs in a way DynamoDB cannot change in place (nothing was "
        "changed or dropped):\n  " + "\n  ".join(refused) + "\n"
        "To move its items to a table of the new schema:\n"
        "  1. make down                       # stop every writer of the table\n"
        f"  2. pipelines migrate copy-table {logical} {new}\n"
        f"     # creates {new} with the new schema and copies every item (resumable: run it again after a crash)\n"
        f"  3. export {variable}={new}   # or set it in the DynamoTables block; then: make up\n"
        f"  4. once the stack runs on {new}: aws dynamodb delete-table --table-name {name}\n"
        "In AWS: deploy the stack with the table renamed (a new name lets CloudFormation create it beside the old), "
        "run step 2 with the AWS credentials, then delete the old table as in step 4."
    )


def ensure_table(name: str, spec: TableSpec, logical: str | None = None, wait_s: float = 3600.0) -> str:
    """Create ``name`` if missing (waiting until ACTIVE); else add what DynamoDB adds online (each new GSI, one after
    another, waiting for its backfill; the TTL) or refuse what it cannot change, with the steps.
    Returns 'created', 'exists' or 'updated (…)'."""
    client = state_store.client()
    try:
        description = client.describe_table(TableName=name)["Table"]
    except ClientError as error:
        if error.response["Error"]["Code"] != "ResourceNotFoundException":
            raise
        try:
            client.create_table(**create_request(name, spec))
        except ClientError as create_error:  # another process created it first
            if create_error.response["Error"]["Code"] != "ResourceInUseException":
                raise
        client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
        _ensure_ttl(name, spec)
        return "created"
    ttl = client.describe_time_to_live(TableName=name)["TimeToLiveDescription"] if spec.ttl_attribute else None
    changes = schema_changes(name, spec, description, ttl)
    if changes.refused:
        raise SchemaMismatch(refusal(name, logical, changes.refused))
    wait_for_indexes(name, wait_s)  # one an earlier `up` began
    for index in changes.new_indexes:
        add_index(name, spec, index, wait_s)
    if changes.ttl_missing:
        _ensure_ttl(name, spec)
    added = [f"GSI {index.name}" for index in changes.new_indexes] + (["TTL"] if changes.ttl_missing else [])
    return f"updated ({', '.join(added)})" if added else "exists"


def add_index(name: str, spec: TableSpec, index: Index, wait_s: float) -> None:
    """Create one GSI on a live table and wait until it is ACTIVE and backfilled (DynamoDB creates one at a time)."""
    client = state_store.client()
    attributes = [
        {"AttributeName": attr, "AttributeType": spec.key_types.get(attr, "S")} for attr, _ in index_keys(index)
    ]
    schema = [{"AttributeName": index.hash_key, "KeyType": "HASH"}]
    if index.range_key:
        schema.append({"AttributeName": index.range_key, "KeyType": "RANGE"})
    create = {"IndexName": index.name, "KeySchema": schema, "Projection": {"ProjectionType": "ALL"}}
    try:
        client.update_table(
            TableName=name, AttributeDefinitions=attributes, GlobalSecondaryIndexUpdates=[{"Create": create}]
        )
    except ClientError as error:  # another `up` is creating it, or it was made since the describe
        message = error.response["Error"].get("Message", "")
        if error.response["Error"]["Code"] not in ("ResourceInUseException", "ValidationException") or (
            "already exists" not in message and "in progress" not in message.lower()
        ):
            raise
    wait_for_indexes(name, wait_s)


def wait_for_indexes(name: str, wait_s: float, poll_s: float = 1.0) -> None:
    """Wait until the table and every GSI of it is ACTIVE, none backfilling; PipelineError after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        table = state_store.client().describe_table(TableName=name)["Table"]
        building = [
            f"{g['IndexName']} {g.get('IndexStatus')}{' backfilling' if g.get('Backfilling') else ''}"
            for g in table.get("GlobalSecondaryIndexes", [])
            if g.get("IndexStatus") != "ACTIVE" or g.get("Backfilling")
        ]
        if table.get("TableStatus") == "ACTIVE" and not building:
            return
        if time.monotonic() > deadline:
            raise PipelineError(f"{name}: indexes still building after {wait_s:.0f} s: {', '.join(building)}")
        time.sleep(poll_s)


def _ensure_ttl(name: str, spec: TableSpec) -> None:
    if not spec.ttl_attribute:
        return
    client = state_store.client()
    status = client.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
    if status.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
        return
    for _ in range(5):
        try:
            client.update_time_to_live(
                TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": spec.ttl_attribute}
            )
            return
        except ClientError as error:  # table still settling
            if error.response["Error"]["Code"] not in ("ResourceInUseException", "ValidationException"):
                raise
            time.sleep(0.5)


def ensure_tables(specs: Mapping[str, TableSpec], names: Mapping[str, str]) -> dict[str, str]:
    """Create or check every table of ``specs`` by its name in ``names`` (logical -> physical). Returns physical ->
    'created'/'exists'/'updated (…)'; a refused table stops it (the tables before it are made)."""
    return {names[logical]: ensure_table(names[logical], spec, logical) for logical, spec in specs.items()}
