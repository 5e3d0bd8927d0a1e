"""Alarm incidents: one notification per incident, remembered in DynamoDB through guarded writes.

One item per alarm in ``health_incidents`` (``pipeline-health-incidents-{env}``)::

    absent ──create-if-absent──▶ OPEN ──alarm clears──▶ CLEARED ──recurs (CLEARED→OPEN, incident+1)──▶ OPEN

Whoever opens an incident does not notify directly: every OPEN incident without ``notified_at`` is claimed
(``notify_claimed_at`` set only if unclaimed or the claim is older than the lease), sent, then confirmed
(``notified_at``, only by the claim's owner). Two health runs at once send one notification; a run killed
between claim and confirmation is covered by the next run after the lease (at least once; twice only when
the process died after sending and before confirming).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tasks.core import state_store
from tasks.core.config import table_name
from tasks.core.notify import notify
from tasks.core.runtime import iso_ago, now_iso, run_logger
from tasks.core.state_store import Condition
from tasks.health.checks import Alarm

OPEN, CLEARED = "OPEN", "CLEARED"
TABLE = "health_incidents"

# send(subject, body, block) -> where it went (tasks.core.notify.notify)
Sender = Callable[[str, str, "str | None"], str]


def _table() -> str:
    return table_name(TABLE)


def get(alarm: str) -> dict[str, Any] | None:
    """The incident item of ``alarm``, or None when it never fired."""
    return state_store.get_item(_table(), {"alarm": alarm})


def open_incident(alarm: Alarm) -> str:
    """Record that ``alarm`` fires: 'opened' (a new incident) or 'ongoing' (already OPEN)."""
    stamp = now_iso()
    fields = {"opened_at": stamp, "value": alarm.value, "detail": alarm.detail[:2000], "pipeline": alarm.pipeline}
    created = state_store.create_if_absent(_table(), {"alarm": alarm.name, "status": OPEN, "incident": 1, **fields}, ["alarm"])
    if created.applied:
        return "opened"
    if (created.item or {}).get("status") != CLEARED:
        return "ongoing"
    reopened = state_store.transition(
        _table(), {"alarm": alarm.name}, CLEARED, OPEN, set=fields, add={"incident": 1},
        remove=["notified_at", "notify_claimed_at", "cleared_at"],
    )
    return "opened" if reopened.applied else "ongoing"


def clear_incident(name: str) -> str:
    """Record that alarm ``name`` is OK: 'cleared' (OPEN -> CLEARED now) or 'clear' (nothing was open)."""
    item = get(name)
    if item is None or item.get("status") != OPEN:
        return "clear"
    moved = state_store.transition(_table(), {"alarm": name}, OPEN, CLEARED, set={"cleared_at": now_iso()})
    return "cleared" if moved.applied else "clear"


def _claim(name: str, lease_seconds: float) -> str | None:
    """Claim the notification of an OPEN, unnotified incident; the claim's stamp, or None (sent or claimed)."""
    mine = now_iso()
    condition = Condition(
        "attribute_not_exists(#sent) AND (attribute_not_exists(#claim) OR #claim < :expired)",
        {"#sent": "notified_at", "#claim": "notify_claimed_at"},
        {":expired": iso_ago(lease_seconds)},
    )
    claimed = state_store.transition(
        _table(), {"alarm": name}, OPEN, None, set={"notify_claimed_at": mine}, condition=condition
    )
    return mine if claimed.applied else None


def message(item: dict[str, Any]) -> tuple[str, str]:
    """Subject and body of an incident's notification."""
    subject = f"ALARM {item['alarm']} ({item.get('pipeline', '-')}): incident {int(item.get('incident', 1))}"
    body = f"{item['alarm']} fires since {item.get('opened_at')}: {item.get('detail')}"
    return subject, body


def notify_incident(name: str, lease_seconds: float, block: str | None = None, send: Sender | None = None) -> bool:
    """Send the notification of ``name``'s OPEN incident unless sent or claimed; True when this call sent it."""
    send = send or notify
    seen = get(name)
    if seen is None or seen.get("status") != OPEN or seen.get("notified_at"):  # read first: no write while it lasts
        return False
    mine = _claim(name, lease_seconds)
    if mine is None:
        return False
    item = get(name) or {"alarm": name}
    where = send(*message(item), block)
    confirmed = state_store.transition(
        _table(), {"alarm": name}, OPEN, None, set={"notified_at": now_iso(), "notified_via": where},
        condition=Condition("#claim = :mine", {"#claim": "notify_claimed_at"}, {":mine": mine}),
    )
    if not confirmed.applied:  # the lease ran out while sending and another run claimed it: it may send again
        run_logger(__name__).warning("notification of %s sent but its claim was taken over", name)
    return True


def apply(alarms: list[Alarm], lease_seconds: float, block: str | None = None, send: Sender | None = None) -> list[dict[str, Any]]:
    """Open or clear each alarm's incident, notify every open one not yet notified; one row per alarm."""
    rows = []
    for alarm in alarms:
        incident = open_incident(alarm) if alarm.firing else clear_incident(alarm.name)
        sent = alarm.firing and notify_incident(alarm.name, lease_seconds, block, send)
        item = get(alarm.name) or {}
        rows.append({
            **alarm.row(), "incident": incident, "incident_no": int(item.get("incident", 0)),
            "notified": "sent now" if sent else (item.get("notified_at") or "-") if alarm.firing else "-",
        })
    return rows
