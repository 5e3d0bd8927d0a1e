"""The one interface every event source implements, so a listener reads the same locally and in AWS.

    receive() ──> Arrival(s) ──> the listener makes the work durable (file tracked, run created) ──> ack()
                                     └── it could not: nothing acked ──> offered again (SQS: after the
                                         visibility timeout; the queue's redrive policy sends a message to
                                         its dead-letter queue after 3 receives)

An arrival is acked only once the work it asks for is durable, so a listener killed at any point loses
nothing: what it had not acked is offered again, and the pipelines' own create-if-absent writes make the
second offer change nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Arrival:
    """One object that landed, or one message that arrived, as its source reports it."""

    url: str  # the object's URL (file:///… or s3://bucket/key); for a plain message, the queue's URL
    key: str  # the object's key relative to the store the listener watches ("" for a plain message)
    size: int | None  # bytes, from the event or the listing (never a HEAD per object)
    event_time: str  # when it landed (ISO 8601, UTC), as the event or the listing says
    event_id: str  # stable for one landing: S3 sequencer / SQS message id / path, size, mtime, inode, ctime locally
    body: str | None = None  # a plain message's text (records' workflow messages); None for an object
    receipt: str | None = None  # what ack() needs (an SQS receipt handle); None where nothing does
    receive_count: int = 1  # how many times the source has offered this arrival (SQS ApproximateReceiveCount)


@runtime_checkable
class EventSource(Protocol):
    """Where arrivals come from: receive a batch, ack what is durable, give back what is not."""

    def receive(self, max_items: int = 10, wait_seconds: float = 20.0) -> list[Arrival]:
        """Up to ``max_items`` arrivals, waiting at most ``wait_seconds`` for the first (a long poll)."""
        ...

    def ack(self, arrivals: Sequence[Arrival]) -> None:
        """The work these arrivals ask for is durable: never offer them again."""
        ...

    def release(self, arrivals: Sequence[Arrival], reason: str) -> None:
        """These could not be handled now: offer them again later (and count the attempt)."""
        ...

    def close(self) -> None:
        """Stop watching; arrivals not acked are offered again by the next source over the same place."""
        ...
