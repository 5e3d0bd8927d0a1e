"""The merged Parquet as a table a query engine finds: one partition per date (seed 001's Glue Data Catalog).

Every store gets a small catalog of its own, one JSON entry per date under ``pipeline/catalog/{table}/`` (the
date's location and columns), which ``open_table`` turns into one ``pyarrow.dataset`` over every registered date
(``date_prefix`` a partition column, as Athena sees it). An ``s3://`` output store is also registered in the Glue
Data Catalog: database and table created if absent, the date added as a partition. Registering a date again
changes nothing unless its columns grew. A registration that fails leaves the date a ``CATALOG#`` record
(``unregistered``, with the reason): the ``etl-catalog-unregistered`` alarm until a retry registers it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa
from boto3.dynamodb.conditions import Key

from tasks.core import keys, state_store
from tasks.core.config import table_name
from tasks.core.object_store import ObjectNotFound, ObjectStore, S3Store
from tasks.core.runtime import now_iso
from tasks.etl import keys as etl_keys
from tasks.etl.ingest import STATUS_INDEX, TRACKING, TRACKING_KEYS, settings, store, tracking_key

log = logging.getLogger(__name__)

PARTITION_KEY = "date_prefix"
_PARQUET_SERDE = "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe"
_PARQUET_IN = "org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat"
_PARQUET_OUT = "org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat"


# --------------------------------------------------------------------------- what a date holds


def partition_files(target: ObjectStore, date_prefix: str) -> list[str]:
    """The published Parquet parts of a date, sorted (a local write's hidden temp file is not one)."""
    prefix = etl_keys.merged_output_prefix(date_prefix)
    return sorted(k for k in target.list(prefix) if k.endswith(".parquet") and not k[len(prefix) :].startswith("."))


def _schema(target: ObjectStore, files: list[str]) -> pa.Schema:
    """The files' columns unified (first-seen order; an all-null column takes the others' type)."""
    import pyarrow.parquet as pq

    fs = target.arrow_filesystem()
    schemas = [pq.read_schema(target.arrow_path(k), filesystem=fs) for k in files]
    unified = pa.unify_schemas(schemas, promote_options="permissive") if schemas else pa.schema([])
    if PARTITION_KEY in unified.names:  # the partition column would hide it: the rows keep it in their files
        log.warning("an input field is named %r like the partition column; the table leaves it out", PARTITION_KEY)
        unified = unified.remove(unified.get_field_index(PARTITION_KEY))
    return pa.schema([f.with_type(pa.string()) if pa.types.is_null(f.type) else f for f in unified])


# --------------------------------------------------------------------------- registering a date


def register_partition(date_prefix: str, output_url: str = "", added: list[str] | None = None) -> dict[str, Any]:
    """Record the date's merged output as a partition (local catalog entry; Glue too on S3); idempotent.

    ``added``: the part keys a publish just added. When they bring no column the date's entry lacks, the entry
    stands and only they are read, so a publish costs the same on a date's ten-thousandth manifest as on its first
    (reading every part's schema grows with the date); otherwise, and without ``added``, every part of the date is
    read, so the entry is rebuilt whole whenever it changes (``etl register`` rebuilds it on demand)."""
    config = settings()
    target = store(output_url or config.output_store_url)
    table = config.catalog_table
    location = target.url_for(etl_keys.merged_output_prefix(date_prefix))
    key = etl_keys.catalog_partition_key(table, date_prefix)
    try:
        before = json.loads(target.get_bytes(key))
    except ObjectNotFound:
        before = None
    known = before is not None and added is not None and before.get("location") == location
    if known and set(_schema(target, sorted(added)).names) <= set(before["columns"]):
        columns = before["columns"]
    else:
        columns = _schema(target, partition_files(target, date_prefix)).names
    entry = {"table": table, PARTITION_KEY: date_prefix, "location": location, "columns": columns}
    changed = before != entry
    if changed:
        target.put_bytes(key, json.dumps(entry, indent=2).encode())
    glue = (
        register_glue_partition(target, config.catalog_database, table, date_prefix, location, columns)
        if isinstance(target, S3Store)
        else None
    )
    return {**entry, "changed": changed, "glue": glue}


def register_logged(date_prefix: str, output_url: str = "", added: list[str] | None = None) -> dict[str, Any]:
    """``register_partition``; a failure is returned rather than raised (the output is published either way) and
    recorded: the date's ``CATALOG#`` record (``record_unregistered``) raises ``etl-catalog-unregistered`` until a
    registration succeeds (``ndjson-flush-orphans`` retries it, ``etl register`` too)."""
    try:
        return register_partition(date_prefix, output_url, added)
    except Exception as error:  # noqa: BLE001 - a catalog outage must not fail (and so unpublish) a merged manifest
        reason = f"{type(error).__name__}: {error}"[:1000]
        log.error("partition %s not registered in the catalog: %s", date_prefix, reason)
        record_unregistered(date_prefix, reason)
        return {PARTITION_KEY: date_prefix, "error": reason}


# --------------------------------------------------------------------------- a failed registration, until it is not


UNREGISTERED = "unregistered"  # a CATALOG# record's status: its date's output is published, not in the catalog


def _record_key(date_prefix: str) -> dict[str, str]:
    return tracking_key(keys.safe_date(date_prefix), etl_keys.catalog_record_key(settings().catalog_table))


def record_unregistered(date_prefix: str, reason: str) -> dict[str, Any]:
    """The date's ``CATALOG#`` record made (or kept) ``unregistered`` with this reason and time: what the alarm
    reads and the retries clear."""
    table, key, stamp = table_name(TRACKING), _record_key(date_prefix), now_iso()
    sets = {"error_message": reason[:1000], "failed_at": stamp, "updated_at": stamp}
    item = {**key, "status": UNREGISTERED, "created_at": stamp, "failures": 1, **sets}
    result = state_store.create_if_absent(table, item, TRACKING_KEYS)
    if not result.applied:
        result = state_store.transition(table, key, None, UNREGISTERED, set=sets, add={"failures": 1})
    return state_store.to_plain(result.item or item)


def unregistered_dates() -> list[dict[str, Any]]:
    """The ``CATALOG#`` records still ``unregistered`` (``status-index``), by date."""
    found = state_store.query_all(
        table_name(TRACKING),
        keep=lambda item: item["file_key"].startswith(etl_keys.CATALOG_RECORD_PREFIX),
        IndexName=STATUS_INDEX,
        KeyConditionExpression=Key("status").eq(UNREGISTERED),
    )
    return sorted((state_store.to_plain(item) for item in found), key=lambda item: item["date_prefix"])


def register_again(date_prefix: str, output_url: str = "") -> dict[str, Any]:
    """``register_partition`` (raising as it does), then the date's record of a failed registration removed: only
    the failure read before (one recorded since stays, for the next retry)."""
    table, key = table_name(TRACKING), _record_key(date_prefix)
    seen = state_store.get_item(table, key)
    result = register_partition(date_prefix, output_url)
    if seen is not None:
        state_store.delete_if(table, key, state_store.unchanged({"failed_at": seen.get("failed_at")}))
    return {**result, "cleared": seen is not None}


def retry_unregistered(output_url: str = "") -> dict[str, Any]:
    """Every date left ``unregistered`` registered again: those now registered (record removed) and those still
    failing (the record takes the new reason)."""
    registered, failing = [], {}
    for item in unregistered_dates():
        date = item["date_prefix"]
        try:
            register_again(date, output_url)
            registered.append(date)
        except Exception as error:  # noqa: BLE001 - recorded with its reason, still alarmed; the other dates go on
            failing[date] = record_unregistered(date, f"{type(error).__name__}: {error}")["error_message"]
    return {"registered": registered, "still_failing": failing}


def registered_partitions(output_url: str = "") -> list[dict[str, Any]]:
    """The catalog's partition entries, by date."""
    config = settings()
    target = store(output_url or config.output_store_url)
    found = []
    for key in sorted(target.list(etl_keys.catalog_table_prefix(config.catalog_table))):
        etl_keys.catalog_partition_date(key)
        found.append(json.loads(target.get_bytes(key)))
    return found


# --------------------------------------------------------------------------- reading the table


def open_table(output_url: str = "", dates: list[str] | None = None):
    """A ``pyarrow.dataset`` over every registered date's Parquet (or only ``dates``), ``date_prefix`` a column."""
    import pyarrow.dataset as ds

    target = store(output_url or settings().output_store_url)
    chosen = [p[PARTITION_KEY] for p in registered_partitions(output_url) if dates is None or p[PARTITION_KEY] in dates]
    files = [(date, key) for date in chosen for key in partition_files(target, date)]
    schema = _schema(target, [key for _, key in files]).append(pa.field(PARTITION_KEY, pa.string()))
    return ds.FileSystemDataset.from_paths(
        [target.arrow_path(key) for _, key in files],
        schema=schema,
        format=ds.ParquetFileFormat(),
        filesystem=target.arrow_filesystem(),
        partitions=[ds.field(PARTITION_KEY) == date for date, _ in files],
    )


def query(
    dates: list[str] | None = None,
    columns: list[str] | None = None,
    limit: int | None = None,
    sql: str | None = None,
    output_url: str = "",
) -> list[dict[str, Any]]:
    """Rows of the table: ``columns`` of ``dates`` (all by default), at most ``limit``; or a DuckDB ``sql`` over it
    (the table named as ``ETL_CATALOG_TABLE``; needs the ``duckdb`` package)."""
    for date in dates or []:
        keys.safe_date(date)
    dataset = open_table(output_url, dates)
    if sql:
        try:
            import duckdb
        except ImportError:
            raise RuntimeError("--sql needs the duckdb package; use --date/--columns/--limit without it") from None
        connection = duckdb.connect()
        connection.register(settings().catalog_table, dataset)
        result = connection.execute(sql)
        names = [column[0] for column in result.description]
        return [dict(zip(names, row)) for row in result.fetchall()]
    missing = sorted(set(columns or []) - set(dataset.schema.names))
    if missing:
        raise ValueError(f"no column {', '.join(missing)} in the table (columns: {', '.join(dataset.schema.names)})")
    if limit is not None:
        return dataset.head(limit, columns=columns).to_pylist()
    return dataset.to_table(columns=columns).to_pylist()


# --------------------------------------------------------------------------- the Glue Data Catalog


def _storage(location: str, columns: list[str]) -> dict[str, Any]:
    return {
        "Columns": [{"Name": name, "Type": "string"} for name in columns],
        "Location": location,
        "InputFormat": _PARQUET_IN,
        "OutputFormat": _PARQUET_OUT,
        "SerdeInfo": {"SerializationLibrary": _PARQUET_SERDE},
    }


def register_glue_partition(
    target: S3Store, database: str, table: str, date_prefix: str, location: str, columns: list[str]
) -> dict[str, Any]:
    """Database and table created if absent (table columns widened to include ``columns``), then the date's
    partition created, or its columns widened; an existing partition with these columns is left as it is."""
    glue = target.service_client("glue")  # AWS_ENDPOINT_URL_GLUE honoured
    try:
        glue.create_database(DatabaseInput={"Name": database, "Description": "seed 001: merged NDJSON as Parquet"})
    except glue.exceptions.AlreadyExistsException:
        pass
    root = target.url_for(etl_keys.OUTPUT_PREFIX)
    try:
        known = glue.get_table(DatabaseName=database, Name=table)["Table"]["StorageDescriptor"]["Columns"]
    except glue.exceptions.EntityNotFoundException:
        known = None
    table_columns = [c["Name"] for c in known or []]
    wider = table_columns + [c for c in columns if c not in table_columns]
    if known is None or wider != table_columns:
        table_input = {
            "Name": table,
            "TableType": "EXTERNAL_TABLE",
            "Parameters": {"classification": "parquet", "EXTERNAL": "TRUE"},
            "PartitionKeys": [{"Name": PARTITION_KEY, "Type": "string"}],
            "StorageDescriptor": _storage(root, wider),
        }
        try:
            if known is None:
                glue.create_table(DatabaseName=database, TableInput=table_input)
            else:
                glue.update_table(DatabaseName=database, TableInput=table_input)
        except glue.exceptions.AlreadyExistsException:  # another merge created it just now
            glue.update_table(DatabaseName=database, TableInput=table_input)
    partition = {"Values": [date_prefix], "StorageDescriptor": _storage(location, columns)}
    try:
        glue.create_partition(DatabaseName=database, TableName=table, PartitionInput=partition)
        created = True
    except glue.exceptions.AlreadyExistsException:
        current = glue.get_partition(DatabaseName=database, TableName=table, PartitionValues=[date_prefix])["Partition"]
        have = [c["Name"] for c in current["StorageDescriptor"]["Columns"]]
        created = False
        if set(columns) - set(have):
            partition["StorageDescriptor"] = _storage(location, have + [c for c in columns if c not in have])
            glue.update_partition(
                DatabaseName=database, TableName=table, PartitionValueList=[date_prefix], PartitionInput=partition
            )
    return {"database": database, "table": table, "partition": date_prefix, "created": created}
