"""Task bodies of the NDJSON→Parquet ingest (seed 001's manifest_builder), callable without Prefect.

validate → quarantine or track (``pending#N``, idempotent) → claim-first batching (``pending#N →
manifested#N`` per file, released when too few were won) → manifest JSON + ``MANIFEST#`` record → merge
launch. Every status change goes through ``tasks.state_store``; meta-records are filtered in code.
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from boto3.dynamodb.conditions import Key

from blocks import load_config
from blocks.etl import EtlSettings
from tasks import keys, state_store
from tasks.config import object_store, table_name
from tasks.object_store import ObjectNotFound, ObjectStore, open_url

log = logging.getLogger(__name__)

TRACKING = "etl_file_tracking"
METRICS = "etl_metrics"
TRACKING_KEYS = ("date_prefix", "file_key")
STATUS_INDEX = "status-index"
PENDING, MANIFESTED, COMPLETED, FAILED, QUARANTINED, PROCESSING = (
    "pending", "manifested", "completed", "failed", "quarantined", "processing",
)


# --------------------------------------------------------------------------- configuration and helpers


def settings() -> EtlSettings:
    """The ETL settings: saved block or defaults, then environment variables (seed names)."""
    return load_config(EtlSettings)


def store(url: str) -> ObjectStore:
    """A configured store (``url``) or the pipeline's object store when empty."""
    return object_store(url or None)


def now() -> datetime:
    return datetime.now(timezone.utc)


def iso(at: datetime | None = None) -> str:
    return (at or now()).isoformat()


def ttl_epoch(config: EtlSettings) -> int:
    """Expiry of a record written now: ``TTL_DAYS`` ahead, as the seed's Unix timestamp."""
    return int(time.time()) + config.ttl_days * 86400


def run_ids() -> dict[str, str]:
    """``prefect_flow_run_id`` / ``prefect_task_run_id`` of the running flow/task, when there is one."""
    from prefect.runtime import flow_run, task_run

    ids = {"prefect_flow_run_id": flow_run.id, "prefect_task_run_id": task_run.id}
    return {name: str(value) for name, value in ids.items() if value}


def base_status(item: dict[str, Any]) -> str:
    return keys.split_status(str(item.get("status", "")))[0]


def with_shard(status: str, current: str) -> str:
    """``status`` carrying the shard suffix of ``current`` (``manifested#3`` → ``completed#3``); legacy stays bare."""
    shard = keys.split_status(current)[1]
    return status if shard is None else keys.sharded_status(status, shard)


def tracking_key(date_prefix: str, file_key: str) -> dict[str, str]:
    return {"date_prefix": date_prefix, "file_key": file_key}


def record_metric(metric_type: str, values: dict[str, Any], config: EtlSettings | None = None) -> dict[str, Any]:
    """One append-only row in the metrics table (``metric_type`` / ``timestamp`` in µs, with ``ttl``)."""
    config = config or settings()
    item = {"metric_type": metric_type, "timestamp": time.time_ns() // 1000, "ttl": ttl_epoch(config), **values}
    state_store.put(table_name(METRICS), item)
    return item


# --------------------------------------------------------------------------- validation and tracking


@dataclass(frozen=True)
class FileCheck:
    """One input file's validation: where it is, its tracking key, and why it is refused (None: valid)."""

    url: str
    date_prefix: str
    filename: str
    size: int | None
    reason: str | None = None

    @property
    def valid(self) -> bool:
        return self.reason is None


def landing_urls(landing_url: str) -> list[str]:
    """Every ``.ndjson``-or-not object under a landing prefix (validation decides), as URLs."""
    landing = store(landing_url)
    return [landing.url_for(key) for key in landing.list("")]


def validate_file(url: str, config: EtlSettings) -> FileCheck:
    """The seed's checks: path under ``pipeline/input/YYYY-MM-DD/``, ``.ndjson`` extension, size within tolerance."""
    try:
        parsed = keys.parse_input_path(url.split("?", 1)[0])
    except keys.InvalidKey as error:
        return FileCheck(url, keys.UNDATED_PREFIX, keys.undated_file_key(url), None, f"unparseable input path: {error}")
    try:
        source, key = open_url(url)
        size = source.size(key)
    except (ObjectNotFound, FileNotFoundError):
        return FileCheck(url, parsed.date_prefix, parsed.filename, None, "file not found (deleted before ingest?)")
    if not parsed.filename.endswith(".ndjson"):
        return FileCheck(url, parsed.date_prefix, parsed.filename, size, "wrong extension: expected .ndjson")
    if size == 0:
        return FileCheck(url, parsed.date_prefix, parsed.filename, size, "empty file (0 bytes)")
    low, high = config.size_bounds_bytes()
    if not low <= size <= high:
        return FileCheck(
            url, parsed.date_prefix, parsed.filename, size,
            f"size {size} bytes outside {config.expected_file_size_mb} MB ± {config.size_tolerance_percent}% "
            f"({int(low)}..{int(high)} bytes)",
        )
    return FileCheck(url, parsed.date_prefix, parsed.filename, size)


def validate_files(urls: Sequence[str], config: EtlSettings) -> list[FileCheck]:
    """``validate_file`` for a batch of file events."""
    return [validate_file(url, config) for url in urls]


def _file_item(check: FileCheck, status: str, config: EtlSettings, **extra: Any) -> dict[str, Any]:
    shard = keys.status_shard(check.filename, config.num_status_shards)
    stamp = iso()
    item = {
        "date_prefix": check.date_prefix,
        "file_key": check.filename,
        "file_path": check.url,
        "status": keys.sharded_status(status, shard),
        "shard_id": shard,
        "created_at": stamp,
        "updated_at": stamp,
        "ttl": ttl_epoch(config),
        **extra,
    }
    if check.size is not None:
        item["file_size_mb"] = round(check.size / (1024 * 1024), 6)
    return item


def quarantine_files(checks: Sequence[FileCheck], config: EtlSettings) -> list[dict[str, Any]]:
    """Copy refused files (when they exist) and a reason file to quarantine; track them ``quarantined#N``.

    Nothing is deleted from the input. Idempotent: a file already tracked keeps its first record.
    """
    target = store(config.quarantine_store_url)
    items = []
    for check in checks:
        if check.date_prefix == keys.UNDATED_PREFIX:
            key = keys.undated_quarantine_key(check.url)
        else:
            key = keys.quarantine_key(check.date_prefix, check.filename)
        reason = {"file_path": check.url, "reason": check.reason, "size_bytes": check.size, "quarantined_at": iso()}
        copied = None
        if check.size is not None:  # it exists: keep its bytes
            source, source_key = open_url(check.url)
            copied = target.put_bytes(key, source.get_bytes(source_key))
        target.put_bytes(key + ".reason.json", json.dumps(reason, indent=2).encode())
        items.append(_file_item(check, QUARANTINED, config, error_message=check.reason[:1000], quarantine_path=copied or ""))
    results = state_store.create_many_if_absent(table_name(TRACKING), items, TRACKING_KEYS)
    return [dict(item, outcome=r.outcome.value) for item, r in zip(items, results)]


def track_files(checks: Sequence[FileCheck], config: EtlSettings) -> dict[str, Any]:
    """Create ``pending#N`` records for valid files (``attribute_not_exists``): duplicates change nothing."""
    items = [_file_item(check, PENDING, config) for check in checks]
    results = state_store.create_many_if_absent(table_name(TRACKING), items, TRACKING_KEYS)
    new = [item for item, r in zip(items, results) if r.applied]
    return {
        "tracked": len(new),
        "new_files": {d: [i["file_key"] for i in new if i["date_prefix"] == d] for d in sorted({i["date_prefix"] for i in new})},
        "already_tracked": len(items) - len(new),
        "dates": sorted({item["date_prefix"] for item in items}),
    }


# --------------------------------------------------------------------------- claim-first batching


def file_records(date_prefix: str, consistent: bool = True, **query: Any) -> Iterator[dict[str, Any]]:
    """Every file record of a date (meta-records filtered in code, never in a FilterExpression)."""
    return state_store.query_all(
        table_name(TRACKING),
        keep=lambda item: not keys.is_meta_record(item["file_key"]),
        KeyConditionExpression=Key("date_prefix").eq(date_prefix),
        ConsistentRead=consistent,
        **query,
    )


def pending_files(date_prefix: str) -> list[dict[str, Any]]:
    """Pending file records of a date, oldest name first (a stable order keeps concurrent claimers apart)."""
    return [item for item in file_records(date_prefix) if base_status(item) == PENDING]


def _claim(items: Sequence[dict[str, Any]], placeholders: str | Sequence[str]) -> list[dict[str, Any]]:
    """Per-file conditional claims ``pending#N → manifested#N`` (each with its placeholder manifest path):
    the files this caller won."""
    stamp = iso()
    if isinstance(placeholders, str):
        placeholders = [placeholders] * len(items)
    ids = run_ids()
    changes = [
        (tracking_key(i["date_prefix"], i["file_key"]), i["status"], with_shard(MANIFESTED, i["status"]),
         {"manifest_path": path, "updated_at": stamp, "manifested_at": stamp, **ids})
        for i, path in zip(items, placeholders)
    ]
    results = state_store.transition_many(table_name(TRACKING), changes)
    return [dict(item, status=change[2], manifest_path=change[3]["manifest_path"])
            for item, change, r in zip(items, changes, results) if r.applied]


def release(items: Sequence[dict[str, Any]]) -> int:
    """Give claimed files back: ``manifested#N → pending#N`` (guarded). Returns how many moved."""
    changes = [
        (tracking_key(i["date_prefix"], i["file_key"]), i["status"], with_shard(PENDING, i["status"]),
         {"manifest_path": "", "updated_at": iso()})
        for i in items
    ]
    return sum(r.applied for r in state_store.transition_many(table_name(TRACKING), changes))


def next_sequences(date_prefix: str, count: int = 1) -> list[int]:
    """``count`` fresh manifest numbers for a date (one atomic ADD on a meta-record), so names never collide."""
    table = table_name(TRACKING)
    key = tracking_key(date_prefix, keys.MANIFEST_SEQUENCE_KEY)
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
    created = now()
    target = store(config.manifest_store_url)
    names = [keys.manifest_name(sequence, created) for sequence in next_sequences(date_prefix, count)]
    return [(name, target.url_for(keys.manifest_key(date_prefix, name))) for name in names]


def write_manifests(
    date_prefix: str, groups: Sequence[tuple[str, str, Sequence[dict[str, Any]]]], config: EtlSettings, partial: bool
) -> list[ManifestRef]:
    """For each (name, path, claimed files): the manifest JSON (``fileLocations[].URIPrefixes[]``), its
    ``MANIFEST#`` record (``pending``), and, for files claimed under another placeholder, their
    ``manifest_path`` moved to this manifest (guarded on ``manifested#N``)."""
    if not groups:
        return []
    created = iso()
    target = store(config.manifest_store_url)
    refs, records, changes = [], [], []
    for name, path, files in groups:
        urls = [item["file_path"] for item in sorted(files, key=lambda i: i["file_key"])]
        is_partial = partial or len(urls) < config.max_files_per_manifest
        document = {
            "fileLocations": [{"URIPrefixes": urls}],
            "date_prefix": date_prefix,
            "manifest_name": name,
            "file_count": len(urls),
            "partial_batch": is_partial,
            "created_at": created,
        }
        target.put_bytes(keys.manifest_key(date_prefix, name), json.dumps(document, indent=2).encode())
        records.append({
            **tracking_key(date_prefix, keys.manifest_record_key(name)),
            "status": PENDING,
            "manifest_path": path,
            "file_count": len(urls),
            "partial_batch": is_partial,
            "created_at": created,
            "updated_at": created,
            "ttl": ttl_epoch(config),
        })
        changes += [(tracking_key(i["date_prefix"], i["file_key"]), i["status"], None, {"manifest_path": path})
                    for i in files if i.get("manifest_path") != path]
        refs.append(ManifestRef(date_prefix, name, path, len(urls)))
    state_store.create_many_if_absent(table_name(TRACKING), records, TRACKING_KEYS)
    if changes:
        state_store.transition_many(table_name(TRACKING), changes)
    return refs


def _regroup(
    held: list[dict[str, Any]], size: int, date_prefix: str, config: EtlSettings, used: set[str]
) -> list[tuple[str, str, list]]:
    """Groups of ``size`` taken from ``held`` (files won under several placeholders), each named after its most
    common placeholder (fewest path updates) or, when that one is ``used`` already, a fresh name."""
    groups = []
    while len(held) >= size:
        files, held[:] = held[:size], held[size:]
        path = max({f["manifest_path"] for f in files}, key=lambda p: sum(f["manifest_path"] == p for f in files))
        if path in used:
            name, path = reserve_manifests(date_prefix, 1, config)[0]
        else:
            name = path.rsplit("/", 1)[1]
        used.add(path)
        groups.append((name, path, files))
    return groups


def create_manifests(
    date_prefix: str, threshold: int, config: EtlSettings, partial: bool = False, attempts: int = 3, claim_size: int = 100,
    prefer: Sequence[str] = (),
) -> list[ManifestRef]:
    """Claim-first batching of one date: batches of ``MAX_FILES_PER_MANIFEST``, none smaller than ``threshold``.

    Manifest names are reserved first (an atomic counter); each file is then claimed with a per-file
    conditional write (``pending#N → manifested#N``) whose placeholder ``manifest_path`` is where its manifest
    will be written, up to ``claim_size`` per transaction, so concurrent callers never share a file. Batches
    won whole are written as they are; the files of broken batches are regrouped (their paths updated), and
    whatever is left below ``threshold`` is released (``manifested#N → pending#N``) and, after a jittered pause,
    the date is looked at again. Each caller claims the files it tracked itself first (``prefer``: file keys),
    then the others from a random point of the pending list, away from concurrent callers.
    """
    batch_size = config.max_files_per_manifest
    threshold = max(1, min(threshold, batch_size))
    step = max(batch_size, claim_size - claim_size % batch_size)
    made: list[ManifestRef] = []
    for attempt in range(attempts):
        pending = pending_files(date_prefix)
        if len(pending) < threshold:
            break
        start = random.randrange(len(pending))
        mine = set(prefer)
        pending = sorted(pending[start:] + pending[:start], key=lambda item: item["file_key"] not in mine)
        held: list[dict[str, Any]] = []
        used: set[str] = set()
        for offset in range(0, len(pending), step):
            chunk = pending[offset:offset + step]
            slots = reserve_manifests(date_prefix, -(-len(chunk) // batch_size), config)
            won = _claim(chunk, [slots[i // batch_size][1] for i in range(len(chunk))])
            groups = []
            for name, path in slots:
                files = [f for f in won if f["manifest_path"] == path]
                if len(files) == batch_size:
                    groups.append((name, path, files))
                    used.add(path)
                else:
                    held += files
            groups += _regroup(held, batch_size, date_prefix, config, used)
            made += write_manifests(date_prefix, groups, config, partial)
        if len(held) >= threshold:
            made += write_manifests(date_prefix, _regroup(held, len(held), date_prefix, config, used), config, partial=True)
        elif held:
            release(held)
            time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
            continue
        break
    return made


# --------------------------------------------------------------------------- launching merges


Launcher = Callable[[ManifestRef], Any]


def launch_merges(manifests: Iterable[ManifestRef], launcher: Launcher) -> list[dict[str, Any]]:
    """Start one merge per manifest; a launch that fails leaves the manifest ``pending`` (restarted later)."""
    outcomes = []
    for ref in manifests:
        try:
            started = launcher(ref)
            outcomes.append({**asdict(ref), "launched": True, "run": str(started) if started is not None else None})
        except Exception as error:  # noqa: BLE001 - the manifest stays pending; the next ingest or flush starts it
            log.warning("could not start the merge of %s (%s); it stays pending for the next ingest/flush", ref.manifest_name, error)
            outcomes.append({**asdict(ref), "launched": False, "error": f"{type(error).__name__}: {error}"})
    return outcomes


def deployment_launcher(deployment: str) -> Launcher:
    """A launcher that runs the ``ndjson-merge`` deployment without waiting (``timeout=0``)."""

    def launch(ref: ManifestRef) -> str:
        from prefect.deployments import run_deployment

        run = run_deployment(
            name=deployment,
            parameters={"date_prefix": ref.date_prefix, "manifest_name": ref.manifest_name},
            timeout=0,
        )
        return str(run.id)

    return launch


def pending_manifests(older_than_seconds: float = 0, dates: Sequence[str] | None = None) -> list[ManifestRef]:
    """``MANIFEST#`` records still ``pending`` (never started) and older than the grace period."""
    cutoff = now() - timedelta(seconds=older_than_seconds)
    query: dict[str, Any] = {"IndexName": STATUS_INDEX, "KeyConditionExpression": Key("status").eq(PENDING)}
    found = []
    for item in state_store.query_all(table_name(TRACKING), keep=lambda i: i["file_key"].startswith(keys.MANIFEST_PREFIX), **query):
        if dates is not None and item["date_prefix"] not in dates:
            continue
        if datetime.fromisoformat(item["created_at"]) > cutoff:
            continue
        name = keys.manifest_name_from_record_key(item["file_key"])
        found.append(ManifestRef(item["date_prefix"], name, item["manifest_path"], int(item.get("file_count", 0))))
    return sorted(found, key=lambda r: (r.date_prefix, r.manifest_name))


# --------------------------------------------------------------------------- orphan flush


def orphan_dates(config: EtlSettings, today: str) -> dict[str, int]:
    """Pending files of dates before ``today``, across every ``pending#N`` shard and legacy ``pending``."""
    counts: dict[str, int] = {}
    statuses = [keys.sharded_status(PENDING, n) for n in range(config.num_status_shards)] + [PENDING]
    for status in statuses:
        for item in state_store.query_all(
            table_name(TRACKING),
            keep=lambda i: not keys.is_meta_record(i["file_key"]),
            IndexName=STATUS_INDEX,
            KeyConditionExpression=Key("status").eq(status) & Key("date_prefix").lt(keys.safe_date(today)),
        ):
            counts[item["date_prefix"]] = counts.get(item["date_prefix"], 0) + 1
    return dict(sorted(counts.items()))
