"""`pipelines etl …`: status by date and status, remediate stuck manifested files, reprocess failed files, release
quarantined files; the merged table's partitions, rows and re-registration."""

from __future__ import annotations

import argparse

from tasks.etl import catalog as etl_catalog
from tasks.etl import ops as etl_ops


def _status(args: argparse.Namespace):
    if args.date:
        return etl_ops.status_by_date(args.date, args.status)
    if not args.status:
        raise ValueError("give --date YYYY-MM-DD, --status STATUS, or both")
    return {"status": args.status, "files_per_date": etl_ops.files_with_status(args.status, args.before)}


def register(subparsers) -> None:
    """Add the ``etl`` subcommands: status, remediate, reprocess, release-quarantine, partitions, rows, register."""
    group = subparsers.add_parser("etl", help="NDJSON→Parquet ETL (seed 001) records").add_subparsers(
        dest="command", required=True
    )

    status = group.add_parser("status", help="files by status for a date, or files in a status across dates")
    status.add_argument("--date", help="YYYY-MM-DD")
    status.add_argument("--status", choices=["pending", "manifested", "completed", "failed", "quarantined"])
    status.add_argument("--before", help="with --status and no --date: only dates before YYYY-MM-DD")
    status.set_defaults(handler=_status)

    remediate = group.add_parser("remediate", help="files stuck in manifested: follow their ended manifest, or release")
    remediate.add_argument("--date", required=True)
    remediate.add_argument(
        "--older-than-minutes", type=float, default=30, help="release claims without a manifest after this"
    )
    remediate.add_argument("--dry-run", action="store_true")
    remediate.set_defaults(handler=lambda a: etl_ops.remediate_manifested(a.date, a.older_than_minutes, a.dry_run))

    reprocess = group.add_parser("reprocess", help="failed files back to pending (the next ingest/flush batches them)")
    reprocess.add_argument("--date", required=True)
    reprocess.add_argument("--file", action="append", dest="files", help="only this file (repeatable)")
    reprocess.add_argument("--dry-run", action="store_true")
    reprocess.set_defaults(handler=lambda a: etl_ops.reprocess_failed(a.date, a.files, a.dry_run))

    release = group.add_parser(
        "release-quarantine",
        help="validate quarantined files again (current settings); those that pass go back to pending",
    )
    release.add_argument("--date", required=True)
    release.add_argument("--file", action="append", dest="files", help="only this file (repeatable)")
    release.add_argument("--dry-run", action="store_true", help="say what would be released, change nothing")
    release.set_defaults(handler=lambda a: etl_ops.release_quarantine(a.date, a.files, a.dry_run))

    partitions = group.add_parser("partitions", help="the merged table's registered partitions (one per date)")
    partitions.set_defaults(handler=lambda a: etl_catalog.registered_partitions())

    rows = group.add_parser("rows", help="rows of the merged table (every registered date, or --date), or SQL over it")
    rows.add_argument("--date", action="append", dest="dates", help="only this date (repeatable)")
    rows.add_argument("--columns", type=lambda v: v.split(","), help="comma-separated columns (default: all)")
    rows.add_argument("--limit", type=int, help="at most this many rows")
    rows.add_argument("--sql", help="a DuckDB query over the table (named as ETL_CATALOG_TABLE: merged_parquet)")
    rows.set_defaults(handler=lambda a: etl_catalog.query(a.dates, a.columns, a.limit, a.sql))

    register = group.add_parser(
        "register",
        help="register a date's merged output as a partition again (idempotent; clears its failed registration), "
        "or without --date every date whose registration failed",
    )
    register.add_argument("--date")
    register.set_defaults(
        handler=lambda a: etl_catalog.register_again(a.date) if a.date else etl_catalog.retry_unregistered()
    )
