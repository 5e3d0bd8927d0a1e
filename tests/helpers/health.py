"""pipeline-health test helpers: the ``health`` settings with notifications captured, and an archived dead letter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tasks.health import incidents
from tasks.records import dead_letter


def only_record_alarms(setattr_: Callable[[Any, str, Any], None] = setattr) -> None:
    """pipeline-health with the record alarms only (``setattr_``: a test's ``monkeypatch.setattr``, or plain
    ``setattr`` in a crash child): the service alarms, the listeners' and the pipelines' declared service checks
    read every run on the shared test server, the disks' read this machine's disks (their own tests have them)."""
    from tasks.health import disks, listeners, run, service_alarms

    setattr_(service_alarms, "CHECKS", {})
    setattr_(disks, "CHECKS", {})
    setattr_(listeners, "CHECKS", {})
    setattr_(run, "DECLARED_CHECKS", ("health_checks",))


@pytest.fixture
def health(tables, store_root, monkeypatch, record_alarms_only):
    """Fresh tables and store; thresholds from the environment; notifications captured in a list."""
    monkeypatch.setenv("PIPELINES_USE_BLOCKS", "0")
    monkeypatch.setenv("HEALTH_PENDING_FILES_MAX", "1")  # the seed's depth is 1000; two files are enough here
    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", "2")  # two pending files of a date are a full batch (iterator age)
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(incidents, "deliver", lambda subject, body, block=None: sent.append((subject, body)) or "test")
    return sent


def make_dead_letter(message_id: str = "m-1") -> str:
    """A message rejected by records-ingest, archived as the pipeline does."""
    return dead_letter.archive(message_id, {"type": "ValidationError", "message": "no granules"}, body="{not json")
