"""What ``pipeline-health`` reads of the phspectra pipeline: stuck chunks, and its dashboard figures."""

from __future__ import annotations

from blocks.health import HealthThresholds
from tasks.core import state_store
from tasks.core.runtime import iso_ago
from tasks.health.checks import Alarm, count_alarm
from tasks.health.dashboard import Figures, Outcomes, Window, ended_since
from tasks.phspectra import survey
from tasks.phspectra.keys import RUN_SK


def phspectra_stuck_chunks(limits: HealthThresholds) -> Alarm:
    """phspectra: chunks of running surveys whose lease expired over ``stuck_chunk_minutes`` ago and that no
    sweep re-drove (a long fit renews its lease and is never stuck)."""
    cutoff = iso_ago(limits.stuck_chunk_minutes * 60)
    stuck = [
        f"{run['PK']}/{chunk['SK']}"
        for run in survey.active_runs()
        for chunk in survey.expired_leases(run["PK"], cutoff)
    ]
    minutes = f"{limits.stuck_chunk_minutes:g}"
    return count_alarm(
        "phspectra-stuck-chunks", "phspectra", stuck, 0, f"chunk(s) IN_PROGRESS with a lease expired > {minutes} min"
    )


def figures(window: Window) -> Figures:
    """Survey runs that ended in the window."""
    runs = state_store.scan_all(survey.runs_table(), keep=lambda item: item["SK"] == RUN_SK)
    return Figures(
        Outcomes.of(
            "phspectra",
            "runs",
            runs,
            "status",
            survey.RUN_COMPLETED,
            survey.RUN_FAILED,
            ended_since(window, "completed_at", "created_at"),
        )
    )


CHECKS = {phspectra_stuck_chunks: ("phspectra-stuck-chunks",)}
