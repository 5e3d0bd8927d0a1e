"""Failure notifications: through a Prefect notification block when one is configured, else the log.

Flows attach ``notify_on_failure`` as ``on_failure`` / ``on_crashed`` hooks. Hooks run in the flow's own
process, so a killed worker runs none: ``records-reconcile`` covers that case from DynamoDB's side.
"""

from __future__ import annotations

import logging
import os

from tasks.core.redact import redact

logger = logging.getLogger("pipelines.notify")

NOTIFY_BLOCK_ENV = "PIPELINES_NOTIFY_BLOCK"  # e.g. "slack-webhook/on-call"


def notify(subject: str, body: str, block: str | None = None) -> str:
    """Send ``subject``/``body`` through the notification block ``type-slug/name``; log it when there is none.

    Returns where it went ("block:<name>" or "log"). A failing notifier is logged, never raised: an alert
    must not turn a handled failure into a crash.
    """
    block = block or os.environ.get(NOTIFY_BLOCK_ENV)
    subject, body = redact(subject), redact(body)  # reasons quote URLs: no credential leaves in an alert
    if block:
        try:
            from prefect.blocks.core import Block

            Block.load(block).notify(body=body, subject=subject)
            return f"block:{block}"
        except Exception as error:  # noqa: BLE001 - fall back to the log, say why
            logger.error("notification block %s failed (%s); logging instead", block, redact(str(error)))
    logger.error("NOTIFY %s: %s", subject, body)
    return "log"


def notify_on_failure(flow, flow_run, state) -> None:
    """Prefect state hook: one notification per failed or crashed flow run, with the run's URL."""
    from prefect.settings import get_current_settings

    ui = get_current_settings().ui_url or ""
    link = f"{ui}/runs/flow-run/{flow_run.id}" if ui else str(flow_run.id)
    notify(
        subject=f"{flow.name} run {flow_run.name} is {state.name}",
        body=f"Flow run {flow_run.name} of {flow.name} ended {state.name}: {state.message or 'no message'}\n{link}",
    )
