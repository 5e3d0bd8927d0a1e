"""The records pipeline's retention: dead letters that were replayed and failed again (``failed/``) age out
after ``dead_letter_days``, if asked; waiting ones never do. Granules and executions keep no ttl (seed 004)."""

from __future__ import annotations

from datetime import timedelta

from tasks.core.config import object_store
from tasks.records.keys import DEAD_LETTER_PREFIX
from tasks.retention.sweep import Ageing, older_than


def age_out_failed_dead_letters(ageing: Ageing) -> dict[str, int]:
    """Delete ``failed/`` dead letters older than ``dead_letter_days`` (none when unset), as ``dead-letter-failed``."""
    if ageing.dead_letter_days is None:
        return {"dead-letter-failed": 0}
    archive = object_store()
    old = older_than(archive, f"{DEAD_LETTER_PREFIX}failed/", ageing.now - timedelta(days=ageing.dead_letter_days))
    return {"dead-letter-failed": sum(archive.delete(k) for k in old)}
