"""Operations on the ETL's records (the seed's pipeline-status, remediate-manifested-files, reprocess-failed;
release-quarantine).

Every change is a guarded transition through ``tasks.core.state_store``; the shard suffix is kept.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from boto3.dynamodb.conditions import Key

from tasks.core import keys, state_store
from tasks.core.config import table_name
from tasks.core.runtime import now_iso, utc_now
from tasks.etl import keys as etl_keys
from tasks.etl.ingest import (
    COMPLETED,
    FAILED,
    MANIFESTED,
    PENDING,
    QUARANTINED,
    STATUS_INDEX,
    TRACKING,
    base_status,
    file_records,
    revalidate_quarantined,
    settings,
    tracking_key,
    validate_file,
    with_shard,
)


def manifest_records(date_prefix: str) -> list[dict[str, Any]]:
    """The ``MANIFEST#`` records of a date (selected in code, never with a key in a FilterExpression)."""
    return list(
        state_store.query_all(
            table_name(TRACKING),
            keep=lambda item: item["file_key"].startswith(etl_keys.MANIFEST_PREFIX),
            KeyConditionExpression=Key("date_prefix").eq(keys.safe_date(date_prefix)),
        )
    )


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
            (
                {"file_key": f["file_key"], "status": f["status"], "error_message": f.get("error_message", "")}
                for f in files
                if base_status(f) == status
            ),
            key=lambda f: f["file_key"],
        )
    return report


def files_with_status(status: str, before: str | None = None) -> dict[str, int]:
    """Files in ``status`` per date across every shard of ``status-index`` (dates before ``before`` if given)."""
    counts: Counter[str] = Counter()
    for value in [etl_keys.sharded_status(status, n) for n in range(settings().num_status_shards)] + [status]:
        condition = Key("status").eq(value)
        if before:
            condition = condition & Key("date_prefix").lt(keys.safe_date(before))
        for item in state_store.query_all(
            table_name(TRACKING),
            keep=lambda i: not etl_keys.is_meta_record(i["file_key"]),
            IndexName=STATUS_INDEX,
            KeyConditionExpression=condition,
        ):
            counts[item["date_prefix"]] += 1
    return dict(sorted(counts.items()))


def remediate_manifested(
    date_prefix: str, placeholder_older_than_minutes: float = 30, dry_run: bool = False
) -> dict[str, Any]:
    """Files stuck in ``manifested#N``: follow their manifest's end (completed/failed), or release to ``pending#N``
    when the manifest never came to exist (a claim whose writer died). Manifests still running are left alone."""
    manifests = {m["manifest_path"]: m for m in manifest_records(date_prefix)}
    cutoff = utc_now() - timedelta(minutes=placeholder_older_than_minutes)
    changes, left = [], 0
    for item in file_records(keys.safe_date(date_prefix)):
        if base_status(item) != MANIFESTED:
            continue
        manifest = manifests.get(item.get("manifest_path", ""))
        if manifest is not None and manifest["status"] in (COMPLETED, FAILED):
            new = with_shard(manifest["status"], item["status"])
            sets = {"updated_at": now_iso(), f"{manifest['status']}_time": now_iso(), "remediated_at": now_iso()}
            if manifest["status"] == FAILED:  # a failed file says why, as one its merge failed itself does
                why = manifest.get("error_message") or "no reason recorded"
                sets["error_message"] = f"its manifest {manifest['manifest_path']} failed: {why}"[:1000]
        elif manifest is None and datetime.fromisoformat(item.get("updated_at", now_iso())) < cutoff:
            new = with_shard(PENDING, item["status"])
            sets = {"updated_at": now_iso(), "manifest_path": "", "remediated_at": now_iso()}
        else:
            left += 1
            continue
        changes.append((tracking_key(date_prefix, item["file_key"]), item["status"], new, sets))
    moved = (
        []
        if dry_run
        else [c for c, r in zip(changes, state_store.transition_many(table_name(TRACKING), changes)) if r.applied]
    )
    return {
        "date_prefix": date_prefix,
        "dry_run": dry_run,
        "candidates": {c[0]["file_key"]: c[2] for c in changes},
        "moved": len(moved),
        "left_in_flight": left,
    }


def reprocess_failed(date_prefix: str, file_keys: list[str] | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Failed files back to ``pending#N`` (guarded), so the next ingest or flush batches them again.

    First the output of every failed manifest those files belong to is removed (a merge that died while
    publishing may have left parts): the files' lines then appear once, from the manifest that takes them next.
    """
    from tasks.etl.merge import unpublish

    wanted = set(file_keys or [])
    failed = [
        f
        for f in file_records(keys.safe_date(date_prefix))
        if base_status(f) == FAILED and (not wanted or f["file_key"] in wanted)
    ]
    missing = sorted(wanted - {f["file_key"] for f in failed})
    if missing:
        raise LookupError(f"not failed (or not tracked) on {date_prefix}: {', '.join(missing)}")
    paths = {f.get("manifest_path") for f in failed}
    dead = sorted(
        etl_keys.manifest_name_from_record_key(m["file_key"])
        for m in manifest_records(date_prefix)
        if m["status"] == FAILED and m.get("manifest_path") in paths
    )
    changes = [
        (
            tracking_key(date_prefix, f["file_key"]),
            f["status"],
            with_shard(PENDING, f["status"]),
            {"updated_at": now_iso(), "manifest_path": "", "reprocessed_at": now_iso()},
        )
        for f in failed
    ]
    removed = 0 if dry_run else sum(unpublish(date_prefix, name, settings().output_store_url) for name in dead)
    results = [] if dry_run else state_store.transition_many(table_name(TRACKING), changes)
    return {
        "date_prefix": date_prefix,
        "dry_run": dry_run,
        "files": sorted(c[0]["file_key"] for c in changes),
        "moved": sum(r.applied for r in results),
        "failed_manifests_unpublished": dead,
        "objects_removed": removed,
    }


def release_dead_claims(older_than_seconds: float = 600.0) -> dict[str, Any]:
    """``remediate_manifested`` for every date with files in ``manifested#N``: claims whose manifest never came
    to exist and older than ``older_than_seconds`` go back to ``pending#N``; ended manifests are followed."""
    dates = files_with_status(MANIFESTED)
    reports = [remediate_manifested(date, older_than_seconds / 60) for date in dates]
    return {
        "dates": dates,
        "moved": sum(r["moved"] for r in reports),
        "left_in_flight": sum(r["left_in_flight"] for r in reports),
    }


def release_quarantine(date_prefix: str, file_keys: list[str] | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Quarantined files of a date validated again with the current settings; those that pass are released
    ``quarantined#N → pending#N`` (guarded on status and the file's recorded version), so the next ingest or
    flush batches them. A file still refused stays quarantined, with the reason."""
    wanted = set(file_keys or [])
    items = [
        f
        for f in file_records(keys.safe_date(date_prefix))
        if base_status(f) == QUARANTINED and (not wanted or f["file_key"] in wanted)
    ]
    missing = sorted(wanted - {f["file_key"] for f in items})
    if missing:
        raise LookupError(f"not quarantined (or not tracked) on {date_prefix}: {', '.join(missing)}")
    config = settings()
    if dry_run:
        checks = {f["file_key"]: validate_file(f["file_path"], config) for f in items}
        return {
            "date_prefix": date_prefix,
            "dry_run": True,
            "would_release": sorted(k for k, c in checks.items() if c.valid),
            "refused": {k: c.reason for k, c in sorted(checks.items()) if not c.valid},
        }
    return {"date_prefix": date_prefix, "dry_run": False, **revalidate_quarantined(items, config, force=True)}
