"""Alarm incidents: one notification per incident, remembered in DynamoDB through guarded writes.

One item per alarm in ``health_incidents`` (``pipeline-health-incidents-{env}``)::

    absent ──create-if-absent──▶ OPEN ──alarm clears──▶ CLEARED ──recurs (CLEARED→OPEN, incident+1)──▶ OPEN

Whoever opens an incident does not notify directly: every OPEN incident without ``notified_at`` is claimed
(``notify_claimed_at`` set only if unclaimed or the claim is older than the lease), sent, then confirmed
(``notified_at``, only by the claim's owner). Two health runs at once send one notification; a run killed
between claim and confirmation is covered by the next run after the lease (at least once; twice only when
the process died after sending and before confirming). A delivery that fails (the webhook is down) is not
a notification: the claim is released with ``notify_error``/``notify_failed_at``/``notify_attempts`` and a
later run sends again once ``retry_seconds`` have passed, until it is delivered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tasks.core import state_store
from tasks.core.config import table_name
from tasks.core.notify import DeliveryError, deliver
from tasks.core.runtime import iso_ago, now_iso, run_logger
from tasks.core.state_store import Condition
from tasks.health.checks import Alarm
from tasks.retention.sweep import Rule

OPEN, CLEARED = "OPEN", "CLEARED"
TABLE = "health_incidents"

# send(subject, body, block) -> where it went; DeliveryError when not delivered (tasks.core.notify.deliver)
Sender = Callable[[str, str, "str | None"], str]


def _table() -> str:
    return table_name(TABLE)


def get(alarm: str) -> dict[str, Any] | None:
    """The incident item of ``alarm``, or None when it never fired."""
    return state_store.get_item(_table(), {"alarm": alarm})


def open_incident(alarm: Alarm) -> str:
    """Record that ``alarm`` fires: 'opened' (a new incident) or 'ongoing' (already OPEN)."""
    stamp = now_iso()
    fields = {
        "opened_at": stamp,
        "value": alarm.value,
        "detail": alarm.detail[:2000],
        "pipeline": alarm.pipeline,
        "severity": alarm.severity,
    }
    created = state_store.create_if_absent(
        _table(), {"alarm": alarm.name, "status": OPEN, "incident": 1, **fields}, ["alarm"]
    )
    if created.applied:
        return "opened"
    if (created.item or {}).get("status") != CLEARED:
        return "ongoing"
    reopened = state_store.transition(
        _table(),
        {"alarm": alarm.name},
        CLEARED,
        OPEN,
        set=fields,
        add={"incident": 1},
        remove=[
            "notified_at",
            "notify_claimed_at",
            "cleared_at",
            "notify_error",
            "notify_failed_at",
            "notify_attempts",
            "ttl",
        ],
    )
    return "opened" if reopened.applied else "ongoing"


def clear_incident(name: str) -> str:
    """Record that alarm ``name`` is OK: 'cleared' (OPEN -> CLEARED now) or 'clear' (nothing was open)."""
    item = get(name)
    if item is None or item.get("status") != OPEN:
        return "clear"
    moved = state_store.transition(_table(), {"alarm": name}, OPEN, CLEARED, set={"cleared_at": now_iso()})
    return "cleared" if moved.applied else "clear"


def _claim(name: str, lease_seconds: float, retry_seconds: float) -> str | None:
    """Claim the notification of an OPEN, unnotified incident whose last failed delivery is ``retry_seconds`` old;
    the claim's stamp, or None (sent, claimed, or too soon to retry)."""
    mine = now_iso()
    condition = Condition(
        "attribute_not_exists(#sent) AND (attribute_not_exists(#claim) OR #claim < :expired)"
        " AND (attribute_not_exists(#failed) OR #failed <= :retry)",
        {"#sent": "notified_at", "#claim": "notify_claimed_at", "#failed": "notify_failed_at"},
        {":expired": iso_ago(lease_seconds), ":retry": iso_ago(retry_seconds)},
    )
    claimed = state_store.transition(
        _table(), {"alarm": name}, OPEN, None, set={"notify_claimed_at": mine}, condition=condition
    )
    return mine if claimed.applied else None


def message(item: dict[str, Any]) -> tuple[str, str]:
    """Subject and body of an incident's notification."""
    subject = (
        f"{item.get('severity', 'WARNING')} ALARM {item['alarm']} ({item.get('pipeline', '-')}): "
        f"incident {int(item.get('incident', 1))}"
    )
    body = f"{item['alarm']} fires since {item.get('opened_at')}: {item.get('detail')}"
    return subject, body


def notify_incident(
    name: str, lease_seconds: float, block: str | None = None, send: Sender | None = None, retry_seconds: float = 0
) -> bool:
    """Send the notification of ``name``'s OPEN incident unless sent, claimed or failed less than ``retry_seconds``
    ago; True when this call delivered it. A failed delivery is recorded on the incident and logged (WARNING)."""
    send = send or deliver
    seen = get(name)
    if seen is None or seen.get("status") != OPEN or seen.get("notified_at"):  # read first: no write while it lasts
        return False
    mine = _claim(name, lease_seconds, retry_seconds)
    if mine is None:
        return False
    item = get(name) or {"alarm": name}
    mine_only = Condition("#claim = :mine", {"#claim": "notify_claimed_at"}, {":mine": mine})
    try:
        where = send(*message(item), block)
    except DeliveryError as error:
        failed = state_store.transition(
            _table(),
            {"alarm": name},
            OPEN,
            None,
            set={"notify_error": str(error), "notify_failed_at": now_iso()},
            add={"notify_attempts": 1},
            remove=["notify_claimed_at"],
            condition=mine_only,
        )
        attempts = int(((failed.item or {}) if failed.applied else item).get("notify_attempts", 0))
        run_logger(__name__).warning(
            "notification of %s not delivered (attempt %d; retried after %.0f s): %s",
            name,
            attempts,
            retry_seconds,
            error,
        )
        return False
    confirmed = state_store.transition(
        _table(),
        {"alarm": name},
        OPEN,
        None,
        set={"notified_at": now_iso(), "notified_via": where},
        add={"notify_attempts": 1},
        remove=["notify_error", "notify_failed_at"],
        condition=mine_only,
    )
    if not confirmed.applied:  # the lease ran out while sending and another run claimed it: it may send again
        run_logger(__name__).warning("notification of %s sent but its claim was taken over", name)
    return True


def _notified(item: dict[str, Any]) -> str:
    """The ``notified`` column of an alarm that fires: when it was sent, or why it is not yet."""
    if item.get("notified_at"):
        return item["notified_at"]
    if item.get("notify_error"):
        return f"not delivered ({int(item.get('notify_attempts', 0))} attempts): {item['notify_error']}"
    return "-"


def apply(
    alarms: list[Alarm],
    lease_seconds: float,
    block: str | None = None,
    send: Sender | None = None,
    retry_seconds: float = 0,
) -> list[dict[str, Any]]:
    """Open or clear each alarm's incident, notify every open one not yet notified; one row per alarm."""
    rows = []
    for alarm in alarms:
        incident = open_incident(alarm) if alarm.firing else clear_incident(alarm.name)
        sent = alarm.firing and notify_incident(alarm.name, lease_seconds, block, send, retry_seconds)
        item = get(alarm.name) or {}
        rows.append(
            {
                **alarm.row(),
                "incident": incident,
                "incident_no": int(item.get("incident", 0)),
                "notified": "sent now" if sent else _notified(item) if alarm.firing else "-",
            }
        )
    return rows


# a cleared incident is kept for the retention pass's days, then DynamoDB's TTL deletes it
RETENTION_RULES = (Rule(TABLE, ("alarm",), "status", (CLEARED,), ("cleared_at", "opened_at", "created_at")),)
