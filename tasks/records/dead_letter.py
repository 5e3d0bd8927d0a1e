"""The dead-letter archive: rejected messages as JSON with their error, and their replay.

``dead-letter-archive/{date}/{message_id}.json`` holds ``{"id", "archived_at", "error", "message", "body",
"attempts", "previous_errors"}`` (``body`` keeps the raw text of a message that did not parse; a message that is
not valid UTF-8 keeps its exact bytes in ``body_base64`` instead). Replay hands
the archived messages to a processing function, deletes each one that it wrote, and moves each one that
failed again to ``dead-letter-archive/failed/{date}/`` (written there first, then deleted here): nothing
is deleted without having been written or moved.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tasks.core import config
from tasks.core.keys import safe_id
from tasks.core.runtime import now_iso, run_logger, today_iso
from tasks.records.keys import dead_letter_failed_key, dead_letter_id, dead_letter_key, dead_letter_prefix

# process(payloads, ids) -> one error dict (or None when written) per payload
Processor = Callable[[list[Any], list[str]], list[Mapping[str, Any] | None]]


def archive(
    message_id: str,
    error: Mapping[str, Any],
    *,
    message: Mapping[str, Any] | None = None,
    body: str | None = None,
    raw: bytes | None = None,
    day: str | None = None,
    attempts: int = 0,
    previous_errors: Sequence[Mapping[str, Any]] = (),
    store=None,
) -> str:
    """Write one rejected message (parsed ``message``, text ``body`` or ``raw`` bytes) with its error; its key."""
    if message is None and body is None and raw is None:
        raise ValueError(f"dead letter {message_id}: nothing to archive (no message and no body)")
    store = store or config.object_store()
    key = dead_letter_key(day or today_iso(), message_id)
    entry = {
        "id": message_id,
        "archived_at": now_iso(),
        "error": dict(error),
        "message": message,
        "body": body,
        "attempts": attempts,
        "previous_errors": list(previous_errors),
    }
    if raw is not None:
        entry["body_base64"] = base64.b64encode(raw).decode("ascii")
    store.put_bytes(key, json.dumps(entry, indent=2, sort_keys=True, default=str).encode())
    run_logger(__name__).warning("archived message %s to %s: %s", message_id, key, error.get("message"))
    return key


def archived(day: str, ids: Sequence[str] | None = None, store=None) -> dict[str, str]:
    """Message id -> key of the archive for ``day`` (only ``ids`` when given; LookupError for any missing)."""
    store = store or config.object_store()
    prefix = dead_letter_prefix(day)
    found = {dead_letter_id(key): key for key in store.list(prefix) if "/" not in key[len(prefix) :]}
    if ids is None:
        return dict(sorted(found.items()))
    missing = [i for i in ids if safe_id(i, "message id") not in found]
    if missing:
        raise LookupError(f"not in {prefix}: {', '.join(missing)}")
    return {i: found[i] for i in ids}


def read(key: str, store=None) -> dict[str, Any]:
    """The archived entry at ``key``, parsed from JSON."""
    return json.loads((store or config.object_store()).get_bytes(key))


def payload(entry: Mapping[str, Any]) -> Any:
    """What to reprocess: the parsed message, else the raw body (text, or the exact bytes of ``body_base64``)."""
    if entry.get("message") is not None:
        return entry["message"]
    if entry.get("body") is None and entry.get("body_base64") is not None:
        return base64.b64decode(entry["body_base64"])
    return entry.get("body")


@dataclass
class ReplayReport:
    day: str
    written: list[str] = field(default_factory=list)  # deleted from the archive
    failed: dict[str, str] = field(default_factory=dict)  # id -> key under failed/
    errors: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The report as a plain dict."""
        return {"day": self.day, "written": self.written, "failed": self.failed, "errors": self.errors}


def replay(day: str, process: Processor, ids: Sequence[str] | None = None, store=None) -> ReplayReport:
    """Reprocess the archive of ``day`` (or ``ids`` of it): delete what was written, move what failed."""
    store = store or config.object_store()
    keys = archived(day, ids, store)
    report = ReplayReport(day)
    entries: dict[str, dict[str, Any]] = {}
    for message_id, key in keys.items():
        try:
            entries[message_id] = read(key, store)
        except (ValueError, UnicodeDecodeError) as error:  # an archive object that is not JSON: keep it whole
            target = dead_letter_failed_key(day, message_id)
            store.move(key, target)
            report.failed[message_id] = target
            report.errors[message_id] = {"type": "UnreadableArchiveEntry", "message": str(error)}
    order = list(entries)
    results = process([payload(entries[i]) for i in order], order) if order else []
    for message_id, error in zip(order, results):
        key, entry = keys[message_id], entries[message_id]
        if error is None:
            store.delete(key)  # its records are written
            report.written.append(message_id)
            continue
        target = dead_letter_failed_key(day, message_id)
        entry.update(
            error=dict(error),
            attempts=int(entry.get("attempts") or 0) + 1,
            previous_errors=[*entry.get("previous_errors", []), entry.get("error")],
            replayed_at=now_iso(),
        )
        store.put_bytes(target, json.dumps(entry, indent=2, sort_keys=True, default=str).encode())
        store.delete(key)  # only after the copy under failed/ is written
        report.failed[message_id] = target
        report.errors[message_id] = dict(error)
    return report
