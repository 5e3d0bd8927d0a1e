"""`pipelines migrate`: the release's data migrations (tasks/core/migrations.py), and the copy of a table into one
of a new schema (the step a change DynamoDB cannot make in place needs)."""

from __future__ import annotations

import argparse


def migrate(args: argparse.Namespace) -> dict:
    """Run the pending migrations (``--dry-run``: say what would run)."""
    from tasks.core import migrations  # the stack the environment names (`source .data/local.env`, or AWS's)

    return migrations.run(dry_run=args.dry_run)


def copy_table(args: argparse.Namespace) -> dict:
    """Copy one table's items into a new table of this version's schema (``--dry-run``: say what would)."""
    from tasks.core import migrations

    if args.dry_run:
        return {"would copy": args.logical, "into": args.new_table}
    return migrations.copy_table(args.logical, args.new_table)


def register(subparsers) -> None:
    """Add ``migrate`` (alone: the pending migrations) and ``migrate copy-table``."""
    group = subparsers.add_parser("migrate", help="apply the release's data migrations (make up runs them too)")
    group.add_argument("--dry-run", action="store_true", help="say what would run; change nothing")
    group.set_defaults(handler=migrate)
    commands = group.add_subparsers(dest="command")  # optional: `pipelines migrate` runs the migrations
    copy = commands.add_parser(
        "copy-table", help="create NEW_TABLE with LOGICAL's schema of this version and copy every item (resumable)"
    )
    copy.add_argument("logical", metavar="LOGICAL", help="the logical table (its items are read from its current name)")
    copy.add_argument("new_table", metavar="NEW_TABLE")
    copy.add_argument("--dry-run", action="store_true", help="say what would be copied; change nothing")
    copy.set_defaults(handler=copy_table)
