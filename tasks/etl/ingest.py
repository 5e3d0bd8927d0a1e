"""Task bodies of the NDJSON→Parquet ingest (seed 001's manifest_builder), callable without Prefect.

validate → quarantine or track (``pending#N``, idempotent) → claim-first batching (``pending#N →
manifested#N`` per file, released when too few were won) → manifest JSON + ``MANIFEST#`` record → merge
launch. Every status change goes through ``tasks.core.state_store``; meta-records are filtered in code.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from boto3.dynamodb.conditions import Key

from blocks import load_config
from blocks.etl import EtlSettings
from tasks.core import keys, state_store
from tasks.core.config import object_store, table_name
from tasks.core.errors import Unavailable
from tasks.core.object_store import ListedObject, ObjectNotFound, ObjectStore, copy_url, object_version, open_url
from tasks.core.runtime import now_iso, prefect_ids, utc_now
from tasks.etl import keys as etl_keys

log = logging.getLogger(__name__)

TRACKING = "etl_file_tracking"
METRICS = "etl_metrics"
TRACKING_KEYS = ("date_prefix", "file_key")
STATUS_INDEX = "status-index"
PENDING, MANIFESTED, COMPLETED, FAILED, QUARANTINED, PROCESSING = (
    "pending",
    "manifested",
    "completed",
    "failed",
    "quarantined",
    "processing",
)


# --------------------------------------------------------------------------- configuration and helpers


def settings() -> EtlSettings:
    """The ETL settings: saved block or defaults, then environment variables (seed names)."""
    return load_config(EtlSettings)


def store(url: str) -> ObjectStore:
    """A configured store (``url``) or the pipeline's object store when empty."""
    return object_store(url or None)


def ttl_epoch(config: EtlSettings) -> int:
    """Expiry of a record written now: ``TTL_DAYS`` ahead, as the seed's Unix timestamp."""
    return int(time.time()) + config.ttl_days * 86400


def base_status(item: dict[str, Any]) -> str:
    """The item's status without its shard suffix (``manifested#3`` → ``manifested``)."""
    return etl_keys.split_status(str(item.get("status", "")))[0]


def with_shard(status: str, current: str) -> str:
    """``status`` carrying the shard suffix of ``current`` (``manifested#3`` → ``completed#3``); legacy stays bare."""
    shard = etl_keys.split_status(current)[1]
    return status if shard is None else etl_keys.sharded_status(status, shard)


def tracking_key(date_prefix: str, file_key: str) -> dict[str, str]:
    """The key of a file's tracking item (``date_prefix`` / ``file_key``)."""
    return {"date_prefix": date_prefix, "file_key": file_key}


def metric_item(metric_type: str, values: dict[str, Any], config: EtlSettings | None = None) -> dict[str, Any]:
    """A row of the metrics table (``metric_type`` / ``timestamp`` in µs, with ``ttl``)."""
    return {
        "metric_type": metric_type,
        "timestamp": time.time_ns() // 1000,
        "ttl": ttl_epoch(config or settings()),
        **values,
    }


def record_metric(metric_type: str, values: dict[str, Any], config: EtlSettings | None = None) -> dict[str, Any]:
    """One append-only row in the metrics table."""
    item = metric_item(metric_type, values, config)
    state_store.put(table_name(METRICS), item)
    return item


# --------------------------------------------------------------------------- validation and tracking


@dataclass(frozen=True)
class FileCheck:
    """One input file's validation: where it is, its tracking key, and why it is refused (None: valid)."""

    url: str
    date_prefix: str
    file_key: str  # keys.input_file_key: the file name, qualified by its input tree outside the pipeline's own
    size: int | None
    reason: str | None = None

    @property
    def valid(self) -> bool:
        """Whether the file passed validation (no refusal reason)."""
        return self.reason is None


def landing_objects(landing_url: str) -> list[ListedObject]:
    """Every ``.ndjson``-or-not object under a landing prefix (validation decides), with the listing's sizes."""
    return store(landing_url).list_objects("")


def input_home(config: EtlSettings) -> str:
    """The URL of the pipeline's own input tree (``input_store_url``, else the object store): its files keep
    their bare names as ``file_key``."""
    return store(config.input_store_url).url


def input_file(url: str, home: str) -> tuple[etl_keys.InputFile, str]:
    """The parsed input path of ``url`` and its tracking ``file_key``; InvalidKey if it is no input path."""
    parsed = etl_keys.parse_input_path(url.split("?", 1)[0])
    return parsed, etl_keys.input_file_key(parsed, home)


def validate_file(url: str, config: EtlSettings, size: int | None = None, home: str | None = None) -> FileCheck:
    """The seed's checks: path under ``pipeline/input/YYYY-MM-DD/``, ``.ndjson`` extension, size within tolerance.

    ``size`` is the one a listing or an S3 event reported; only without it is the object asked (a HEAD). An
    object deleted after its event is then found missing by its merge, which fails the file with the reason."""
    try:
        parsed, file_key = input_file(url, home or input_home(config))
    except keys.InvalidKey as error:
        return FileCheck(
            url, etl_keys.UNDATED_PREFIX, etl_keys.undated_file_key(url), None, f"unparseable input path: {error}"
        )
    try:
        if size is None:
            source, key = open_url(url)
            size = source.size(key)
    except (ObjectNotFound, FileNotFoundError):
        return FileCheck(url, parsed.date_prefix, file_key, None, "file not found (deleted before ingest?)")
    if not parsed.filename.endswith(".ndjson"):
        return FileCheck(url, parsed.date_prefix, file_key, size, "wrong extension: expected .ndjson")
    if size == 0:
        return FileCheck(url, parsed.date_prefix, file_key, size, "empty file (0 bytes)")
    low, high = config.size_bounds_bytes()
    if not low <= size <= high:
        return FileCheck(
            url,
            parsed.date_prefix,
            file_key,
            size,
            f"size {size} bytes outside {config.expected_file_size_mb} MB ± {config.size_tolerance_percent}% "
            f"({int(low)}..{int(high)} bytes)",
        )
    return FileCheck(url, parsed.date_prefix, file_key, size)


def validate_files(
    urls: Sequence[str], config: EtlSettings, sizes: Sequence[int | None] | None = None
) -> list[FileCheck]:
    """``validate_file`` for a batch of file events; ``sizes`` (one per URL, None where unknown) spare the HEADs."""
    if sizes is not None and len(sizes) != len(urls):
        raise ValueError(f"{len(sizes)} sizes for {len(urls)} files")
    home = input_home(config)
    return [validate_file(url, config, size, home) for url, size in zip(urls, sizes or [None] * len(urls))]


def _file_item(check: FileCheck, status: str, config: EtlSettings, **extra: Any) -> dict[str, Any]:
    shard = etl_keys.status_shard(check.file_key, config.num_status_shards)
    stamp = now_iso()
    item = {
        "date_prefix": check.date_prefix,
        "file_key": check.file_key,
        "file_path": check.url,
        "status": etl_keys.sharded_status(status, shard),
        "shard_id": shard,
        "created_at": stamp,
        "updated_at": stamp,
        "ttl": ttl_epoch(config),
        **extra,
    }
    if check.size is not None:
        item["file_size_mb"] = round(check.size / (1024 * 1024), 6)
    return item


def tracked_items(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The tracking items that exist for these (date, file key) pairs: strongly consistent batch reads."""
    items = state_store.get_many(table_name(TRACKING), (tracking_key(d, f) for d, f in pairs))
    return {(item["date_prefix"], item["file_key"]): item for item in items}


def _version(url: str) -> tuple[int | None, str | None]:
    """(size, ETag or local version) of an input, (None, None) when it is gone."""
    try:
        return object_version(url)
    except (ObjectNotFound, FileNotFoundError, ValueError):
        return None, None


def _quarantine_copy(check: FileCheck, config: EtlSettings, size: int | None, version: str | None) -> tuple[str, str]:
    """The refused file's bytes (streamed, never whole in memory) and its reason file; (quarantine URL, reason)."""
    target = store(config.quarantine_store_url)
    if check.date_prefix == etl_keys.UNDATED_PREFIX:
        key = etl_keys.undated_quarantine_key(check.url)
    else:
        key = etl_keys.quarantine_key(check.date_prefix, check.file_key)
    reason = check.reason or ""
    copied = ""
    if size is not None:  # it exists: keep its bytes
        try:
            copied = copy_url(check.url, target, key)
        except ObjectNotFound:  # deleted since it was looked at
            size = version = None
    document = {
        "file_path": check.url,
        "reason": reason,
        "size_bytes": size,
        "etag": version,
        "quarantined_at": now_iso(),
    }
    target.put_bytes(keys.quarantine_reason_key(key), json.dumps(document, indent=2).encode())
    return copied, reason


def _version_guard(item: dict[str, Any]) -> state_store.Condition:
    """The record still describes the version of the file it was written for (no concurrent re-validation won)."""
    if "source_etag" in item:
        return state_store.Condition("#etag = :etag", {"#etag": "source_etag"}, {":etag": item["source_etag"]})
    return state_store.Condition("attribute_not_exists(#etag)", {"#etag": "source_etag"})


def quarantine_files(checks: Sequence[FileCheck], config: EtlSettings) -> list[dict[str, Any]]:
    """Copy refused files (streamed) and a reason file to quarantine; track them ``quarantined#N``.

    Nothing is deleted from the input. A file already quarantined in the same version (size and ETag) is not
    copied again; a new version that is still refused replaces the copy and the reason (guarded on the old
    version); a file tracked in another status keeps its record (``outcome: exists``).
    """
    existing = tracked_items((c.date_prefix, c.file_key) for c in checks)
    items, outcomes = [], []
    for check in checks:
        size, version = _version(check.url) if check.size is not None else (None, None)
        current = existing.get((check.date_prefix, check.file_key))
        if current is not None:
            same = (current.get("source_etag"), current.get("source_size_bytes")) == (version, size)
            if base_status(current) != QUARANTINED or same:
                outcomes.append(dict(state_store.to_plain(current), outcome=state_store.Outcome.EXISTS.value))
                continue
            copied, reason = _quarantine_copy(check, config, size, version)
            sets = {
                "error_message": reason[:1000],
                "quarantine_path": copied,
                "updated_at": now_iso(),
                "source_size_bytes": size,
                "source_etag": version,
            }
            result = state_store.transition(
                table_name(TRACKING),
                tracking_key(check.date_prefix, check.file_key),
                current["status"],
                None,
                set={k: v for k, v in sets.items() if v is not None},
                condition=_version_guard(current),
            )
            outcomes.append(dict(state_store.to_plain(current), **sets, outcome=result.outcome.value))
            continue
        copied, reason = _quarantine_copy(check, config, size, version)
        extra = {"source_size_bytes": size, "source_etag": version}
        items.append(
            _file_item(
                check,
                QUARANTINED,
                config,
                error_message=reason[:1000],
                quarantine_path=copied,
                **{k: v for k, v in extra.items() if v is not None},
            )
        )
    results = state_store.create_many_if_absent(table_name(TRACKING), items, TRACKING_KEYS)
    return outcomes + [dict(item, outcome=r.outcome.value) for item, r in zip(items, results)]


def track_files(checks: Sequence[FileCheck], config: EtlSettings) -> dict[str, Any]:
    """Create ``pending#N`` records for valid files (``attribute_not_exists``): duplicates change nothing."""
    items = [_file_item(check, PENDING, config) for check in checks]
    results = state_store.create_many_if_absent(table_name(TRACKING), items, TRACKING_KEYS)
    new = [item for item, r in zip(items, results) if r.applied]
    return {
        "tracked": len(new),
        "new_files": {
            d: [i["file_key"] for i in new if i["date_prefix"] == d] for d in sorted({i["date_prefix"] for i in new})
        },
        "already_tracked": len(items) - len(new),
        "dates": sorted({item["date_prefix"] for item in items}),
    }


# --------------------------------------------------------------------------- claim-first batching


def file_records(date_prefix: str, consistent: bool = True, **query: Any) -> Iterator[dict[str, Any]]:
    """Every file record of a date (meta-records filtered in code, never in a FilterExpression)."""
    return state_store.query_all(
        table_name(TRACKING),
        keep=lambda item: not etl_keys.is_meta_record(item["file_key"]),
        KeyConditionExpression=Key("date_prefix").eq(date_prefix),
        ConsistentRead=consistent,
        **query,
    )


def pending_files(date_prefix: str, shards: int | None = None) -> list[dict[str, Any]]:
    """Pending file records of a date from ``status-index`` (each ``pending#N`` shard and legacy ``pending``),
    oldest name first (a stable order keeps concurrent claimers apart). The index may lag: claims are guarded."""
    shards = settings().num_status_shards if shards is None else shards
    found: list[dict[str, Any]] = []
    for status in [etl_keys.sharded_status(PENDING, n) for n in range(shards)] + [PENDING]:
        found += state_store.query_all(
            table_name(TRACKING),
            keep=lambda item: not etl_keys.is_meta_record(item["file_key"]),
            IndexName=STATUS_INDEX,
            KeyConditionExpression=Key("status").eq(status) & Key("date_prefix").eq(keys.safe_date(date_prefix)),
        )
    return sorted(found, key=lambda item: item["file_key"])


def _claim(items: Sequence[dict[str, Any]], placeholders: str | Sequence[str]) -> list[dict[str, Any]]:
    """Per-file conditional claims ``pending#N → manifested#N`` (each with its placeholder manifest path):
    the files this caller won."""
    stamp = now_iso()
    if isinstance(placeholders, str):
        placeholders = [placeholders] * len(items)
    ids = prefect_ids()
    changes = [
        (
            tracking_key(i["date_prefix"], i["file_key"]),
            i["status"],
            with_shard(MANIFESTED, i["status"]),
            {"manifest_path": path, "updated_at": stamp, "manifested_at": stamp, **ids},
        )
        for i, path in zip(items, placeholders)
    ]
    results = state_store.transition_many(table_name(TRACKING), changes)
    return [
        dict(item, status=change[2], manifest_path=change[3]["manifest_path"])
        for item, change, r in zip(items, changes, results)
        if r.applied
    ]


def release(items: Sequence[dict[str, Any]]) -> int:
    """Give claimed files back: ``manifested#N → pending#N`` (guarded). Returns how many moved."""
    changes = [
        (
            tracking_key(i["date_prefix"], i["file_key"]),
            i["status"],
            with_shard(PENDING, i["status"]),
            {"manifest_path": "", "updated_at": now_iso()},
        )
        for i in items
    ]
    return sum(r.applied for r in state_store.transition_many(table_name(TRACKING), changes))


def next_sequences(date_prefix: str, count: int = 1) -> list[int]:
    """``count`` fresh manifest numbers for a date (one atomic ADD on a meta-record), so names never collide."""
    table = table_name(TRACKING)
    key = tracking_key(date_prefix, etl_keys.MANIFEST_SEQUENCE_KEY)
    result = state_store.transition(table, key, None, None, add={"sequence": count})
    if not result.applied:  # the date's first manifest: create the counter, then count
        state_store.create_if_absent(table, {**key, "sequence": 0}, TRACKING_KEYS)
        result = state_store.transition(table, key, None, None, add={"sequence": count})
    last = int(result.item["sequence"])
    return list(range(last - count + 1, last + 1))


@dataclass(frozen=True)
class ManifestRef:
    """What the merge needs to find a manifest: its date, name and URL, and how many files it lists."""

    date_prefix: str
    manifest_name: str
    manifest_path: str
    file_count: int


def reserve_manifests(date_prefix: str, count: int, config: EtlSettings) -> list[tuple[str, str]]:
    """``count`` fresh (name, path) pairs: where manifests will be written (nothing is written yet)."""
    if count <= 0:
        return []
    created = utc_now()
    target = store(config.manifest_store_url)
    names = [etl_keys.manifest_name(sequence, created) for sequence in next_sequences(date_prefix, count)]
    return [(name, target.url_for(etl_keys.manifest_key(date_prefix, name))) for name in names]


def _put_entry(item: dict[str, Any]) -> dict[str, Any]:
    """A TransactItems Put that creates ``item`` only if its key is absent (``attribute_not_exists``)."""
    expr = state_store.Expression()
    condition = " AND ".join(f"attribute_not_exists({expr.name(k)})" for k in TRACKING_KEYS)
    return {
        "Put": {
            "TableName": table_name(TRACKING),
            "Item": state_store.to_dynamo(item),
            "ConditionExpression": condition,
            "ExpressionAttributeNames": expr.names,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def _claim_entry(item: dict[str, Any], sets: dict[str, Any]) -> dict[str, Any]:
    """A TransactItems Update that claims a pending file (``pending#N → manifested#N``, guarded on its status)."""
    expr = state_store.Expression()
    key = tracking_key(item["date_prefix"], item["file_key"])
    update = expr.update({**sets, "status": with_shard(MANIFESTED, item["status"])})
    return {
        "Update": expr.entry(table_name(TRACKING), key, expr.status_condition("status", item["status"], key), update)
    }


def _manifest_record(date_prefix: str, path: str, count: int, partial: bool, created: str, config: EtlSettings) -> dict:
    """The ``MANIFEST#`` record of a manifest (``pending`` until its merge starts)."""
    return {
        **tracking_key(date_prefix, etl_keys.manifest_record_key(path.rsplit("/", 1)[1])),
        "status": PENDING,
        "manifest_path": path,
        "file_count": count,
        "partial_batch": partial,
        "created_at": created,
        "updated_at": created,
        "ttl": ttl_epoch(config),
    }


def publish_batches(
    date_prefix: str, batches: Sequence[Sequence[Any]], config: EtlSettings, partial: bool = False
) -> tuple[list[ManifestRef], list[int]]:
    """One manifest per batch, each made in ONE transaction with its files, so no file is ever claimed without
    its ``MANIFEST#`` record (nor a record without its files).

    A batch holds tracking items still ``pending#N`` (claimed: guarded ``pending#N → manifested#N``) or
    ``FileCheck``s of files not tracked yet (created ``manifested#N`` directly: tracked and claimed in one
    write). The manifest JSON is written first; a batch that lost a race (a file claimed or tracked by someone
    else) has its JSON removed and is left to the caller. Returns the manifests made and the indexes of lost batches.
    """
    if not batches:
        return [], []
    slots = reserve_manifests(date_prefix, len(batches), config)
    target = store(config.manifest_store_url)
    created = now_iso()
    ids = prefect_ids()

    def sets_for(path: str) -> dict[str, Any]:
        return {"manifest_path": path, "updated_at": created, "manifested_at": created, **ids}

    groups, refs = [], []
    for (name, path), batch in zip(slots, batches):
        urls = sorted(f.url if isinstance(f, FileCheck) else f["file_path"] for f in batch)
        is_partial = partial or len(urls) < config.max_files_per_manifest
        target.put_bytes(
            etl_keys.manifest_key(date_prefix, name), manifest_document(date_prefix, name, urls, is_partial, created)
        )
        entries = [
            _put_entry(_file_item(f, MANIFESTED, config, **sets_for(path)))
            if isinstance(f, FileCheck)
            else _claim_entry(f, sets_for(path))
            for f in batch
        ]
        groups.append(
            entries + [_put_entry(_manifest_record(date_prefix, path, len(urls), is_partial, created, config))]
        )
        refs.append(ManifestRef(date_prefix, name, path, len(urls)))
    outcomes = state_store.transact_groups(groups)
    lost = [i for i, reasons in enumerate(outcomes) if reasons is not None]
    for i in lost:
        target.delete(etl_keys.manifest_key(date_prefix, refs[i].manifest_name))  # never recorded: nothing reads it
    return [ref for i, ref in enumerate(refs) if i not in lost], lost


def manifest_document(date_prefix: str, name: str, urls: list[str], partial: bool, created: str) -> bytes:
    """A manifest's JSON as the seed's Glue job reads it: the files' URLs and the batch's facts."""
    document = {
        "fileLocations": [{"URIPrefixes": urls}],
        "date_prefix": date_prefix,
        "manifest_name": name,
        "file_count": len(urls),
        "partial_batch": partial,
        "created_at": created,
    }
    return json.dumps(document, indent=2).encode()


def _publish_unatomic(
    date_prefix: str, batch: Sequence[dict[str, Any]], config: EtlSettings, partial: bool
) -> list[ManifestRef]:
    """A batch too big for one transaction: claim its files, write the manifest, then its record; on a lost
    race or any error the claims are released before returning (or raising). A claimer killed in between
    leaves claims without a record, which the scheduled flush releases (``release_dead_claims``)."""
    ((name, path),) = reserve_manifests(date_prefix, 1, config)
    try:
        won = _claim(batch, path)
        if len(won) < len(batch):
            release(won)
            return []
        urls = sorted(f["file_path"] for f in won)
        is_partial = partial or len(urls) < config.max_files_per_manifest
        created = now_iso()
        store(config.manifest_store_url).put_bytes(
            etl_keys.manifest_key(date_prefix, name), manifest_document(date_prefix, name, urls, is_partial, created)
        )
        record = _manifest_record(date_prefix, path, len(urls), is_partial, created, config)
        state_store.create_if_absent(table_name(TRACKING), record, TRACKING_KEYS)
    except BaseException:
        with contextlib.suppress(Exception):  # the flush releases them if this fails too
            record_key = tracking_key(date_prefix, etl_keys.manifest_record_key(name))
            if state_store.get_item(table_name(TRACKING), record_key) is None:  # else the manifest holds them
                _release_claims(batch, path)
        raise
    return [ManifestRef(date_prefix, name, path, len(urls))]


def _release_claims(items: Sequence[dict[str, Any]], path: str) -> int:
    """Give back whichever of these pending files were claimed for ``path`` (guarded on status and path)."""
    guard = state_store.Condition("#path = :path", {"#path": "manifest_path"}, {":path": path})
    return sum(
        state_store.transition(
            table_name(TRACKING),
            tracking_key(i["date_prefix"], i["file_key"]),
            with_shard(MANIFESTED, i["status"]),
            i["status"],
            set={"manifest_path": "", "updated_at": now_iso()},
            condition=guard,
        ).applied
        for i in items
    )


def _in_batches(items: list[Any], size: int, threshold: int) -> list[list[Any]]:
    """Full batches of ``size``, then the rest as one batch when it has at least ``threshold`` items."""
    full = len(items) - len(items) % size
    batches = [items[i : i + size] for i in range(0, full, size)]
    if full < len(items) and len(items) - full >= threshold:
        batches.append(items[full:])
    return batches


def create_manifests(
    date_prefix: str,
    threshold: int,
    config: EtlSettings,
    partial: bool = False,
    attempts: int = 3,
    prefer: Sequence[str] = (),
) -> list[ManifestRef]:
    """Claim-first batching of one date: batches of ``MAX_FILES_PER_MANIFEST``, none smaller than ``threshold``.

    Each batch is claimed (``pending#N → manifested#N``, guarded per file) in the same transaction that creates
    its ``MANIFEST#`` record, so concurrent callers never share a file and an error or a crash at any point
    leaves no claim without its manifest. Batches that lost a race are dropped; after a jittered pause the date
    is looked at again. Each caller takes the files it tracked itself first (``prefer``: file keys; concurrent
    callers stay apart), then the others oldest first: a file an earlier batch left over goes in the next manifest,
    never behind newer ones (a random pick let some wait for many batches).
    """
    batch_size = config.max_files_per_manifest
    threshold = max(1, min(threshold, batch_size))
    made: list[ManifestRef] = []
    for attempt in range(attempts):
        pending = pending_files(date_prefix, config.num_status_shards)
        if len(pending) < threshold:
            break
        mine = set(prefer)
        pending = sorted(pending, key=lambda item: (item["file_key"] not in mine, item.get("created_at", "")))
        batches = _in_batches(pending, batch_size, threshold)
        if batch_size + 1 > state_store.TRANSACTION_LIMIT:
            done = [_publish_unatomic(date_prefix, batch, config, partial) for batch in batches]
            refs, lost = [r for d in done for r in d], [i for i, d in enumerate(done) if not d]
        else:
            refs, lost = publish_batches(date_prefix, batches, config, partial)
        made += refs
        if not lost:
            break
        time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
    return made


def track_and_batch(
    checks: Sequence[FileCheck], config: EtlSettings, existing: dict[tuple[str, str], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Track valid files and batch this call's new ones at once: for each full batch of new files of a date,
    the files are created ``manifested#N`` in the transaction that creates their manifest record; the rest are
    created ``pending#N`` (``attribute_not_exists``, so a redelivered event changes nothing).

    A file tracked before is counted ``already_tracked``; one quarantined before whose size or ETag changed is
    validated again and released to ``pending#N`` (``revalidated``). Returns what ``track_files`` returns plus
    the manifests made. ``existing``: the caller's ``tracked_items`` of these files, read just before (spares a read).
    """
    unique = list({(c.date_prefix, c.file_key): c for c in checks}.values())
    if existing is None:
        existing = tracked_items((c.date_prefix, c.file_key) for c in unique)
    else:
        existing = {pair: existing[pair] for pair in ((c.date_prefix, c.file_key) for c in unique) if pair in existing}
    fresh = [c for c in unique if (c.date_prefix, c.file_key) not in existing]
    quarantined = [item for item in existing.values() if base_status(item) == QUARANTINED]
    made: list[ManifestRef] = []
    left: list[FileCheck] = []
    batch_size = config.max_files_per_manifest
    for date_prefix in sorted({c.date_prefix for c in fresh}):
        mine = sorted((c for c in fresh if c.date_prefix == date_prefix), key=lambda c: c.file_key)
        batches = _in_batches(mine, batch_size, batch_size) if batch_size + 1 <= state_store.TRANSACTION_LIMIT else []
        refs, lost = publish_batches(date_prefix, batches, config)
        made += refs
        batched = {c.file_key for i, b in enumerate(batches) if i not in lost for c in b}
        left += [c for c in mine if c.file_key not in batched]
    items = [_file_item(c, PENDING, config) for c in left]
    results = state_store.create_many_if_absent(table_name(TRACKING), items, TRACKING_KEYS)
    new = [item for item, r in zip(items, results) if r.applied]
    revalidated = revalidate_quarantined(quarantined, config)["released"] if quarantined else []
    tracked = sum(ref.file_count for ref in made) + len(new)
    mine = new + [item for item in quarantined if item["file_key"] in revalidated]
    return {
        "tracked": tracked,
        "new_files": {
            d: [i["file_key"] for i in mine if i["date_prefix"] == d] for d in sorted({i["date_prefix"] for i in mine})
        },
        "already_tracked": len(checks) - tracked,
        "revalidated": revalidated,
        "dates": sorted({c.date_prefix for c in checks}),
        "manifests": made,
    }


def revalidate_quarantined(items: Sequence[dict[str, Any]], config: EtlSettings, force: bool = False) -> dict[str, Any]:
    """Quarantined files whose size or ETag changed since (every one with ``force``) validated again with
    ``config``: those that pass go ``quarantined#N → pending#N``, guarded on status and the recorded version,
    so the next ingest or flush batches them. Returns the file keys released, still refused (with the
    reason), unchanged or gone."""
    out: dict[str, Any] = {"released": [], "refused": {}, "unchanged": [], "gone": []}
    for item in items:
        size, version = _version(item["file_path"])
        if size is None:
            out["gone"].append(item["file_key"])
            continue
        if not force and (item.get("source_etag"), item.get("source_size_bytes")) == (version, size):
            out["unchanged"].append(item["file_key"])
            continue
        check = validate_file(item["file_path"], config)
        if not check.valid or (check.date_prefix, check.file_key) != (item["date_prefix"], item["file_key"]):
            out["refused"][item["file_key"]] = check.reason or "its path names another record"
            continue
        sets = {
            "updated_at": now_iso(),
            "released_at": now_iso(),
            "error_message": "",
            "source_size_bytes": size,
            "source_etag": version,
            "file_size_mb": round(size / (1024 * 1024), 6),
        }
        result = state_store.transition(  # one by one: each guarded on the version it was validated against
            table_name(TRACKING),
            tracking_key(item["date_prefix"], item["file_key"]),
            item["status"],
            with_shard(PENDING, item["status"]),
            set=sets,
            condition=_version_guard(item),
        )
        if result.applied:
            out["released"].append(item["file_key"])
    return out


# --------------------------------------------------------------------------- launching merges


Launcher = Callable[[ManifestRef], Any]


MANIFEST_READY = "manifest.ready"  # seed 001's ManifestReady: prefect.yaml's merge trigger starts the merge from it


class MergesHeld(Unavailable, RuntimeError):
    """The merge deployment is paused (its circuit breaker is open): the manifest waits ``pending``."""


def launch_merges(manifests: Iterable[ManifestRef], launcher: Launcher) -> list[dict[str, Any]]:
    """Start one merge per manifest; a launch that fails or is held leaves its manifest ``pending`` (started later)."""
    outcomes = []
    for ref in manifests:
        try:
            started = launcher(ref)
            outcomes.append({**asdict(ref), "launched": True, "run": str(started) if started is not None else None})
        except MergesHeld as held:
            log.info("%s", held)
            outcomes.append({**asdict(ref), "launched": False, "held": True, "error": str(held)})
        except Exception as error:  # noqa: BLE001 - the manifest stays pending; the next ingest or flush starts it
            log.warning(
                "could not start the merge of %s (%s: %s); it stays pending for the next ingest/flush",
                ref.manifest_name,
                type(error).__name__,
                error,
            )
            outcomes.append({**asdict(ref), "launched": False, "error": f"{type(error).__name__}: {error}"})
    return outcomes


def manifest_ready(ref: ManifestRef, deployment: str) -> dict[str, Any]:
    """The ``manifest.ready`` event of ``ref`` for ``deployment``: its resource (the trigger matches it) and payload."""
    return {
        "event": MANIFEST_READY,
        "resource": {
            "prefect.resource.id": f"etl.manifest.{ref.date_prefix}.{ref.manifest_name}",
            "prefect.resource.name": ref.manifest_name,
            "etl.date-prefix": ref.date_prefix,
            "etl.merge-deployment": deployment,
        },
        "payload": {
            "date_prefix": ref.date_prefix,
            "manifest_name": ref.manifest_name,
            "manifest_path": ref.manifest_path,
            "file_count": ref.file_count,
        },
    }


# a run queued longer than this is not trusted to start (no worker for its pool, a stuck slot): manifests are
# announced again, so the ingest's and the flush's restarts of pending manifests still start a merge
QUEUED_RUN_TRUSTED_S = 600
TRIAL_TAG = "breaker-trial"  # the tag of a circuit breaker's trial merge run (never a draining run to trust)
# a run that stays for more (``stay_for_more``) looks for pending manifests this often until its ``more_seconds``
STAY_POLL_S = 1.0
# a staying run is trusted with a new manifest only while this much of its time is left: its last look comes at most
# ``STAY_POLL_S`` (and one scan) before its deadline, after the manifest's write
STAYING_RUN_MARGIN_S = 15.0


def taking_merge_run(client: Any, deployment_id: Any) -> str | None:
    """A run of the merge deployment that will still look for pending manifests after now, so a manifest written
    before now is taken by it: one not started yet (Scheduled, incl. AwaitingConcurrencySlot and Late, or Pending),
    created in the last ``QUEUED_RUN_TRUSTED_S``, or one Running that stays for more with over
    ``STAYING_RUN_MARGIN_S`` of its ``more_seconds`` left. Either takes further pending manifests (``more_manifests``
    > 0) and is no breaker trial. Its id, or None."""
    return _taking_run(_unfinished_merge_runs(client, deployment_id), utc_now())[0]


def _unfinished_merge_runs(client: Any, deployment_id: Any) -> list[Any]:
    """The merge deployment's runs not started or running (one read)."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    return client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
        flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(
                type=FlowRunFilterStateType(any_=[StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING])
            )
        ),
        limit=20,
    )


def _taking_run(runs: Iterable[Any], now: datetime) -> tuple[str | None, float]:
    """The taking run among ``runs`` (see ``taking_merge_run``) and for how many seconds from ``now`` it may be
    trusted without another look: a staying run's time left less the margin, 0 for a queued run (its scan may come
    soon after; a later launch looks again)."""
    from prefect.client.schemas.objects import StateType

    for run in runs:
        parameters = run.parameters or {}
        if int(parameters.get("more_manifests", 0)) <= 0 or TRIAL_TAG in (run.tags or []):
            continue
        if run.state_type == StateType.RUNNING:
            left = _seconds_left(run, parameters, now)
            if parameters.get("stay_for_more") and left is not None and left > STAYING_RUN_MARGIN_S:
                return str(run.id), left - STAYING_RUN_MARGIN_S
        elif run.created is not None and run.created >= now - timedelta(seconds=QUEUED_RUN_TRUSTED_S):
            return str(run.id), 0.0
    return None, 0.0


def _own_flow_run_id() -> str | None:
    """The flow run this code runs in, if any."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return str(context.flow_run.id) if context is not None and context.flow_run is not None else None


def _seconds_left(run: Any, parameters: dict[str, Any], now: datetime) -> float | None:
    """Seconds left of a running merge's ``more_seconds`` from its start (None when it has no start time)."""
    if run.start_time is None:
        return None
    return float(parameters.get("more_seconds", 0)) - (now - run.start_time).total_seconds()


def manifest_record(date_prefix: str, manifest_name: str) -> dict[str, Any]:
    """The ``MANIFEST#`` meta-record, or LookupError."""
    key = tracking_key(keys.safe_date(date_prefix), etl_keys.manifest_record_key(manifest_name))
    item = state_store.get_item(table_name(TRACKING), key)
    if item is None:
        raise LookupError(f"no manifest record {key['file_key']} for {date_prefix}")
    return item


# merge deployment → (a staying run found by a launcher, the monotonic time until which it is trusted): the launches
# of that process leave their manifests to it without a look at the server (its end before then, Cancelled or
# Crashed, triggers the breaker's check, which announces what is pending)
_STAYING: dict[str, tuple[str, float]] = {}


def deployment_launcher(deployment: str) -> Launcher:
    """A launcher that announces a batch of manifests with one ``manifest.ready`` event (its first manifest's); the
    ``deployment``'s trigger (prefect.yaml) starts the merge, which takes the others while they are pending. No event at
    all when a run of the deployment is queued and has not started, or runs and stays for more with time left
    (``taking_merge_run``: its id is the launch's run; the process's later launches trust a staying run until its
    time left less the margin, without another look). A deployment that does not exist is a launch failure, a paused
    one (its breaker is open) holds the manifest: either way it stays ``pending``. No run id: the trigger makes the run,
    and a queued run may meet the manifest taken by another.

    Invariant: every ``pending`` manifest is announced or will be taken by a run that had not started when it was
    written. Proof: a launcher is only called with manifests whose ``MANIFEST#`` record already exists (``pending``).
    Its one look at the server (time t) comes after every such write. (a) A run R found queued at t has not started at
    t, so R starts (or ends Cancelled/Crashed before its scan: that end triggers the breaker's check, which announces
    every manifest then pending that no queued run will take, ``breaker.announce_waiting``: (b) for them), and scans the
    pending manifests (``ndjson_merge``), after t, hence after the write: R takes the manifest unless it is no longer
    pending (another run has it: fine) or R stops first, at its bound (R then announces a pending one: the same argument
    for the next run), at the breaker (the manifest is held; closing the breaker announces every pending one) or by
    dying (below). (a') A run R found running at t and staying for more with over ``STAYING_RUN_MARGIN_S`` left looks
    again until its deadline less ``STAY_POLL_S``, after t: as (a); a look that fails makes R announce a pending
    manifest at its end. (b) Otherwise the batch's event is emitted after t; the run the trigger makes from it is
    created after the event, so it starts and scans after every write of the batch: (a) holds for it. Backstops for what
    Prefect loses (an event, a run that dies before its scan, a status index that lags on AWS): the ingest and
    ``ndjson-flush-orphans`` announce manifests left ``pending`` past their grace period, and ``records-reconcile``
    fails those left ``processing`` under an ended run; a queued run that never starts (no worker, a stuck slot) holds
    announcements back for at most ``QUEUED_RUN_TRUSTED_S``, after which those restarts announce again."""
    looked: dict[str, Any] = {}

    def launch(ref: ManifestRef) -> None:
        """Announce ``ref``'s manifest to ``deployment``'s trigger, or leave it to the run that will take it."""
        from prefect.client.orchestration import get_client
        from prefect.events import emit_event

        own = _own_flow_run_id()  # a merge run handing on never leaves a manifest to itself
        if not looked and (staying := _STAYING.get(deployment)) and time.monotonic() < staying[1] and staying[0] != own:
            looked.update(paused=False, queued=staying[0])  # a staying run still trusted: no look this batch
        if not looked:  # one look per launcher (a batch), raising ObjectNotFound when it is not deployed
            with get_client(sync_client=True) as client:
                found = client.read_deployment_by_name(deployment)
                looked["paused"], looked["queued"] = bool(found.paused), None
                if not found.paused:
                    runs = [run for run in _unfinished_merge_runs(client, found.id) if str(run.id) != own]
                    looked["queued"], trusted_s = _taking_run(runs, utc_now())
                    if trusted_s > 0:
                        _STAYING[deployment] = (looked["queued"], time.monotonic() + trusted_s)
        if looked["paused"]:
            raise MergesHeld(f"{deployment} is paused (circuit breaker open): {ref.manifest_name} waits pending")
        if looked["queued"] is not None:
            log.debug("%s: left to the queued run %s", ref.manifest_name, looked["queued"])
            return looked["queued"]
        if looked.get("announced"):
            return None  # the run of the batch's event takes it
        if emit_event(**manifest_ready(ref, deployment)) is None:
            raise RuntimeError("Prefect events are not being sent (no API configured)")
        looked["announced"] = ref.manifest_name
        return None

    return launch


def pending_manifests(older_than_seconds: float = 0, dates: Sequence[str] | None = None) -> list[ManifestRef]:
    """``MANIFEST#`` records still ``pending`` (never started) and older than the grace period."""
    cutoff = utc_now() - timedelta(seconds=older_than_seconds)
    query: dict[str, Any] = {"IndexName": STATUS_INDEX, "KeyConditionExpression": Key("status").eq(PENDING)}
    found = []
    for item in state_store.query_all(
        table_name(TRACKING), keep=lambda i: i["file_key"].startswith(etl_keys.MANIFEST_PREFIX), **query
    ):
        if dates is not None and item["date_prefix"] not in dates:
            continue
        if datetime.fromisoformat(item["created_at"]) > cutoff:
            continue
        name = etl_keys.manifest_name_from_record_key(item["file_key"])
        found.append(ManifestRef(item["date_prefix"], name, item["manifest_path"], int(item.get("file_count", 0))))
    return sorted(found, key=lambda r: (r.date_prefix, r.manifest_name))


# --------------------------------------------------------------------------- orphan flush


def orphan_dates(config: EtlSettings, today: str) -> dict[str, int]:
    """Pending files of dates before ``today``, across every ``pending#N`` shard and legacy ``pending``."""
    counts: dict[str, int] = {}
    statuses = [etl_keys.sharded_status(PENDING, n) for n in range(config.num_status_shards)] + [PENDING]
    for status in statuses:
        for item in state_store.query_all(
            table_name(TRACKING),
            keep=lambda i: not etl_keys.is_meta_record(i["file_key"]),
            IndexName=STATUS_INDEX,
            KeyConditionExpression=Key("status").eq(status) & Key("date_prefix").lt(keys.safe_date(today)),
        ):
            counts[item["date_prefix"]] = counts.get(item["date_prefix"], 0) + 1
    return dict(sorted(counts.items()))
