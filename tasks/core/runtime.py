"""Helpers every pipeline shares about the run it is in: clocks, Prefect run ids, loggers, artifact keys.

A sink like the state store and keys: it imports nothing of the project, and Prefect only inside functions, so
task bodies stay plain functions that run (and are tested) without a Prefect run around them.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta, timezone


def utc_now() -> datetime:
    """The current time, timezone-aware UTC (for arithmetic; store ``now_iso()``)."""
    return datetime.now(timezone.utc)


def now_iso(at: datetime | None = None) -> str:
    """UTC ISO 8601 with microseconds (fixed width, so timestamps sort as strings in DynamoDB conditions)."""
    return (at or utc_now()).astimezone(timezone.utc).isoformat(timespec="microseconds")


def iso_ago(seconds: float) -> str:
    """``now_iso()`` of ``seconds`` ago, for "older than" comparisons against stored timestamps."""
    return now_iso(utc_now() - timedelta(seconds=seconds))


def today_iso() -> str:
    """Today's UTC date, ``YYYY-MM-DD``."""
    return utc_now().date().isoformat()


def prefect_ids() -> dict[str, str]:
    """``prefect_flow_run_id`` / ``prefect_task_run_id`` of the current run, as strings; empty outside Prefect."""
    from prefect.runtime import flow_run, task_run

    ids = {"prefect_flow_run_id": flow_run.id, "prefect_task_run_id": task_run.id}
    return {name: str(value) for name, value in ids.items() if value}


def run_logger(name: str) -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a flow/task run (so messages show in the UI), else a standard logger."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # MissingContextError outside a run
        return logging.getLogger(name)


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key from ``parts``: lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())
