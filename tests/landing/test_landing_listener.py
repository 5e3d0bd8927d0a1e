"""The listener loop: micro-batches by count and age, acks only what the handler made durable, loses nothing."""

from __future__ import annotations

import itertools

import pytest

from tasks.etl.landing import ManifestFill
from tasks.landing import listener
from tasks.landing.listener import Outcome, PumpStats, pump
from tests.helpers.landing import ListSource, arrivals


def test_batches_by_count_and_acks_only_what_is_durable():
    source = ListSource(arrivals(25))
    batches = []

    def handler(batch):
        batches.append([a.key for a in batch])
        odd = [a for a in batch if int(a.key.split("/")[1]) % 2]
        return Outcome(done=[a for a in batch if a not in odd], retry=[(a, "busy") for a in odd])

    ticks = itertools.count()
    stats = pump(source, handler, batch_size=10, batch_seconds=60, wait_seconds=0, should_stop=lambda: next(ticks) >= 3)
    assert [len(b) for b in batches] == [10, 10, 5]  # the last, partial batch is finished on stop
    assert source.acked == [f"in/{i}" for i in range(25) if i % 2 == 0]
    assert source.released == [(f"in/{i}", "busy") for i in range(25) if i % 2]
    assert (stats.received, stats.acked, stats.released, stats.batches) == (25, 13, 12, 3)


class DripSource(ListSource):
    """Arrivals that come a few at a time, each receive after a wait: nothing is ready without waiting."""

    def __init__(self, deliveries):
        super().__init__([])
        self.deliveries = list(deliveries)

    def receive(self, max_items=10, wait_seconds=20.0):
        if wait_seconds == 0 or not self.deliveries:
            return []
        return self.deliveries.pop(0)


def test_a_batch_that_fills_a_manifest_goes_at_once_and_counts_what_it_leaves_waiting():
    items = arrivals(24)
    source = DripSource([items[i : i + 3] for i in range(0, 24, 3)])
    fill, batches = ManifestFill(10), []

    def handler(batch):
        batches.append(len(batch))
        return fill.handled(Outcome(done=list(batch)))

    pump(
        source,
        handler,
        batch_size=100,
        batch_seconds=60,
        wait_seconds=1,
        should_stop=lambda: not source.deliveries,
        batch_full=fill.full,
    )  # the window (60 s) never ends a batch here
    # 12 fills the first manifest with 2 over; 2 + 9 fills the next with 1 over; the last 3 go on stop
    assert batches == [12, 9, 3]
    assert source.acked == [a.key for a in items]


class NoLookSource(ListSource):
    """A source whose look without waiting fails (a dropped connection); a waiting receive works."""

    def receive(self, max_items=10, wait_seconds=20.0):
        if wait_seconds == 0:
            raise ConnectionError("connection reset by peer")
        return super().receive(max_items, wait_seconds)


@pytest.mark.parametrize(
    ("source_class", "expected"),
    [
        (ListSource, [25]),  # one handler call for all that was ready, not 3
        (NoLookSource, [10, 10, 5]),  # the look for more fails: the full batch goes as it is, the rest comes next
    ],
)
def test_a_full_batch_takes_what_is_ready_with_it(source_class, expected):
    source = source_class(arrivals(25))
    batches = []

    def handler(batch):
        batches.append(len(batch))
        return Outcome(done=list(batch))

    ticks = itertools.count()
    stats = pump(
        source,
        handler,
        batch_size=100,
        batch_seconds=60,
        wait_seconds=1,
        should_stop=lambda: next(ticks) >= len(expected),
        batch_full=ManifestFill(10).full,
    )
    assert batches == expected and stats.received == 25 and source.acked == [f"in/{i}" for i in range(25)]


def test_a_raising_or_forgetful_handler_loses_nothing():
    source = ListSource(arrivals(4))
    calls = itertools.count()

    def handler(batch):
        if next(calls) == 0:
            raise RuntimeError("database down")
        return Outcome(done=batch[:1])  # forgets the rest

    ticks = itertools.count()
    pump(source, handler, batch_size=2, batch_seconds=60, wait_seconds=0, should_stop=lambda: next(ticks) >= 2)
    assert source.acked == ["in/2"]
    assert source.released == [
        ("in/0", "RuntimeError: database down"),
        ("in/1", "RuntimeError: database down"),
        ("in/3", "the handler did not account for it"),
    ]


class FlakySource(ListSource):
    """A source like SQS: the receive calls numbered in ``failing_receives`` fail, the first ack and release fail,
    and what was received but not acked is offered again (its lease ends)."""

    def __init__(self, arrivals, failing_receives):
        super().__init__(arrivals)
        self.failing_receives = failing_receives
        self.receives = itertools.count()
        self.ack_failures = 1
        self.release_failures = 1

    def receive(self, max_items=10, wait_seconds=20.0):
        if next(self.receives) in self.failing_receives:
            raise ConnectionError("connection reset by peer")
        return super().receive(max_items, wait_seconds)

    def ack(self, arrivals):
        if self.ack_failures:
            self.ack_failures -= 1
            self.waiting += arrivals  # not acked: offered again
            raise ConnectionError("ack timed out")
        super().ack(arrivals)

    def release(self, arrivals, reason):
        self.waiting += arrivals  # offered again whether or not the release call got through
        if self.release_failures:
            self.release_failures -= 1
            raise ConnectionError("release timed out")
        super().release(arrivals, reason)


def test_a_failing_source_is_tried_again_after_growing_pauses_and_nothing_is_lost(monkeypatch):
    pauses: list[float] = []
    monkeypatch.setattr(listener, "_pause", lambda seconds, should_stop: pauses.append(seconds))
    source = FlakySource(arrivals(6), failing_receives={*range(8), 9, 10})  # 8 in a row, one delivery, 2 more
    opens = itertools.count()

    def open_source():
        if next(opens) < 2:
            raise ConnectionError("queue unreachable")
        return source

    first_offer: set[str] = set()

    def handler(batch):  # every arrival is refused once (released), then done
        retry = [a for a in batch if a.key not in first_offer]
        first_offer.update(a.key for a in retry)
        return Outcome(done=[a for a in batch if a not in retry], retry=[(a, "busy") for a in retry])

    stats = PumpStats()
    ticks = itertools.count()

    def stop():
        return len(source.acked) == 6 or next(ticks) > 200

    opened = listener.open_with_retries(open_source, stop, stats)
    pump(opened, handler, batch_size=3, batch_seconds=0, wait_seconds=0, should_stop=stop, stats=stats)

    # opening, then receive: doubling, at most a minute, and from 1 s again after a receive that worked
    assert pauses == [1, 2] + [1, 2, 4, 8, 16, 32, 60, 60] + [1, 2]
    assert sorted(source.acked) == sorted(a.key for a in arrivals(6))  # nothing lost, each acked once
    assert len(source.acked) == 6
    assert stats.errors == 2 + 10 + 1 + 1  # two opens, ten receives, one ack, one release
    assert [listener.backoff_seconds(n) for n in (1, 2, 3, 7, 8, 50)] == [1, 2, 4, 60, 60, 60]
