"""The soak's done times come from the records themselves, so its latencies do not carry the check's tick."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from benchmarks.soak import record_time

SEEN = datetime(2026, 11, 28, 4, 30, 15, tzinfo=UTC).timestamp()


def test_an_iso_stamp_or_epoch_milliseconds_give_the_records_own_time():
    assert record_time("2026-11-28T04:30:03.250000+00:00", SEEN) == SEEN - 11.75
    assert record_time(Decimal(int((SEEN - 4.5) * 1000)), SEEN) == SEEN - 4.5  # DynamoDB numbers read as Decimal
    assert record_time(int((SEEN - 2) * 1000), SEEN) == SEEN - 2


def test_a_record_without_a_readable_stamp_or_one_after_the_check_counts_when_the_check_saw_it():
    assert record_time(None, SEEN) == SEEN
    assert record_time("not a time", SEEN) == SEEN
    assert record_time("2026-11-28T04:31:00+00:00", SEEN) == SEEN  # a clock ahead never makes a latency negative
