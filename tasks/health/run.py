"""One ``pipeline-health`` pass as a plain function: read every pipeline, then open/clear/notify incidents."""

from __future__ import annotations

from typing import Any

from blocks import load_config
from blocks.health import HealthThresholds
from tasks.health import checks, incidents, listeners, service_alarms


def check_health(notify_block: str | None = None) -> list[dict[str, Any]]:
    """Evaluate every alarm against the thresholds block and apply the incidents; one row per alarm."""
    limits = load_config(HealthThresholds)
    return incidents.apply(
        checks.evaluate(limits, {**checks.CHECKS, **service_alarms.CHECKS, **listeners.CHECKS}), limits.notify_lease_seconds, notify_block or limits.notify_block,
        retry_seconds=limits.notify_retry_seconds,
    )
