"""One ``pipeline-health`` pass as a plain function: read every pipeline, then open/clear/notify incidents."""

from __future__ import annotations

from typing import Any

from blocks import load_config
from blocks.health import HealthThresholds
from tasks.core import registry
from tasks.health import checks, disks, incidents, listeners, service_alarms

# the declared checks a pass runs: a pipeline's checks of its records, and of the orchestrator's runs and events
DECLARED_CHECKS = ("health_checks", "service_checks")


def all_checks() -> dict[checks.Check, tuple[str, ...]]:
    """The shared alarms' checks, then every pipeline's (``DECLARED_CHECKS`` in its ``pipeline.py``)."""
    merged = {**service_alarms.CHECKS, **listeners.CHECKS, **disks.CHECKS}
    for pipeline in registry.pipelines():
        for hook in DECLARED_CHECKS:
            merged.update(pipeline.hook(hook) or {})
    return merged


def check_health(notify_block: str | None = None) -> list[dict[str, Any]]:
    """Evaluate every alarm against the thresholds block and apply the incidents; one row per alarm."""
    limits = load_config(HealthThresholds)
    return incidents.apply(
        checks.evaluate(limits, all_checks()),
        limits.notify_lease_seconds,
        notify_block or limits.notify_block,
        retry_seconds=limits.notify_retry_seconds,
    )
