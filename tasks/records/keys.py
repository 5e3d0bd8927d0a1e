"""Seed 004's keys: the local workflow-message folders and the dead-letter archive.

Every key of this pipeline is built and parsed here; nothing else formats them by hand. Identifiers are
validated by the shared validators of ``tasks.core.keys`` so no input can write outside its prefix.
"""

from __future__ import annotations

import re

from tasks.core.keys import InvalidKey, safe_date, safe_id, safe_key

DEAD_LETTER_PREFIX = "dead-letter-archive/"


RECORDS_INCOMING_PREFIX = "records/incoming/"  # the local stand-in for the workflow-message queue
RECORDS_PROCESSED_PREFIX = "records/processed/"
MESSAGE_SUFFIXES = (".json", ".ndjson", ".jsonl")  # the names under records/incoming/ that are message files


def records_processed_key(day: str, incoming_key: str) -> str:
    """``records/processed/{date}/{path under records/incoming/}``: a message file once its messages are written."""
    rest = safe_key(incoming_key).removeprefix(RECORDS_INCOMING_PREFIX)
    if rest == incoming_key:
        raise InvalidKey(f"not under {RECORDS_INCOMING_PREFIX}: {incoming_key!r}")
    return f"{RECORDS_PROCESSED_PREFIX}{safe_date(day)}/{rest}"


def dead_letter_key(day: str, message_id: str) -> str:
    """``dead-letter-archive/{date}/{message_id}.json``."""
    return f"{DEAD_LETTER_PREFIX}{safe_date(day)}/{safe_id(message_id, 'message id')}.json"


def dead_letter_failed_key(day: str, message_id: str) -> str:
    """``dead-letter-archive/failed/{date}/{message_id}.json``: failed again on replay."""
    return f"{DEAD_LETTER_PREFIX}failed/{safe_date(day)}/{safe_id(message_id, 'message id')}.json"


def dead_letter_prefix(day: str, failed: bool = False) -> str:
    """``dead-letter-archive/{date}/`` (or ``dead-letter-archive/failed/{date}/``)."""
    return f"{DEAD_LETTER_PREFIX}{'failed/' if failed else ''}{safe_date(day)}/"


def dead_letter_id(key: str) -> str:
    """The message id of an archive key (``…/{date}/{message_id}.json``); InvalidKey if it is not one."""
    match = re.fullmatch(r"dead-letter-archive/(?:failed/)?(\d{4}-\d{2}-\d{2})/([^/]+)\.json", key)
    if not match:
        raise InvalidKey(f"not a dead-letter archive key: {key!r}")
    safe_date(match.group(1))
    return safe_id(match.group(2), "message id")
