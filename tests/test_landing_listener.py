"""The listener loop: micro-batches by count and age, acks only what the handler made durable, loses nothing."""

from __future__ import annotations

import itertools

from tasks.landing.listener import Outcome, pump
from tasks.landing.sources import Arrival


class ListSource:
    """An event source over a list: the smallest real implementation of the interface."""

    def __init__(self, arrivals):
        self.waiting = list(arrivals)
        self.acked: list[str] = []
        self.released: list[tuple[str, str]] = []

    def receive(self, max_items=10, wait_seconds=20.0):
        taken, self.waiting = self.waiting[:max_items], self.waiting[max_items:]
        return taken

    def ack(self, arrivals):
        self.acked += [a.key for a in arrivals]

    def release(self, arrivals, reason):
        self.released += [(a.key, reason) for a in arrivals]

    def close(self):
        pass


def arrivals(n):
    return [Arrival(url=f"file:///in/{i}", key=f"in/{i}", size=1, event_time="2024-01-01T00:00:00Z", event_id=str(i)) for i in range(n)]


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
    assert source.released == [("in/0", "RuntimeError: database down"), ("in/1", "RuntimeError: database down"),
                                ("in/3", "the handler did not account for it")]
