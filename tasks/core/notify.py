"""Failure notifications: through a Prefect notification block when one is configured, else the log.

``deliver`` says whether a block took the message (DeliveryError when not), for callers that retry
(``pipeline-health``); ``notify`` never raises, for state hooks and one-off alerts. Flows attach
``notify_on_failure`` as ``on_failure`` / ``on_crashed`` hooks. Hooks run in the flow's own process, so a killed
worker runs none: ``records-reconcile`` covers that case from DynamoDB's side.
"""

from __future__ import annotations

import logging
import urllib.parse

from tasks.core.errors import Unavailable
from tasks.core.redact import redact
from tasks.core.settings import MachineSettings

logger = logging.getLogger("pipelines.notify")

NOTIFY_BLOCK_ENV = MachineSettings.env_name("notify_block")  # e.g. "slack-webhook/on-call"


class DeliveryError(Unavailable, RuntimeError):
    """A notification block did not deliver; the message says why, without any URL path, query or secret."""


def _secret_values(block) -> list[str]:
    """What of a block must stay out of any message: its secret field values (SecretStr, SecretDict) and every
    path segment and query value of its destination URLs (a webhook's whole path is its credential)."""
    found: list[str] = []

    def collect(value) -> None:
        if isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, str) and len(value) >= 3:
            found.append(value)

    for name in type(block).model_fields:
        value = getattr(block, name, None)
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
            collect(value)
        if isinstance(value, str) and "://" in value:
            parts = urllib.parse.urlsplit(value)
            found += [s for s in parts.path.split("/") if len(s) >= 3] + [
                v for _, v in urllib.parse.parse_qsl(parts.query)
            ]
    return found


def delivery_reason(error: BaseException, secrets: list[str] = ()) -> str:
    """One secret-free line on why a delivery failed: the error's type and text, the block's secrets and the
    URLs' credentials and token-like segments masked."""
    text = " ".join(str(error).split()) or "no detail"
    return f"{type(error).__name__}: {redact(text, secrets)}"[:500]


def deliver(subject: str, body: str, block: str | None = None) -> str:
    """Send ``subject``/``body`` through the block ``type-slug/name`` (default PIPELINES_NOTIFY_BLOCK), else log it.

    Returns where it went ("block:<name>" or "log"); raises DeliveryError when the block did not deliver.
    """
    block = block or MachineSettings.read().notify_block
    subject, body = redact(subject), redact(body)  # reasons quote URLs: no credential leaves in an alert
    if not block:
        logger.error("NOTIFY %s: %s", subject, body)
        return "log"
    from prefect.blocks.core import Block

    try:
        loaded = Block.load(block)
    except Exception as error:  # noqa: BLE001 - a missing or unreadable block is a failed delivery
        raise DeliveryError(f"notification block {block} cannot be loaded: {delivery_reason(error)}") from None
    secrets = _secret_values(loaded)
    try:
        if hasattr(loaded, "raise_on_failure"):  # Apprise blocks only report a failure when asked to
            with loaded.raise_on_failure():
                loaded.notify(body=body, subject=subject)
        else:
            loaded.notify(body=body, subject=subject)
    except Exception as error:  # noqa: BLE001 - any failure to send is a failed delivery
        raise DeliveryError(f"notification block {block} did not deliver: {delivery_reason(error, secrets)}") from None
    return f"block:{block}"


def notify(subject: str, body: str, block: str | None = None) -> str:
    """``deliver``, but a failed delivery is logged (a WARNING with the reason, then the message) instead of raised.

    Returns where it went: "block:<name>", "log", or "undelivered" (the block failed; the message is in the log).
    """
    try:
        return deliver(subject, body, block)
    except DeliveryError as error:
        logger.warning("notification not delivered: %s", error)
        logger.error("NOTIFY %s: %s", subject, body)
        return "undelivered"


def notify_on_failure(flow, flow_run, state) -> None:
    """Prefect state hook: one notification per failed or crashed flow run, with the run's URL (never raises)."""
    from prefect.settings import get_current_settings

    ui = get_current_settings().ui_url or ""
    link = f"{ui}/runs/flow-run/{flow_run.id}" if ui else str(flow_run.id)
    notify(
        subject=f"{flow.name} run {flow_run.name} is {state.name}",
        body=f"Flow run {flow_run.name} of {flow.name} ended {state.name}: {state.message or 'no message'}\n{link}",
    )
