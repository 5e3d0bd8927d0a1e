"""`records` commands: granule/execution records, the dead-letter archive, and reconciliation.

python -m deployments.cli records ingest --file messages.json      # a JSON list, or one message per line
python -m deployments.cli records granule G1                    # or --granule-id G1
python -m deployments.cli records execution ARN                 # or --arn ARN
python -m deployments.cli records dla-list [--day 2026-01-31] [--failed]
python -m deployments.cli records dla-show msg-… --day 2026-01-31   # or --id msg-…
python -m deployments.cli records replay --day 2026-01-31 [--id msg-… ...]
python -m deployments.cli records reconcile [--pipeline phspectra ...] [--apply]   # dry run unless --apply
"""

from __future__ import annotations

from pathlib import Path

from deployments.ops import key_argument
from tasks import reconcile
from tasks.core import config, state_store
from tasks.core.keys import safe_date
from tasks.core.runtime import today_iso
from tasks.records import dead_letter
from tasks.records import messages as records_messages
from tasks.records.keys import dead_letter_failed_key, dead_letter_id, dead_letter_key, dead_letter_prefix


def _ingest(args):
    return records_messages.ingest_messages(records_messages.batch_from_bytes(Path(args.file).read_bytes(), args.file))


def _get(logical: str, key: dict) -> dict:
    item = state_store.get_item(config.table_name(logical), key)
    if item is None:
        raise LookupError(f"no {logical} record {key}")
    return state_store.to_plain(item)


def _dla_list(args):
    store = config.object_store()
    prefix = dead_letter_prefix(safe_date(args.day), failed=args.failed)
    listing = []
    for key in store.list(prefix):
        if "/" in key[len(prefix) :]:
            continue
        entry = dead_letter.read(key, store)
        listing.append(
            {"id": dead_letter_id(key), "key": key, "error": entry.get("error"), "attempts": entry.get("attempts")}
        )
    return listing


def _dla_show(args):
    key = (dead_letter_failed_key if args.failed else dead_letter_key)(args.day, args.id)  # validates day and id
    store = config.object_store()
    if not store.exists(key):
        raise LookupError(f"no archived message {key}")
    return dead_letter.read(key, store)


def _replay(args):
    return records_messages.replay_archive(safe_date(args.day), args.id or None)


def _reconcile(args):
    return reconcile.rows(reconcile.reconcile(args.pipeline or None, dry_run=not args.apply))


def register(subparsers) -> None:
    """Add the ``records`` command group and its subcommands to the CLI."""
    group = subparsers.add_parser(
        "records", help="granule/execution records, dead-letter archive, reconciliation (seed 004)"
    )
    commands = group.add_subparsers(dest="command", required=True)

    def command(name, handler, help_text):
        """A new ``records`` subcommand parser that runs ``handler``."""
        parser = commands.add_parser(name, help=help_text)
        parser.set_defaults(handler=handler)
        return parser

    command("ingest", _ingest, "write the records of workflow messages from a file").add_argument(
        "--file", required=True
    )
    key_argument(
        command("granule", lambda a: _get("granules", {"granuleId": a.granule_id}), "one granule record"),
        "granule_id",
        "--granule-id",
    )
    key_argument(
        command("execution", lambda a: _get("executions", {"arn": a.arn}), "one execution record"), "arn", "--arn"
    )
    for name, handler, help_text in (
        ("dla-list", _dla_list, "archived messages of a day, with their errors"),
        ("dla-show", _dla_show, "one archived message"),
    ):
        parser = command(name, handler, help_text)
        parser.add_argument("--day", default=today_iso(), help="YYYY-MM-DD (default: today, UTC)")
        parser.add_argument("--failed", action="store_true", help="the failed/ archive (failed again on replay)")
        if name == "dla-show":
            key_argument(parser, "id", "--id", "message id")
    replay = command(
        "replay", _replay, "reprocess archived messages: written ones deleted, failed ones moved to failed/"
    )
    replay.add_argument("--day", required=True)
    replay.add_argument("--id", action="append", help="only this message id (repeatable)")
    rec = command("reconcile", _reconcile, "compare Prefect run states with the records (dry run unless --apply)")
    rec.add_argument(
        "--pipeline",
        action="append",
        help=f"adapter name (repeatable); known: {', '.join(sorted(reconcile.adapters()))}",
    )
    rec.add_argument("--apply", action="store_true", help="repair through guarded transitions")
