"""The local arrival path: the file watch source alone, then the ETL listener end to end on DynamoDB Local."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tasks.landing.watch import LocalWatchSource

INPUT = "pipeline/input/"


def receive_all(source: LocalWatchSource, seconds: float, until: int | None = None) -> list:
    """Everything the source offers within ``seconds`` (or until ``until`` arrivals came)."""
    got, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline and (until is None or len(got) < until):
        got += source.receive(max_items=10, wait_seconds=min(0.5, max(0.0, deadline - time.monotonic())))
    return got


@pytest.fixture
def watched(tmp_path):
    """A store folder and a factory of watch sources over its ``pipeline/input/`` (closed after the test)."""
    sources = []

    def make(**options) -> LocalWatchSource:
        options.setdefault("settle_seconds", 0.5)
        source = LocalWatchSource(tmp_path.as_uri(), INPUT, **options)
        sources.append(source)
        return source

    yield tmp_path, make
    for source in sources:
        source.close()


def test_a_file_renamed_in_is_taken_once_and_hidden_or_temporary_files_never(watched):
    root, make = watched
    source = make(settle_seconds=30)  # only the rename fast path can take it within the test
    day = root / INPUT / "2026-01-05"
    day.mkdir(parents=True)
    staged = root / "staged.ndjson"
    staged.write_text('{"a": 1}\n')
    os.rename(staged, day / "f.ndjson")
    (day / ".hidden.ndjson").write_text("x\n")
    (day / "g.ndjson.tmp").write_text("x\n")
    (day / ".g.ndjson.123.part").write_text("x\n")
    got = receive_all(source, 3)
    assert [(a.key, a.size, a.url) for a in got] == [("pipeline/input/2026-01-05/f.ndjson", 9, (day / "f.ndjson").as_uri())]
    stat = (day / "f.ndjson").stat()
    assert got[0].event_id == f"pipeline/input/2026-01-05/f.ndjson:9:{stat.st_mtime_ns}"
    assert receive_all(source, 1) == []  # in flight: not offered twice
    source.ack(got)
    assert receive_all(source, 1) == []


def test_a_file_written_in_place_is_taken_only_once_stable(watched):
    root, make = watched
    source = make(settle_seconds=1.0)
    path = root / INPUT / "2026-01-05" / "slow.ndjson"
    path.parent.mkdir(parents=True)
    with open(path, "w") as handle:
        for i in range(4):  # a growing file, still open
            handle.write(f'{{"i": {i}}}\n')
            handle.flush()
            assert source.receive(max_items=10, wait_seconds=0.4) == []
    written = time.monotonic()
    got = receive_all(source, 5, until=1)
    assert [(a.key, a.size) for a in got] == [("pipeline/input/2026-01-05/slow.ndjson", 36)]
    assert time.monotonic() - written >= 0.6  # stable for the settle time (1 s, measured from its last write)


def test_the_catch_up_listing_finds_files_written_before_start_and_a_restart_offers_unacked_ones(watched):
    root, make = watched
    day = root / INPUT / "2026-01-06"
    day.mkdir(parents=True)
    for name in ("a.ndjson", "b.ndjson", "c.ndjson"):
        (day / name).write_text("{}\n")
    (root / "elsewhere.ndjson").write_text("{}\n")  # outside the prefix
    first = make()
    got = receive_all(first, 3, until=3)
    assert sorted(a.key.rsplit("/", 1)[1] for a in got) == ["a.ndjson", "b.ndjson", "c.ndjson"]
    first.ack([a for a in got if a.key.endswith("a.ndjson")])
    first.release([a for a in got if a.key.endswith("b.ndjson")], "database down")
    first.close()  # c.ndjson: neither acked nor released (the listener died)
    again = make()
    offered = receive_all(again, 3, until=3)
    # a new process knows nothing of the old one's acks: everything is offered again, the pipeline's
    # create-if-absent makes the repeat a no-op
    assert sorted(a.key.rsplit("/", 1)[1] for a in offered) == ["a.ndjson", "b.ndjson", "c.ndjson"]
    assert all(a.receive_count == 1 for a in offered)


def test_a_released_arrival_comes_back_after_a_delay_with_its_count(watched):
    root, make = watched
    source = make()
    path = root / INPUT / "2026-01-07" / "r.ndjson"
    path.parent.mkdir(parents=True)
    path.write_text("{}\n")
    (first,) = receive_all(source, 3, until=1)
    source.release([first], "busy")
    assert source.receive(max_items=10, wait_seconds=0.5) == []  # not before 1 s
    (second,) = receive_all(source, 3, until=1)
    assert (second.event_id, second.receive_count) == (first.event_id, 2)
