"""Task bodies of the merge (seed 001's Step Functions + Glue job + batch_status_updater), callable without Prefect.

The merge runs on Dask with pyarrow inside each Dask task (one task per output part), the way the Glue job
spreads a manifest over Spark workers: read NDJSON robustly (malformed lines go to a rejects output with
file name and line number), cast every column to string (nested values as JSON text), add
``_processing_timestamp`` and ``_source_file``, write Snappy Parquet parts of about ``target_file_mb``
under deterministic names, so a re-run overwrites instead of duplicating.
"""

from __future__ import annotations

import io
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from tasks import keys, state_store
from tasks.config import table_name
from tasks.etl import (
    COMPLETED, FAILED, MANIFESTED, PENDING, PROCESSING, TRACKING, base_status, file_records, iso, run_ids,
    settings, store, tracking_key, with_shard,
)
from tasks.object_store import ObjectNotFound, open_url

log = logging.getLogger(__name__)

SOURCE_FILE = "_source_file"
PROCESSING_TIMESTAMP = "_processing_timestamp"
NDJSON_TO_PARQUET = 0.25  # typical Snappy Parquet size / NDJSON size: how much input fills one output part
_SCALARS = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_null, pa.types.is_decimal)


# --------------------------------------------------------------------------- the MANIFEST record


def manifest_record(date_prefix: str, manifest_name: str) -> dict[str, Any]:
    """The ``MANIFEST#`` meta-record, or LookupError."""
    key = tracking_key(keys.safe_date(date_prefix), keys.manifest_record_key(manifest_name))
    item = state_store.get_item(table_name(TRACKING), key)
    if item is None:
        raise LookupError(f"no manifest record {key['file_key']} for {date_prefix}")
    return item


def start_processing(date_prefix: str, manifest_name: str, rerun: bool = False) -> dict[str, Any] | None:
    """MANIFEST ``pending → processing`` (``failed``/``completed`` too when ``rerun``), with the Prefect run ids.

    Returns the record, or None when another run already has it (a duplicate launch does nothing). A retry of
    the same flow run finds its own ``processing`` record and carries on.
    """
    key = tracking_key(keys.safe_date(date_prefix), keys.manifest_record_key(manifest_name))
    expected = [PENDING, FAILED, COMPLETED] if rerun else PENDING
    ids = run_ids()
    result = state_store.transition(
        table_name(TRACKING), key, expected, PROCESSING, set={"processing_at": iso(), "updated_at": iso(), **ids},
    )
    if result.applied:
        return result.item
    current = result.item
    if current is None:
        raise LookupError(f"no manifest record {key['file_key']} for {date_prefix}")
    mine = ids.get("prefect_flow_run_id")
    if current.get("status") == PROCESSING and mine and current.get("prefect_flow_run_id") == mine:
        return current
    log.info("manifest %s is %s already; this run does nothing", manifest_name, current.get("status"))
    return None


def manifest_files(manifest_path: str) -> list[str]:
    """File URLs of a manifest JSON (``fileLocations[].URIPrefixes[]``)."""
    source, key = open_url(manifest_path)
    document = json.loads(source.get_bytes(key))
    return [url for location in document["fileLocations"] for url in location["URIPrefixes"]]


# --------------------------------------------------------------------------- reading NDJSON robustly


@dataclass
class FileResult:
    """One input file read: its string table (None if nothing usable), malformed lines, or why it failed."""

    url: str
    table: pa.Table | None = None
    rows: int = 0
    rejects: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def _to_text(value: Any) -> str | None:
    """A JSON value as the string Parquet stores: strings as they are, the rest (nested too) as JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _lines(data: bytes) -> list[tuple[int, bytes]]:
    return [(n, line) for n, line in enumerate(data.split(b"\n"), start=1) if line.strip()]


def _python_table(records: list[dict[str, Any]], columns: list[str] | None = None) -> pa.Table:
    if columns is None:
        columns = list(dict.fromkeys(name for record in records for name in record))
    return pa.table({name: pa.array([_to_text(r.get(name)) for r in records], pa.string()) for name in columns})


def _parse_lines(url: str, data: bytes) -> FileResult:
    """The careful path: one line at a time; malformed lines become rejects with their line numbers."""
    result = FileResult(url)
    records = []
    for number, line in _lines(data):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
            records.append(record)
        except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            text = line.decode("utf-8", errors="replace")
            result.rejects.append({"source_file": url, "line_number": number, "error": str(error)[:300], "line": text[:10000]})
    if not records:
        result.error = f"not JSON: all {len(result.rejects)} non-empty lines are malformed" if result.rejects else "no records"
        return result
    result.table = _python_table(records)
    result.rows = len(records)
    return result


def _nested_as_json_text(data: bytes, names: list[str]) -> dict[str, pa.Array]:
    """The JSON text of nested values, cut from each line by DuckDB's JSON extension (C++, no Python per row).

    JSON ``null`` and missing keys give null; objects and arrays come back minified, as ``_to_text`` writes them.
    """
    import duckdb

    lines = pa.array([line for _, line in _lines(data)], pa.binary()).cast(pa.string())
    selects = ", ".join(
        f"CASE WHEN json_type(j, ${i + 1}) = 'NULL' THEN NULL ELSE json_extract(j, ${i + 1})::VARCHAR END" for i in range(len(names))
    )
    paths = ["$." + json.dumps(name) for name in names]  # bound as parameters: no column name reaches the SQL text
    with duckdb.connect() as con:
        con.register("raw", pa.table({"j": lines}))
        result = con.sql(f"SELECT {selects} FROM raw", params=paths).to_arrow_table()
    return {name: result.column(i).combine_chunks() for i, name in enumerate(names)}


def _stringify(table: pa.Table, data: bytes) -> pa.Table:
    """Every column of a pyarrow-parsed table as string: scalars cast in C++, nested ones as their JSON text."""
    nested = [f.name for f in table.schema if not (pa.types.is_string(f.type) or any(t(f.type) for t in _SCALARS))]
    originals: dict[str, pa.Array] = {}
    if nested:
        try:
            originals = _nested_as_json_text(data, nested)
        except ImportError:  # no duckdb: the same text from Python's json, slower
            records = [json.loads(line) for _, line in _lines(data)]
            originals = {name: pa.array([_to_text(r.get(name)) for r in records], pa.string()) for name in nested}
    columns = {}
    for f in table.schema:
        if f.name in originals:
            columns[f.name] = originals[f.name]
        else:
            columns[f.name] = table[f.name].cast(pa.string())
    return pa.table(columns)


def _date_columns(table: pa.Table) -> list[str]:
    return [f.name for f in table.schema if pa.types.is_timestamp(f.type) or pa.types.is_date(f.type)]


def _read_strings_as_written(data: bytes) -> pa.Table:
    """pyarrow's reader, keeping date-like strings as written (pyarrow would turn them into timestamps)."""
    sample = data[: 1 << 18]
    sample = sample[: sample.rfind(b"\n") + 1] or sample
    try:  # the first 256 KB say which columns pyarrow would re-type; those are read as strings
        dates = _date_columns(pajson.read_json(io.BytesIO(sample)))
    except (pa.ArrowInvalid, ValueError):
        dates = []
    for _ in range(2):
        options = pajson.ParseOptions(
            explicit_schema=pa.schema([(name, pa.string()) for name in dates]), unexpected_field_behavior="infer"
        )
        table = pajson.read_json(io.BytesIO(data), parse_options=options)
        later = _date_columns(table)
        if not later:
            return table
        dates += later  # a date-like column that the sample did not show: read again with it
    return table


def read_ndjson(url: str) -> FileResult:
    """One NDJSON file as a table of strings; pyarrow's reader first, the line-by-line path when a line is bad."""
    try:
        source, key = open_url(url)
        data = source.get_bytes(key)
    except (ObjectNotFound, FileNotFoundError):
        return FileResult(url, error="file disappeared before the merge (not found)")
    try:
        table = _stringify(_read_strings_as_written(data), data)
    except (pa.ArrowInvalid, ValueError):  # a malformed line, a non-object line or a column changing type
        return _parse_lines(url, data)
    return FileResult(url, table=table, rows=table.num_rows)


# --------------------------------------------------------------------------- one output part (a Dask task)


def plan_parts(urls: list[str], target_file_mb: float) -> list[list[str]]:
    """Deterministic groups of input files, each about ``target_file_mb`` of Parquet (sizes from the store)."""
    budget = target_file_mb * 1024 * 1024 / NDJSON_TO_PARQUET
    parts: list[list[str]] = [[]]
    filled = 0.0
    for url in urls:
        try:
            source, key = open_url(url)
            size = source.size(key)
        except (ObjectNotFound, FileNotFoundError):
            size = 0
        if parts[-1] and filled + size > budget:
            parts.append([])
            filled = 0.0
        parts[-1].append(url)
        filled += size
    return parts


def _unify(tables: list[pa.Table]) -> pa.Table:
    """Concatenate string tables with different columns (missing values are null), first-seen column order."""
    names = list(dict.fromkeys(name for t in tables for name in t.column_names))
    schema = pa.schema([(name, pa.string()) for name in names])
    return pa.concat_tables([t.select([c for c in names if c in t.column_names]) for t in tables], promote_options="default").select(schema.names)


def write_parquet(output_url: str, key: str, table: pa.Table) -> str:
    """Write Snappy Parquet through the store's pyarrow filesystem (locally: temp file + rename)."""
    target = store(output_url)
    fs = target.arrow_filesystem()
    path = target.arrow_path(key)
    import pyarrow.fs as pafs

    if isinstance(fs, pafs.LocalFileSystem):
        parent, name = path.rsplit("/", 1)
        fs.create_dir(parent, recursive=True)
        temp = f"{parent}/.{name}.{uuid.uuid4().hex}.part"
        pq.write_table(table, temp, filesystem=fs, compression="snappy")
        fs.move(temp, path)
    else:
        pq.write_table(table, path, filesystem=fs, compression="snappy")
    return target.url_for(key)


def merge_part(part: int, urls: list[str], date_prefix: str, manifest_name: str, output_url: str, processed_at: str) -> dict[str, Any]:
    """Read a group of files, stringify, add metadata columns and write one Parquet part (a Dask task)."""
    results = [read_ndjson(url) for url in urls]
    tables = []
    for r in results:
        if r.table is not None and r.rows:
            tables.append(
                r.table.append_column(PROCESSING_TIMESTAMP, pa.repeat(pa.scalar(processed_at, pa.string()), r.rows))
                .append_column(SOURCE_FILE, pa.repeat(pa.scalar(r.url, pa.string()), r.rows))
            )
    written = None
    rows = 0
    if tables:
        merged = _unify(tables)
        rows = merged.num_rows
        written = write_parquet(output_url, keys.merged_part_key(date_prefix, manifest_name, part), merged)
    return {
        "part": part,
        "path": written,
        "rows": rows,
        "files": [{"url": r.url, "rows": r.rows, "rejected_lines": len(r.rejects), "error": r.error} for r in results],
        "rejects": [reject for r in results for reject in r.rejects],
    }


# --------------------------------------------------------------------------- the whole manifest on Dask


def run_dask(calls: list, scheduler: str) -> list:
    """Compute delayed calls on the local threaded scheduler or a Dask cluster (``tcp://…`` address)."""
    import dask

    if scheduler.startswith(("tcp://", "tls://", "inproc://")):
        from distributed import Client

        with Client(scheduler) as client:
            return list(client.gather(client.compute(calls)))
    return list(dask.compute(*calls, scheduler=scheduler))


def merge_manifest(
    date_prefix: str, manifest_name: str, urls: list[str], output_url: str = "", target_file_mb: float = 128,
    scheduler: str = "threads",
) -> dict[str, Any]:
    """Merge every file of a manifest into Parquet parts on Dask; write the rejects; drop stale parts of a re-run."""
    from dask import delayed

    processed_at = iso()
    parts = plan_parts(sorted(urls), target_file_mb)
    calls = [delayed(merge_part)(i, group, date_prefix, manifest_name, output_url, processed_at) for i, group in enumerate(parts)]
    outputs = run_dask(calls, scheduler)
    target = store(output_url)
    written = {keys.merged_part_key(date_prefix, manifest_name, o["part"]) for o in outputs if o["path"]}
    for key in list(target.list(keys.merged_part_prefix(date_prefix, manifest_name))):
        if key not in written:  # a part an earlier run wrote that this run does not (fewer rows now)
            target.delete(key)
    rejects = [r for o in outputs for r in o["rejects"]]
    rejects_key = keys.rejects_key(date_prefix, manifest_name)
    rejects_path = None
    if rejects:
        rejects_path = target.put_bytes(rejects_key, "".join(json.dumps(r) + "\n" for r in rejects).encode())
    else:
        target.delete(rejects_key)
    files = [f for o in outputs for f in o["files"]]
    return {
        "rows": sum(o["rows"] for o in outputs),
        "parts": sorted(o["path"] for o in outputs if o["path"]),
        "rejected_lines": len(rejects),
        "rejects_path": rejects_path,
        "files": files,
        "files_failed": sum(1 for f in files if f["error"]),
    }


# --------------------------------------------------------------------------- status after the merge


def finish_manifest(date_prefix: str, manifest_name: str, summary: dict[str, Any] | None, error: str | None = None) -> dict[str, Any]:
    """MANIFEST ``processing → completed/failed``, then every file of it ``manifested#N → completed#N/failed#N``.

    Files are found by querying the date and matching ``manifest_path`` in code (meta-records filtered in
    code too); a file that could not be read fails on its own with its reason while the others complete.
    """
    record = manifest_record(date_prefix, manifest_name)
    table = table_name(TRACKING)
    outcome = FAILED if summary is None else COMPLETED
    stamp = iso()
    ids = run_ids()
    sets: dict[str, Any] = {"updated_at": stamp, f"{outcome}_time": stamp}
    if summary is not None:
        sets.update(rows=summary["rows"], rejected_lines=summary["rejected_lines"], files_failed=summary["files_failed"],
                    parts=summary["parts"], rejects_path=summary["rejects_path"] or "")
    if error:
        sets["error_message"] = error[:1000]
    manifest_result = state_store.transition(table, tracking_key(date_prefix, record["file_key"]), PROCESSING, outcome, set=sets)

    per_file = {f["url"]: f for f in (summary or {}).get("files", [])}
    changes = []
    for item in file_records(date_prefix):
        if item.get("manifest_path") != record["manifest_path"] or base_status(item) != MANIFESTED:
            continue
        info = per_file.get(item["file_path"], {})
        file_error = error or info.get("error")
        new = FAILED if file_error else COMPLETED
        file_sets: dict[str, Any] = {"updated_at": stamp, f"{new}_time": stamp, **ids}
        if "prefect_flow_run_id" in ids:
            file_sets["glue_job_run_id"] = ids["prefect_flow_run_id"]  # the seed's field, holding the merge run
        if info:
            file_sets.update(rows=info["rows"], rejected_lines=info["rejected_lines"])
        if file_error:
            file_sets["error_message"] = file_error[:1000]
        changes.append((tracking_key(date_prefix, item["file_key"]), item["status"], with_shard(new, item["status"]), file_sets))
    results = state_store.transition_many(table, changes)
    moved = [change[2] for change, r in zip(changes, results) if r.applied]
    return {
        "manifest_status": outcome if manifest_result.applied else (manifest_result.item or {}).get("status"),
        "files_completed": sum(1 for s in moved if s.startswith(COMPLETED)),
        "files_failed": sum(1 for s in moved if s.startswith(FAILED)),
    }


def notify_failure(message: str, block_name: str | None = None) -> str:
    """Tell the configured notification block about a failed merge (tasks.notify logs it when there is none)."""
    from tasks.notify import notify

    block_name = block_name if block_name is not None else settings().notify_block
    return notify("MERGE FAILED (ndjson-merge)", message, block_name)
