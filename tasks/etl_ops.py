"""Operations on the ETL's records (the seed's pipeline-status, remediate-manifested-files and reprocess-failed).

Every change is a guarded transition through ``tasks.state_store``; the shard suffix is kept.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from boto3.dynamodb.conditions import Key

from tasks import keys, state_store
from tasks.config import table_name
from tasks.etl import (
    COMPLETED, FAILED, MANIFESTED, PENDING, STATUS_INDEX, TRACKING, base_status, file_records, iso, now, settings,
    tracking_key, with_shard,
)


def manifest_records(date_prefix: str) -> list[dict[str, Any]]:
    """The ``MANIFEST#`` records of a date (selected in code, never with a key in a FilterExpression)."""
    return list(state_store.query_all(
        table_name(TRACKING),
        keep=lambda item: item["file_key"].startswith(keys.MANIFEST_PREFIX),
        KeyConditionExpression=Key("date_prefix").eq(keys.safe_date(date_prefix)),
    ))


def status_by_date(date_prefix: str, status: str | None = None) -> dict[str, Any]:
    """Counts of a date's files by status (shards summed) and its manifests; with ``status``, those files too."""
    files = list(file_records(keys.safe_date(date_prefix)))
    report: dict[str, Any] = {
        "date_prefix": date_prefix,
        "files": dict(sorted(Counter(base_status(f) for f in files).items())),
        "manifests": {m["file_key"]: m["status"] for m in manifest_records(date_prefix)},
    }
    if status:
        report["selected"] = sorted(
            ({"file_key": f["file_key"], "status": f["status"], "error_message": f.get("error_message", "")}
             for f in files if base_status(f) == status), key=lambda f: f["file_key"],
        )
    return report


def files_with_status(status: str, before: str | None = None) -> dict[str, int]:
    """Files in ``status`` per date across every shard of ``status-index`` (dates before ``before`` if given)."""
    counts: Counter[str] = Counter()
    for value in [keys.sharded_status(status, n) for n in range(settings().num_status_shards)] + [status]:
        condition = Key("status").eq(value)
        if before:
            condition = condition & Key("date_prefix").lt(keys.safe_date(before))
        for item in state_store.query_all(
            table_name(TRACKING), keep=lambda i: not keys.is_meta_record(i["file_key"]),
            IndexName=STATUS_INDEX, KeyConditionExpression=condition,
        ):
            counts[item["date_prefix"]] += 1
    return dict(sorted(counts.items()))


def remediate_manifested(date_prefix: str, placeholder_older_than_minutes: float = 30, dry_run: bool = False) -> dict[str, Any]:
    """Files stuck in ``manifested#N``: follow their manifest's end (completed/failed), or release to ``pending#N``
    when the manifest never came to exist (a claim whose writer died). Manifests still running are left alone."""
    manifests = {m["manifest_path"]: m for m in manifest_records(date_prefix)}
    cutoff = now() - timedelta(minutes=placeholder_older_than_minutes)
    changes, left = [], 0
    for item in file_records(keys.safe_date(date_prefix)):
        if base_status(item) != MANIFESTED:
            continue
        manifest = manifests.get(item.get("manifest_path", ""))
        if manifest is not None and manifest["status"] in (COMPLETED, FAILED):
            new = with_shard(manifest["status"], item["status"])
            sets = {"updated_at": iso(), f"{manifest['status']}_time": iso(), "remediated_at": iso()}
        elif manifest is None and datetime.fromisoformat(item.get("updated_at", iso())) < cutoff:
            new = with_shard(PENDING, item["status"])
            sets = {"updated_at": iso(), "manifest_path": "", "remediated_at": iso()}
        else:
            left += 1
            continue
        changes.append((tracking_key(date_prefix, item["file_key"]), item["status"], new, sets))
    moved = [] if dry_run else [c for c, r in zip(changes, state_store.transition_many(table_name(TRACKING), changes)) if r.applied]
    return {
        "date_prefix": date_prefix,
        "dry_run": dry_run,
        "candidates": {c[0]["file_key"]: c[2] for c in changes},
        "moved": len(moved),
        "left_in_flight": left,
    }


def reprocess_failed(date_prefix: str, file_keys: list[str] | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Failed files back to ``pending#N`` (guarded), so the next ingest or flush batches them again."""
    wanted = set(file_keys or [])
    changes = [
        (tracking_key(date_prefix, f["file_key"]), f["status"], with_shard(PENDING, f["status"]),
         {"updated_at": iso(), "manifest_path": "", "reprocessed_at": iso()})
        for f in file_records(keys.safe_date(date_prefix))
        if base_status(f) == FAILED and (not wanted or f["file_key"] in wanted)
    ]
    missing = sorted(wanted - {c[0]["file_key"] for c in changes})
    if missing:
        raise LookupError(f"not failed (or not tracked) on {date_prefix}: {', '.join(missing)}")
    results = [] if dry_run else state_store.transition_many(table_name(TRACKING), changes)
    return {
        "date_prefix": date_prefix,
        "dry_run": dry_run,
        "files": sorted(c[0]["file_key"] for c in changes),
        "moved": sum(r.applied for r in results),
    }
