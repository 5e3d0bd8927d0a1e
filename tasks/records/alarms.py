"""What ``pipeline-health`` reads of the records pipeline: the dead-letter archive, and its dashboard figures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from blocks.health import HealthThresholds
from tasks.core import state_store
from tasks.core.config import object_store, table_name
from tasks.health.checks import Alarm, count_alarm
from tasks.health.dashboard import Figures, Outcomes, Window
from tasks.records import keys

HOUR_S = 3600


def dead_letter_archive(limits: HealthThresholds) -> Alarm:
    """Records: objects in the dead-letter archive (waiting for replay, or failed again under failed/)."""
    found = list(object_store().list(keys.DEAD_LETTER_PREFIX))
    return count_alarm("records-dead-letter-archive", "records", found, limits.dead_letter_max, "archived message(s)")


def records_archived(limits_: HealthThresholds) -> Alarm:
    """Seed 004: messages archived to the dead-letter archive in the last hour."""
    since = datetime.now(UTC) - timedelta(seconds=HOUR_S)
    archived = [
        o.key
        for o in object_store().list_objects(keys.DEAD_LETTER_PREFIX)
        if datetime.fromisoformat(o.last_modified) >= since
    ]
    return count_alarm(
        "records-archived-per-hour",
        "records",
        archived,
        limits_.records_archived_hour_max,
        "message(s) archived in the last hour",
    )


def figures(window: Window) -> Figures:
    """Executions that ended in the window, and the messages waiting in the dead-letter archive."""
    executions = state_store.scan_all(table_name("executions"))
    dead_letters = sum(1 for _ in object_store().list(keys.DEAD_LETTER_PREFIX))
    return Figures(
        Outcomes.of(
            "records",
            "executions",
            executions,
            "status",
            "completed",
            "failed",
            lambda item: int(item.get("createdAt") or 0) >= window.since_epoch_ms,
        ),
        summary=f"**records:** {dead_letters} message(s) in the dead-letter archive",
    )


CHECKS = {dead_letter_archive: ("records-dead-letter-archive",)}
SERVICE_CHECKS = {records_archived: ("records-archived-per-hour",)}
