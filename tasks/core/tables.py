"""How a DynamoDB table is declared and made: keys, GSIs and TTL attribute, created if missing, refused if different.

Each pipeline declares its tables, with the seeds' exact names, keys, GSIs and TTL attributes, in its
``pipeline.py`` (``tasks.core.registry``). Table names are configurable (``blocks.DynamoTables``, env
``TABLE_<LOGICAL_NAME>``); the seed names are the defaults. ``ensure_tables`` creates what is missing and refuses a
table whose keys differ, showing the difference; it never drops or rewrites a table.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
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
    """A table exists with other keys than the project's; it is left untouched."""


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


def schema_differences(name: str, spec: TableSpec, description: dict) -> list[str]:
    """What differs between an existing table's description and ``spec`` (empty when they agree)."""
    diffs = []
    want = {(k, t) for k, t in spec.key_schema()}
    have = {(k["AttributeName"], k["KeyType"]) for k in description["KeySchema"]}
    if want != have:
        diffs.append(f"{name}: key schema is {sorted(have)}, expected {sorted(want)}")
    types = {a["AttributeName"]: a["AttributeType"] for a in description.get("AttributeDefinitions", [])}
    for attr, _ in spec.key_schema():
        expected_type = spec.key_types.get(attr, "S")
        if attr in types and types[attr] != expected_type:
            diffs.append(f"{name}: key {attr} has type {types[attr]}, expected {expected_type}")
    have_gsis = {
        g["IndexName"]: {(k["AttributeName"], k["KeyType"]) for k in g["KeySchema"]}
        for g in description.get("GlobalSecondaryIndexes", [])
    }
    for index in spec.gsis:
        want_keys = {(index.hash_key, "HASH")} | ({(index.range_key, "RANGE")} if index.range_key else set())
        if index.name not in have_gsis:
            diffs.append(f"{name}: GSI {index.name} is missing")
        elif have_gsis[index.name] != want_keys:
            diffs.append(
                f"{name}: GSI {index.name} keys are {sorted(have_gsis[index.name])}, expected {sorted(want_keys)}"
            )
    return diffs


def ensure_table(name: str, spec: TableSpec) -> str:
    """Create ``name`` if missing (waiting until ACTIVE), check it if present. Returns 'created' or 'exists'."""
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
    diffs = schema_differences(name, spec, description)
    if diffs:
        raise SchemaMismatch(
            "Refusing to use a table whose schema differs (nothing was changed or dropped):\n  " + "\n  ".join(diffs)
        )
    _ensure_ttl(name, spec)
    return "exists"


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
    'created'/'exists'."""
    return {names[logical]: ensure_table(names[logical], spec) for logical, spec in specs.items()}
