"""Task bodies of the merge (seed 001's Step Functions + Glue job + batch_status_updater), callable without Prefect.

The merge runs on Dask (one task per output part, its files read in parallel threads), the way the Glue job
spreads a manifest over Spark workers: every value kept as written (``ndjson_text``: strings decoded, numbers
and nested JSON as their text, malformed lines to a rejects output with file name and line number), plus
``_processing_timestamp`` and ``_source_file``, written as Snappy Parquet parts of about ``target_file_mb``.

Output is published once: parts are written under a staging prefix, then renamed to deterministic names
(``publish``, through the object store) and a publish record is written last; a re-run finds that record and
skips the merge, and a failed manifest's output is removed (``unpublish``) before its files can go elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from boto3.dynamodb.conditions import Key

from tasks.core import disk, keys, object_store, state_store
from tasks.core.config import table_name
from tasks.core.object_store import ObjectNotFound, open_url
from tasks.core.runtime import now_iso, prefect_ids
from tasks.etl import catalog, widths
from tasks.etl import keys as etl_keys
from tasks.etl.ingest import (
    COMPLETED,
    FAILED,
    MANIFESTED,
    METRICS,
    PENDING,
    PROCESSING,
    STATUS_INDEX,
    TRACKING,
    base_status,
    file_records,
    input_file,
    input_home,
    manifest_record,
    metric_item,
    settings,
    store,
    tracking_key,
    with_shard,
)
from tasks.etl.widths import WidthLimits

log = logging.getLogger(__name__)

SOURCE_FILE = "_source_file"
PROCESSING_TIMESTAMP = "_processing_timestamp"
INPUT_SUFFIX = "__input"  # appended to an input field named like a column the merge adds (docs/operations.md)
_METADATA_LIKE = re.compile(rf"^(?:{SOURCE_FILE}|{PROCESSING_TIMESTAMP})(?:{INPUT_SUFFIX})*$")
NDJSON_TO_PARQUET = 0.25  # typical Snappy Parquet size / NDJSON size: how much input fills one output part


# --------------------------------------------------------------------------- the MANIFEST record


def start_processing(date_prefix: str, manifest_name: str, rerun: bool = False) -> dict[str, Any] | None:
    """MANIFEST ``pending → processing`` (``failed``/``completed`` too when ``rerun``), with the Prefect run ids.

    Returns the record, or None when another run already has it (a duplicate launch does nothing). A retry of
    the same flow run finds its own ``processing`` record and carries on.
    """
    key = tracking_key(keys.safe_date(date_prefix), etl_keys.manifest_record_key(manifest_name))
    expected = [PENDING, FAILED, COMPLETED] if rerun else PENDING
    ids = prefect_ids()
    result = state_store.transition(
        table_name(TRACKING),
        key,
        expected,
        PROCESSING,
        set={"processing_at": now_iso(), "updated_at": now_iso(), **ids},
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


def processing_under(flow_run_id: str) -> dict[str, str]:
    """The MANIFESTs ``processing`` under this flow run: manifest name → date (``status-index``)."""
    found = state_store.query_all(
        table_name(TRACKING),
        keep=lambda item: (
            item["file_key"].startswith(etl_keys.MANIFEST_PREFIX) and item.get("prefect_flow_run_id") == flow_run_id
        ),
        IndexName=STATUS_INDEX,
        KeyConditionExpression=Key("status").eq(PROCESSING),
    )
    return {etl_keys.manifest_name_from_record_key(item["file_key"]): item["date_prefix"] for item in found}


# a manifest whose merge run crashed (its process killed: an upgrade's swap, a machine restart) goes back to pending
# this many times; a manifest that crashes every run it is given fails with the reason instead
MAX_MANIFEST_REDRIVES = 3


def redrive_manifest(date_prefix: str, manifest_name: str, holder: str, reason: str) -> state_store.WriteResult | None:
    """MANIFEST ``processing → pending`` while ``holder`` (a run that crashed) still holds it: the next merge run takes
    it (the breaker's check and the flush announce pending manifests); its files stay with it. A re-merge is safe:
    parts are staged under a token and a publish replaces the manifest's parts. None once the manifest has been
    re-driven ``MAX_MANIFEST_REDRIVES`` times (the caller fails it); STALE when another writer moved it first."""
    key = tracking_key(keys.safe_date(date_prefix), etl_keys.manifest_record_key(manifest_name))
    current = state_store.get_item(table_name(TRACKING), key) or {}
    if int(current.get("redrives", 0)) >= MAX_MANIFEST_REDRIVES:
        return None
    return state_store.transition(
        table_name(TRACKING),
        key,
        PROCESSING,
        PENDING,
        set={"updated_at": now_iso(), "redriven_at": now_iso(), "redriven_from": holder, "redrive_reason": reason},
        add={"redrives": 1},
        remove=["prefect_flow_run_id", "prefect_task_run_id", "processing_at"],
        condition=_held_by(holder),
    )


def manifest_files(manifest_path: str) -> list[str]:
    """File URLs of a manifest JSON (``fileLocations[].URIPrefixes[]``)."""
    source, key = open_url(manifest_path)
    document = json.loads(source.get_bytes(key))
    return [url for location in document["fileLocations"] for url in location["URIPrefixes"]]


# --------------------------------------------------------------------------- reading NDJSON as written


@dataclass
class FileResult:
    """One input file read: its string table (None if nothing usable), malformed lines, or why it failed."""

    url: str
    table: pa.Table | None = None
    rows: int = 0
    rejects: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def user_column(name: str) -> str:
    """The column of an input field: a name the merge adds itself gets ``__input`` appended (and so on, injectively)."""
    return name + INPUT_SUFFIX if _METADATA_LIKE.match(name) else name


# more time can fix these (the merge task retries them); any other error reading a file is that file's alone
_CAPACITY_ERRORS = (MemoryError, ConnectionError, TimeoutError)


def read_ndjson(url: str, limits: WidthLimits | None = None) -> FileResult:
    """One NDJSON file as a table of strings kept as written (``ndjson_text``); bad lines become rejects.

    A file that cannot be read (or whose reading raises) fails alone with the reason, none of its lines merged (a
    reprocess after a fix then merges each line once); the other files of its manifest merge as usual. So does a
    file whose keys ``limits`` refuse (``widths.file_problem``), found before any of its columns is built.
    """
    from tasks.etl.ndjson_text import KeysRefused, parse_ndjson  # here, not at the top: only a merge loads Numba

    check = None if limits is None else partial(widths.file_problem, limits=limits)
    try:
        source, key = open_url(url)
        parsed = parse_ndjson(url, source.get_bytes(key), user_column, check)
    except (ObjectNotFound, FileNotFoundError):
        return FileResult(url, error="file disappeared before the merge (not found)")
    except KeysRefused as refused:
        return FileResult(url, error=f"refused: {refused}"[:1000])
    except _CAPACITY_ERRORS:
        raise
    except Exception as error:  # one unreadable file must not fail its manifest
        log.warning("%s could not be read; the file fails alone", url, exc_info=True)  # the traceback: logs only
        return FileResult(url, error=f"could not be read: {type(error).__name__}: {error}"[:1000])
    result = FileResult(url, parsed.table, parsed.rows, parsed.rejects)
    if parsed.table is None:
        bad = len(parsed.rejects)
        result.error = f"not JSON: all {bad} non-empty lines are malformed" if bad else "no records"
    return result


# --------------------------------------------------------------------------- one output part (a Dask task)


def input_sizes(urls: list[str]) -> dict[str, int]:
    """Each input file's size from the store (0 for a file gone since it was tracked)."""
    sizes = {}
    for url in urls:
        try:
            source, key = open_url(url)
            sizes[url] = source.size(key)
        except (ObjectNotFound, FileNotFoundError):
            sizes[url] = 0
    return sizes


def plan_parts(urls: list[str], target_file_mb: float, sizes: dict[str, int] | None = None) -> list[list[str]]:
    """Deterministic groups of input files, each about ``target_file_mb`` of Parquet (sizes from the store)."""
    sizes = input_sizes(urls) if sizes is None else sizes
    budget = target_file_mb * 1024 * 1024 / NDJSON_TO_PARQUET
    parts: list[list[str]] = [[]]
    filled = 0.0
    for url in urls:
        size = sizes[url]
        if parts[-1] and filled + size > budget:
            parts.append([])
            filled = 0.0
        parts[-1].append(url)
        filled += size
    return parts


def _unify(tables: list[pa.Table]) -> pa.Table:
    """Concatenate string tables with different columns (missing values are null), first-seen column order."""
    names = list(dict.fromkeys(name for t in tables for name in t.column_names))
    return pa.concat_tables(
        [t.select([c for c in names if c in t.column_names]) for t in tables], promote_options="default"
    ).select(names)


def repetitive_columns(table: pa.Table, sample: int = 4096) -> list[str]:
    """Columns worth dictionary-encoding: at most half of a sample of their values distinct.

    Every column is text here, so ids, amounts and timestamps would each build a dictionary only to abandon it:
    skipping those writes about 40% faster and the file is smaller.
    """
    chosen = []
    for name in table.column_names:
        values = table[name].slice(0, sample)
        present = len(values) - values.null_count
        if pc.count_distinct(values).as_py() <= present // 2:
            chosen.append(name)
    return chosen


ROW_GROUP_ROWS = 1 << 17  # rows per row group while later files of the part are still being parsed


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns in its order (a column it lacks is null), all text."""
    return pa.table(
        [table[name] if name in table.column_names else pa.nulls(table.num_rows, pa.string()) for name in schema.names],
        schema=schema,
    )


def write_parquet(output_url: str, key: str, tables: pa.Table | Iterable[pa.Table]) -> str | None:
    """Write Snappy Parquet through the store's pyarrow filesystem (locally: temp file, fsync, rename; a full disk
    removes the temp file and raises ``DiskFull``); None when no table came.

    ``tables`` may arrive one by one (a part's files, each as soon as it is parsed): they are written as they come,
    so the write overlaps the parsing of the files after them. Columns keep their first-seen order; a table with a
    column the first one lacks ends the streaming and the part is written again whole from every table.
    """
    pending = iter([tables] if isinstance(tables, pa.Table) else tables)
    first = next(pending, None)
    if first is None:
        return None
    import pyarrow.fs as pafs

    target = store(output_url)
    fs = target.arrow_filesystem()
    path = destination = target.arrow_path(key)
    if isinstance(fs, pafs.LocalFileSystem):
        parent, name = path.rsplit("/", 1)
        with disk.full_disk_as_unavailable(target.url_for(key)):
            fs.create_dir(parent, recursive=True)
        destination = f"{parent}/.{name}.{uuid.uuid4().hex}.part"
    try:
        with disk.full_disk_as_unavailable(target.url_for(key)):
            _write_tables(destination, fs, first, pending)
            if destination != path:  # the part's bytes reach the disk before its name does
                disk.sync_file(destination)
                fs.move(destination, path)
                disk.sync_folder(path.rsplit("/", 1)[0])
    except BaseException:
        if destination != path:  # a full disk (or a crash of the write) leaves no half part behind
            with contextlib.suppress(FileNotFoundError):
                os.unlink(destination)
        raise
    return target.url_for(key)


def _write_tables(destination: str, fs: Any, first: pa.Table, pending: Iterator[pa.Table]) -> None:
    """Write ``first`` and the tables after it to ``destination`` as one Snappy Parquet file (``write_parquet``)."""
    seen, schema, streamed = [first], first.schema, True
    with pq.ParquetWriter(
        destination, schema, filesystem=fs, compression="snappy", use_dictionary=repetitive_columns(first)
    ) as writer:
        buffered, rows, names = [first], first.num_rows, set(schema.names)
        for table in pending:
            seen.append(table)
            if not set(table.column_names) <= names:
                streamed = False
                break
            buffered.append(_conformed(table, schema))
            rows += table.num_rows
            if rows >= ROW_GROUP_ROWS:
                writer.write_table(pa.concat_tables(buffered))
                buffered, rows = [], 0
        if streamed and buffered:
            writer.write_table(pa.concat_tables(buffered))
    if not streamed:  # a new column: every table (the rest too) unified, then written whole
        whole = _unify(seen + list(pending))
        pq.write_table(
            whole, destination, filesystem=fs, compression="snappy", use_dictionary=repetitive_columns(whole)
        )


def reader_threads(files: int) -> int:
    """Threads reading one part's files: on a Dask cluster's worker its own thread count (the cores it was given, so
    n workers of 1 thread use n cores, not n times every core), elsewhere this machine's cores; at most ``files``."""
    try:
        from distributed import get_worker

        threads = get_worker().state.nthreads
    except (ImportError, ValueError):  # not inside a distributed worker: the local threaded scheduler
        threads = os.cpu_count() or 1
    return max(1, min(files, threads))


def merge_part(
    part: int,
    urls: list[str],
    staging_prefix: str,
    output_url: str,
    processed_at: str,
    limits: WidthLimits | None = None,
) -> dict[str, Any]:
    """Read a group of files (in parallel: ``reader_threads``), add the metadata columns, write one staged Parquet
    part (a Dask task); each file's rows are written while the files after it are still being read.

    ``limits`` (default: the ETL settings'): a file they refuse, or one that would widen the part past
    ``columns_per_part`` columns (files taken in order), fails alone with the reason; the others merge."""
    limits = WidthLimits.of(settings()) if limits is None else limits
    columns = widths.PartColumns(limits.columns_per_part, (PROCESSING_TIMESTAMP, SOURCE_FILE))
    results: list[FileResult] = []

    def parsed_tables() -> Iterator[pa.Table]:
        with ThreadPoolExecutor(reader_threads(len(urls))) as pool:
            # in file order, each as soon as it and those before it are read
            for r in pool.map(partial(read_ndjson, limits=limits), urls):
                results.append(r)
                refused = columns.admit(r.table.column_names) if r.table is not None else None
                if refused:  # none of its lines merge: `etl reprocess` then merges each once
                    r.table, r.rows, r.rejects, r.error = None, 0, [], f"refused: {refused}"[:1000]
                if r.table is not None and r.rows:
                    yield (
                        r.table.append_column(
                            PROCESSING_TIMESTAMP, pa.repeat(pa.scalar(processed_at, pa.string()), r.rows)
                        ).append_column(SOURCE_FILE, pa.repeat(pa.scalar(r.url, pa.string()), r.rows))
                    )

    key = f"{staging_prefix}part-{part:05d}.parquet"
    staged = key if write_parquet(output_url, key, parsed_tables()) else None
    return {
        "part": part,
        "staged": staged,
        "rows": sum(r.rows for r in results if r.table is not None),
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


def published(date_prefix: str, manifest_name: str, output_url: str = "") -> dict[str, Any] | None:
    """The summary a finished publish of this manifest left (None when its output is not all published)."""
    try:
        return json.loads(store(output_url).get_bytes(etl_keys.merged_published_key(date_prefix, manifest_name)))
    except ObjectNotFound:
        return None


def publish(
    date_prefix: str, manifest_name: str, output_url: str, outputs: list[dict[str, Any]], summary: dict[str, Any]
) -> dict[str, Any]:
    """Make the staged parts visible (one rename each), drop parts an earlier run left, write the publish record,
    then register the date's partition in the catalog (``tasks.etl.catalog``).

    Until the record is written the manifest is not published: a re-run merges again and overwrites the same
    part names; a failed manifest's parts are removed (``unpublish``) before its files can be merged elsewhere.
    """
    target = store(output_url)
    parts = []
    for o in sorted(outputs, key=lambda o: o["part"]):
        if o["staged"]:
            final = etl_keys.merged_part_key(date_prefix, manifest_name, o["part"])
            parts.append(object_store.rename(target, o["staged"], final))
    written = {etl_keys.merged_part_key(date_prefix, manifest_name, o["part"]) for o in outputs if o["staged"]}
    for key in list(target.list(etl_keys.merged_part_prefix(date_prefix, manifest_name))):
        if key not in written:  # a part an earlier run wrote that this run does not (fewer rows now)
            target.delete(key)
    rejects = [r for o in outputs for r in o["rejects"]]
    rejects_key = etl_keys.rejects_key(date_prefix, manifest_name)
    summary = {**summary, "parts": parts, "rejects_path": None}
    if rejects:
        summary["rejects_path"] = target.put_bytes(rejects_key, "".join(json.dumps(r) + "\n" for r in rejects).encode())
    elif target.exists(rejects_key):
        target.delete(rejects_key)
    target.put_bytes(etl_keys.merged_published_key(date_prefix, manifest_name), json.dumps(summary).encode())
    return {**summary, "partition": catalog.register_logged(date_prefix, output_url, sorted(written))}


def unpublish(date_prefix: str, manifest_name: str, output_url: str = "") -> int:
    """Remove a failed manifest's output (publish record first, then parts and rejects); how many objects went."""
    target = store(output_url)
    removed = 0
    marker = etl_keys.merged_published_key(date_prefix, manifest_name)
    if target.exists(marker):
        removed += target.delete(marker)
    for key in list(target.list(etl_keys.merged_part_prefix(date_prefix, manifest_name))):
        removed += target.delete(key)
    if target.exists(etl_keys.rejects_key(date_prefix, manifest_name)):
        removed += target.delete(etl_keys.rejects_key(date_prefix, manifest_name))
    return removed


def listed_file_records(date_prefix: str, urls: list[str]) -> list[dict[str, Any]]:
    """The tracking records of a manifest's listed files, read by key (one batch read per 100 files, however many
    files the date holds); a listed file always has one: it was claimed for the manifest before it was listed."""
    date, names, home = keys.safe_date(date_prefix), set(), input_home(settings())
    for url in urls:
        try:
            names.add(input_file(url, home)[1])
        except keys.InvalidKey:  # not an input path, so never tracked: not attached (a failed merge still finishes)
            log.warning("manifest lists %s, which is not an input file path; it is not merged", url)
    return state_store.get_many(table_name(TRACKING), (tracking_key(date, name) for name in sorted(names)))


def attached_records(date_prefix: str, manifest_path: str, urls: list[str]) -> list[dict[str, str]]:
    """The tracking records (key, path, status) of the manifest's files that still belong to it (a reprocessed file
    has moved on to another manifest), in ``urls`` order."""
    mine = {
        item["file_path"]: {k: item[k] for k in ("file_key", "file_path", "status", "manifest_path")}
        for item in listed_file_records(date_prefix, urls)
        if item.get("manifest_path") == manifest_path
    }
    return [mine[url] for url in urls if url in mine]


def attached_files(date_prefix: str, manifest_path: str, urls: list[str]) -> list[str]:
    """The manifest's files whose records still belong to it (a reprocessed file has moved on to another manifest)."""
    return [record["file_path"] for record in attached_records(date_prefix, manifest_path, urls)]


def merge_manifest(
    date_prefix: str,
    manifest_name: str,
    urls: list[str],
    output_url: str = "",
    target_file_mb: float = 128,
    scheduler: str = "threads",
) -> dict[str, Any]:
    """Merge a manifest's files into staged Parquet parts on Dask, then publish them; a published run is skipped
    (its date registered again, in case a crash came between the publish record and the catalog)."""
    from dask import delayed

    done = published(date_prefix, manifest_name, output_url)
    if done is not None and sorted(f["url"] for f in done["files"]) == sorted(urls) and not done["files_failed"]:
        return {**done, "already_published": True, "partition": catalog.register_logged(date_prefix, output_url)}
    token = uuid.uuid4().hex
    staging = etl_keys.merged_staging_prefix(date_prefix, manifest_name, token)
    processed_at = now_iso()
    sizes = input_sizes(urls)
    parts = plan_parts(sorted(urls), target_file_mb, sizes)
    limits = WidthLimits.of(settings())
    try:
        if len(parts) == 1 and scheduler in ("threads", "sync"):  # one part: a Dask graph would only add its cost
            outputs = [merge_part(0, parts[0], staging, output_url, processed_at, limits)]
        else:
            calls = [delayed(merge_part)(i, g, staging, output_url, processed_at, limits) for i, g in enumerate(parts)]
            outputs = run_dask(calls, scheduler)
    except BaseException:
        store(output_url).delete_prefix(staging)  # nothing was published
        raise
    files = [f for o in outputs for f in o["files"]]
    summary = {
        "rows": sum(o["rows"] for o in outputs),
        "rejected_lines": sum(len(o["rejects"]) for o in outputs),
        "files": files,
        "files_failed": sum(1 for f in files if f["error"]),
        "input_bytes": sum(sizes.values()),
    }
    summary = publish(date_prefix, manifest_name, output_url, outputs, summary)
    return {**summary, "already_published": False}


def merge_listed(
    date_prefix: str,
    manifest_name: str,
    manifest_path: str,
    output_url: str = "",
    target_file_mb: float = 128,
    scheduler: str = "threads",
) -> dict[str, Any]:
    """Read the manifest JSON, keep the files still in it, merge them (``merge_manifest``): the summary, with the
    manifest's ``listed`` files and its files' ``records`` as read before the merge (what ``finish_manifest``
    moves in one transaction, or reads back when they changed since)."""
    listed = manifest_files(manifest_path)
    records = attached_records(date_prefix, manifest_path, listed)
    urls = [record["file_path"] for record in records]
    summary = merge_manifest(date_prefix, manifest_name, urls, output_url, target_file_mb, scheduler)
    return {**summary, "listed": listed, "records": records}


# --------------------------------------------------------------------------- status after the merge


def wait_for_space(date_prefix: str, manifest_name: str, error: str, holder: str | None = None) -> bool:
    """A merge that met a full disk: MANIFEST ``processing → pending`` under ``holder``, its files left in it and
    nothing published (the staged parts are gone), so the flush's restart of pending manifests merges it once space
    is freed. A full disk is no fault of the files: none of them is failed for it. True when the MANIFEST moved."""
    key = tracking_key(keys.safe_date(date_prefix), etl_keys.manifest_record_key(manifest_name))
    stamp = now_iso()
    result = state_store.transition(
        table_name(TRACKING),
        key,
        PROCESSING,
        PENDING,
        set={"updated_at": stamp, "waiting_for_space_since": stamp, "waiting_reason": error[:1000]},
        condition=_held_by(holder),
    )
    return result.applied


def _held_by(holder: str | None) -> state_store.Condition | None:
    """The guard that the MANIFEST is still the ``holder`` flow run's (None: any holder)."""
    return None if holder is None else state_store.unchanged({"prefect_flow_run_id": holder}, tag="h")


def _file_changes(
    date_prefix: str,
    candidates: Iterable[dict[str, Any]],
    manifest_path: str,
    outcome: str,
    per_file: dict[str, dict[str, Any]],
    error: str | None,
    stamp: str,
) -> list[tuple[dict[str, Any], str, str, dict[str, Any]]]:
    """The guarded file transitions that finish a manifest ``outcome``: each of its files (``manifest_path``) still
    movable → ``completed#N`` or ``failed#N`` (its own error, the manifest's, or not merged by this run)."""
    movable = (MANIFESTED, FAILED) if outcome == COMPLETED else (MANIFESTED, COMPLETED)
    ids = prefect_ids()
    changes = []
    for item in candidates:
        if item.get("manifest_path") != manifest_path or base_status(item) not in movable:
            continue
        info = per_file.get(item["file_path"], {})
        file_error = error or info.get("error") or (None if info else "not merged by this run")
        new = FAILED if file_error else COMPLETED
        if with_shard(new, item["status"]) == item["status"]:
            continue
        file_sets: dict[str, Any] = {"updated_at": stamp, f"{new}_time": stamp, **ids}
        if "prefect_flow_run_id" in ids:
            file_sets["glue_job_run_id"] = ids["prefect_flow_run_id"]  # the seed's field, holding the merge run
        if info:
            file_sets.update(rows=info["rows"], rejected_lines=info["rejected_lines"])
        if file_error:
            file_sets["error_message"] = file_error[:1000]
        changes.append(
            (tracking_key(date_prefix, item["file_key"]), item["status"], with_shard(new, item["status"]), file_sets)
        )
    return changes


def finish_manifest(
    date_prefix: str,
    manifest_name: str,
    summary: dict[str, Any] | None,
    error: str | None = None,
    manifest_path: str | None = None,
    listed: list[str] | None = None,
    metric: dict[str, Any] | None = None,
    holder: str | None = None,
    records: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """MANIFEST ``processing → completed/failed``, then every file of it → ``completed#N/failed#N``.

    ``holder``: the flow run that must hold the manifest (``processing`` under its id) for anything to change; a
    manifest another run took is left alone, its output and files too. Files move only once the MANIFEST's own
    guarded transition applied (or had: a retry finds it done under the same holder), and a failed manifest's
    output is removed only then, before its files are failed (a crash in between leaves it ``failed`` with its
    output: ``etl reprocess`` removes that output before its files go anywhere).

    Files are the records whose ``manifest_path`` is the manifest's, among the ``listed`` files of its JSON
    (read by key) or, when the JSON could not be read, among every record of the date (a query); a file that could not
    be read fails on its own with its reason while the others complete. A
    re-run moves the files an earlier run left ``failed#N`` too; a failed run fails its files whatever an earlier
    run made of them, so `etl reprocess` can take them all.
    ``manifest_path`` (from the record ``start_processing`` returned) saves reading the record again.

    The MANIFEST and the ``metric`` row (values of a ``merge`` metric, written only with the MANIFEST's own
    transition, so never twice) go in one transaction; the files then in one TransactWriteItems per 100 items.
    A completed manifest whose file ``records`` the merge read (``merge_listed``) tries everything in ONE
    transaction first (MANIFEST, metric, files, each still guarded as above: all or nothing, so files still move
    only with the MANIFEST); any condition failing there (a retry, a file moved since) writes nothing and the steps
    above run as they are.
    """
    if manifest_path is None:
        manifest_path = manifest_record(date_prefix, manifest_name)["manifest_path"]
    table = table_name(TRACKING)
    outcome = FAILED if summary is None else COMPLETED
    stamp = now_iso()
    sets = _manifest_sets(outcome, stamp, summary, error)
    manifest_key = tracking_key(keys.safe_date(date_prefix), etl_keys.manifest_record_key(manifest_name))
    with_manifest = [state_store.put_entry(table_name(METRICS), metric_item("merge", metric))] if metric else []
    manifest_change = (manifest_key, PROCESSING, outcome, sets)
    per_file = {f["url"]: f for f in (summary or {}).get("files", [])}
    if records is not None and outcome == COMPLETED:
        changes = _file_changes(date_prefix, records, manifest_path, outcome, per_file, error, stamp)
        if len(changes) + 1 + len(with_manifest) <= state_store.TRANSACTION_LIMIT and state_store.transition_all(
            table, [manifest_change, *changes], also=with_manifest, conditions=[_held_by(holder)]
        ):
            return _finished(outcome, [change[2] for change in changes])
    (manifest_result,) = state_store.transition_many(
        table, [manifest_change], also=[with_manifest], conditions=[_held_by(holder)]
    )
    current = manifest_result.item or {}
    done_before = current.get("status") == outcome and holder in (None, current.get("prefect_flow_run_id"))
    if not (manifest_result.applied or done_before):  # another run has it (or had it): not this run's to finish
        log.warning("%s: %s, not this run's to finish; left as it is", manifest_name, current.get("status"))
        return {"manifest_status": current.get("status"), "files_completed": 0, "files_failed": 0, "left": True}
    if outcome == FAILED:
        unpublish(date_prefix, manifest_name, settings().output_store_url)

    candidates = listed_file_records(date_prefix, listed) if listed is not None else file_records(date_prefix)
    changes = _file_changes(date_prefix, candidates, manifest_path, outcome, per_file, error, stamp)
    results = state_store.transition_many(table, changes) if changes else []
    return _finished(outcome, [change[2] for change, r in zip(changes, results) if r.applied])


def _manifest_sets(outcome: str, stamp: str, summary: dict[str, Any] | None, error: str | None) -> dict[str, Any]:
    """What the MANIFEST records with its outcome: the times, the merge's figures (completed), the error (failed)."""
    sets: dict[str, Any] = {"updated_at": stamp, f"{outcome}_time": stamp}
    if summary is not None:
        sets.update(
            rows=summary["rows"],
            rejected_lines=summary["rejected_lines"],
            files_failed=summary["files_failed"],
            parts=summary["parts"],
            rejects_path=summary["rejects_path"] or "",
        )
    if error:
        sets["error_message"] = error[:1000]
    return sets


def _finished(outcome: str, moved: list[str]) -> dict[str, Any]:
    """``finish_manifest``'s answer: the MANIFEST's outcome and how many files it moved to completed and failed."""
    return {
        "manifest_status": outcome,
        "files_completed": sum(1 for s in moved if s.startswith(COMPLETED)),
        "files_failed": sum(1 for s in moved if s.startswith(FAILED)),
    }


def complete_if_published(date_prefix: str, manifest_name: str, manifest_path: str) -> dict[str, Any] | None:
    """Finish a ``processing`` manifest whose merge published its output but whose status update never landed (the
    run ended, the best-effort update failed): ``finish_manifest`` with the published summary. None (nothing
    written) when the output is not published, or was published for other files than the manifest holds now."""
    done = published(date_prefix, manifest_name, settings().output_store_url)
    if done is None:
        return None
    listed = manifest_files(manifest_path)
    if sorted(f["url"] for f in done["files"]) != sorted(attached_files(date_prefix, manifest_path, listed)):
        return None
    return finish_manifest(date_prefix, manifest_name, done, manifest_path=manifest_path, listed=listed)


def notify_failure(message: str, block_name: str | None = None, subject: str = "MERGE FAILED (ndjson-merge)") -> str:
    """Tell the configured notification block about a failed merge (tasks.core.notify logs it when there is none)."""
    from tasks.core.notify import notify

    block_name = block_name if block_name is not None else settings().notify_block
    return notify(subject, message, block_name)
