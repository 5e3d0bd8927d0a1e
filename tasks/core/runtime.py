"""Helpers every pipeline shares about the run it is in: clocks, Prefect run ids, loggers, artifact keys.

A sink like the state store and keys: it imports nothing of the project, and Prefect only inside functions, so
task bodies stay plain functions that run (and are tested) without a Prefect run around them.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any


def utc_now() -> datetime:
    """The current time, timezone-aware UTC (for arithmetic; store ``now_iso()``)."""
    return datetime.now(UTC)


def now_iso(at: datetime | None = None) -> str:
    """UTC ISO 8601 with microseconds (fixed width, so timestamps sort as strings in DynamoDB conditions)."""
    return (at or utc_now()).astimezone(UTC).isoformat(timespec="microseconds")


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


def own_deployment() -> str | None:
    """``flow/deployment`` of the flow run this runs in when a deployment made it (None: a plain call, a subflow)."""
    from prefect.runtime import deployment, flow_run

    name = deployment.name
    return f"{flow_run.flow_name}/{name}" if name else None


def start_deployment_run(
    deployment: str, parameters: dict[str, Any], idempotency_key: str, at: datetime | None = None
) -> str:
    """Create one run of ``deployment`` (Scheduled for ``at``, default now; not waiting for it); the same
    ``idempotency_key`` again returns the same run.

    The Prefect server keeps one flow run per (flow, idempotency key), so a caller that crashed after creating the
    run and asks again gets the run it created, never a second one. The run is top level, as when a person runs
    `prefect deployment run`, not a child of the caller.
    """
    from prefect.deployments import run_deployment

    run = run_deployment(
        deployment,
        parameters=parameters,
        scheduled_time=at,
        timeout=0,
        idempotency_key=idempotency_key,
        as_subflow=False,
    )
    return str(run.id)


def run_logger(name: str) -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a flow/task run (so messages show in the UI), else a standard logger."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:  # outside a flow or task run
        return logging.getLogger(name)


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key from ``parts``: lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())


def quick_heartbeat_exit() -> None:
    """Sync flow runs end without waiting out their heartbeat thread's sleep (up to a second a run).

    Prefect 3.8's sync engine joins the heartbeat thread at exit, and that thread sleeps in whole seconds, so every
    flow run lasted up to 1 s (0.5 s on average) longer than its work; the async engine does not join. Stopping
    is unchanged (the stop event is set; the daemon thread ends at its next check) and heartbeats are still sent.
    """
    from contextlib import contextmanager

    from prefect import flow_engine

    sending = flow_engine._send_heartbeats
    if getattr(sending, "quick_exit", False):
        return

    @contextmanager
    def send_heartbeats(engine, join_on_exit: bool = True):
        """Prefect's heartbeat context, never joining the heartbeat thread at exit."""
        with sending(engine, join_on_exit=False):
            yield

    send_heartbeats.quick_exit = True
    flow_engine._send_heartbeats = send_heartbeats
