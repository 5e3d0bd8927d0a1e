"""``etl-files-pending-too-long`` measures how long a file has been pending *this time*, on an injected clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from blocks.health import HealthThresholds
from tasks.core import runtime, state_store
from tasks.etl import ingest as etl
from tasks.etl import keys, ops
from tasks.etl.alarms import etl_pending

DATE = "2026-11-20"
T0 = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)


@pytest.fixture
def clock(monkeypatch):
    """The pipelines' clock (``tasks.core.runtime.utc_now``), moved by the test: ``clock.now = ...``."""

    class Clock:
        now = T0

    monkeypatch.setattr(runtime, "utc_now", lambda: Clock.now)
    return Clock


def late_files(limits: HealthThresholds) -> tuple[int, str]:
    alarm = next(a for a in etl_pending(limits) if a.name == "etl-files-pending-too-long")
    return alarm.value, alarm.detail


def test_a_reprocessed_file_is_late_only_an_hour_after_it_became_pending_again(tables, store_root, clock, monkeypatch):
    monkeypatch.setenv("PIPELINES_USE_BLOCKS", "0")
    limits = HealthThresholds(pending_file_minutes=60)
    checks = [
        etl.FileCheck(f"file:///in/pipeline/input/{DATE}/{n}.ndjson", DATE, f"{n}.ndjson", 10) for n in ("a", "b")
    ]
    etl.track_files(checks, etl.settings())  # both pending since T0
    # a's merge failed two hours later; it is reprocessed then, while b is still waiting since T0
    clock.now = T0 + timedelta(hours=2)
    a = state_store.get_item(tables["etl_file_tracking"], etl.tracking_key(DATE, "a.ndjson"))
    failed = keys.sharded_status(etl.FAILED, int(a["shard_id"]))
    assert state_store.transition(
        tables["etl_file_tracking"], etl.tracking_key(DATE, "a.ndjson"), a["status"], failed
    ).applied
    assert ops.reprocess_failed(DATE, ["a.ndjson"])["moved"] == 1

    clock.now = T0 + timedelta(hours=2, minutes=59)
    assert late_files(limits) == (1, f"1 file(s) pending > 60 min: {DATE}/b.ndjson")
    clock.now = T0 + timedelta(hours=3, minutes=1)
    assert late_files(limits) == (2, f"2 file(s) pending > 60 min: {DATE}/a.ndjson, {DATE}/b.ndjson")
