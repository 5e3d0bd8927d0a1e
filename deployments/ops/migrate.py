"""`pipelines migrate`: the release's data migrations (tasks/core/migrations.py), and the copy of a table into one
of a new schema (the step a change DynamoDB cannot make in place needs)."""

from __future__ import annotations

import argparse


def migrate(args: argparse.Namespace) -> dict:
    """Run the pending migrations (``--dry-run``: say what would run), or copy one table (``--copy-table``)."""
    from tasks.core import migrations  # the stack the environment names (`source .data/env`, or AWS's)

    if args.copy_table:
        logical, target = args.copy_table
        if args.dry_run:
            return {"would copy": logical, "into": target}
        return migrations.copy_table(logical, target)
    return migrations.run(dry_run=args.dry_run)


def register(subparsers) -> None:
    """Add ``migrate``."""
    command = subparsers.add_parser("migrate", help="apply the release's data migrations (make up runs them too)")
    command.add_argument("--dry-run", action="store_true", help="say what would run; change nothing")
    command.add_argument(
        "--copy-table",
        nargs=2,
        metavar=("LOGICAL", "NEW_TABLE"),
        help="create NEW_TABLE with LOGICAL's schema of this version and copy every item into it (resumable)",
    )
    command.set_defaults(handler=migrate)
