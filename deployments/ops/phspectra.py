"""`phspectra` commands: the seed's five access patterns on `phspectra-runs`.

    python -m deployments.cli phspectra get-run RUN
    python -m deployments.cli phspectra list-chunks RUN
    python -m deployments.cli phspectra latest-run --survey grs-15 [--not-before 2026-01-01T00:00:00]
    python -m deployments.cli phspectra stuck-chunks RUN [--minutes 15]
    python -m deployments.cli phspectra failures RUN

and the survey over its tiles (one run per tile):

    python -m deployments.cli phspectra survey-status --survey grs-15
    python -m deployments.cli phspectra catalog --survey grs-15 [--tile T] [--min-amplitude 1.5] [--limit 20]
    python -m deployments.cli phspectra build-catalog --survey grs-15 [--force]

The run id may also be given as ``--run-id RUN``.
"""

from __future__ import annotations

import argparse

from deployments.ops import key_argument
from tasks.core.state_store import to_plain
from tasks.phspectra import catalog
from tasks.phspectra import survey as ph
from tasks.phspectra.survey_status import survey_status


def _get_run(args):
    run = ph.get_run(args.run_id)
    if run is None:
        raise LookupError(f"no run {args.run_id}")
    return to_plain(run)


def _latest_run(args):
    run = ph.latest_run(args.survey, args.not_before)
    if run is None:
        raise LookupError(f"no run for survey {args.survey}" + (f" since {args.not_before}" if args.not_before else ""))
    return to_plain(run)


def _failures(args):
    return [
        {k: c.get(k) for k in ("SK", "status", "error", "started_at", "failed_at", "duration_ms", "attempts")}
        for c in to_plain(ph.failures(args.run_id))
    ]


def register(subparsers) -> None:
    """Add the ``phspectra`` subcommands: the seed's five access patterns, a survey's status and its catalog."""
    group = subparsers.add_parser("phspectra", help="PHSpectra survey runs and chunks (seed 000)")
    commands = group.add_subparsers(dest="command", required=True)

    def command(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        """Add subcommand ``name`` that runs ``handler``; returns its parser for the arguments."""
        parser = commands.add_parser(name, help=help_text)
        parser.set_defaults(handler=handler)
        return parser

    key_argument(command("get-run", _get_run, "1. the run item"), "run_id", "--run-id")
    key_argument(
        command("list-chunks", lambda a: to_plain(ph.list_chunks(a.run_id)), "2. every chunk of a run"),
        "run_id",
        "--run-id",
    )
    latest = command("latest-run", _latest_run, "3. most recent run of a survey (GSI1)")
    latest.add_argument("--survey", required=True)
    latest.add_argument("--not-before", default=None, help="ISO timestamp: only runs created at or after it")
    stuck = command(
        "stuck-chunks",
        lambda a: to_plain(ph.stuck_chunks(a.run_id, a.minutes * 60)),
        "4. chunks IN_PROGRESS for longer than --minutes",
    )
    key_argument(stuck, "run_id", "--run-id")
    stuck.add_argument("--minutes", type=float, default=15.0)
    key_argument(command("failures", _failures, "5. FAILED chunks with their errors"), "run_id", "--run-id")
    status = command(
        "survey-status",
        lambda a: survey_status(a.survey),
        "a survey's tiles: completed / failed / running, spectra fitted",
    )
    status.add_argument("--survey", required=True)
    query = command(
        "catalog",
        lambda a: catalog.query_catalog(a.survey, a.tile, a.min_amplitude, a.limit or None),
        "components of a survey's catalog",
    )
    query.add_argument("--survey", required=True)
    query.add_argument("--tile", default=None, help="only this tile's components")
    query.add_argument("--min-amplitude", type=float, default=None, help="only components at least this bright")
    query.add_argument("--limit", type=int, default=100, help="at most this many rows (default 100; 0: every row)")
    build = command(
        "build-catalog", lambda a: catalog.build_catalog(a.survey, force=a.force), "(re)build a survey's catalog now"
    )
    build.add_argument("--survey", required=True)
    build.add_argument("--force", action="store_true", help="rewrite every tile, not only the changed ones")
