"""The loop every pipeline's listener runs: receive arrivals, hand them over in micro-batches, ack what is durable.

    source.receive() ──> micro-batch (up to batch_size, or batch_seconds after its first arrival, or at once when it
                         makes a whole unit of work: batch_full, with what is ready by then)
        ──> handler(batch) ──> Outcome.done  ──> source.ack()      (the work is durable)
                           └─> Outcome.retry ──> source.release()  (offered again later, with the reason)

A handler that raises releases its whole batch (nothing is lost); every arrival it does not account for is
released too, so a handler bug cannot silently drop an object. Like the SQS batch of the seeds' Lambdas, a
batch is bounded by count and by time, never one flow run per object.

A listener never stops on a transient error: opening the source, ``receive``, ``ack`` and ``release`` that raise
are logged and tried again after 1, 2, 4 … seconds (at most a minute). An ack that failed leaves its arrivals
to be offered again, which the pipelines' create-if-absent writes make harmless.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tasks.landing.heartbeat import Heartbeat
from tasks.landing.sources import Arrival, EventSource

LOG = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What a handler made of a batch: arrivals whose work is durable, and arrivals to offer again (with why)."""

    done: list[Arrival] = field(default_factory=list)
    retry: list[tuple[Arrival, str]] = field(default_factory=list)


Handler = Callable[[list[Arrival]], Outcome]
BatchFull = Callable[[Sequence[Arrival]], bool]  # whether a batch already makes a whole unit of work (a manifest)
SourceFactory = Callable[[], EventSource]
MAX_BACKOFF_S = 60.0  # a failing source is tried again after 1, 2, 4 … seconds, at most this


def backoff_seconds(failures: int) -> float:
    """The wait before the next try after ``failures`` consecutive failures (1, 2, 4 … at most a minute)."""
    return min(MAX_BACKOFF_S, 2.0 ** max(0, failures - 1))


def _pause(seconds: float, should_stop: Callable[[], bool]) -> None:
    """Sleep ``seconds`` in short steps, returning early once ``should_stop()``."""
    deadline = time.monotonic() + seconds
    while not should_stop() and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(0.2, left))


@dataclass
class PumpStats:
    """Counts over one pump: what was received, acked and released, in how many batches."""

    received: int = 0
    acked: int = 0
    released: int = 0
    batches: int = 0
    errors: int = 0  # source calls (open, receive, ack, release) that raised and were tried again


def settle(source: EventSource, batch: Sequence[Arrival], outcome: Outcome, stats: PumpStats) -> None:
    """Ack the durable arrivals and release the rest (one log line per reason), counting both."""
    done_ids = {id(a) for a in outcome.done}
    retry_ids = {id(a) for a, _ in outcome.retry}
    unaccounted = [a for a in batch if id(a) not in done_ids and id(a) not in retry_ids]
    retry = list(outcome.retry) + [(a, "the handler did not account for it") for a in unaccounted]
    if outcome.done:
        try:
            source.ack(outcome.done)
            stats.acked += len(outcome.done)
        except Exception as exc:  # noqa: BLE001 - the work is durable; unacked arrivals come back and change nothing
            stats.errors += 1
            LOG.warning(
                "could not ack %d arrival(s) (%s: %s); they are offered again",
                len(outcome.done),
                type(exc).__name__,
                exc,
            )
    by_reason: dict[str, list[Arrival]] = {}
    for arrival, reason in retry:
        by_reason.setdefault(reason, []).append(arrival)
    for reason, arrivals in by_reason.items():
        LOG.warning("offering %d arrival(s) again (%s): %s", len(arrivals), reason, arrivals[0].url)
        try:
            source.release(arrivals, reason)
        except Exception as exc:  # noqa: BLE001 - not released is offered again anyway (visibility timeout)
            stats.errors += 1
            LOG.warning(
                "could not release %d arrival(s) (%s: %s); they come back when their lease ends",
                len(arrivals),
                type(exc).__name__,
                exc,
            )
        stats.released += len(arrivals)


def handle_batch(source: EventSource, handler: Handler, batch: list[Arrival], stats: PumpStats) -> None:
    """Run the handler on one batch; a handler that raises releases the whole batch with the error."""
    stats.batches += 1
    try:
        outcome = handler(batch)
    except Exception as exc:  # the batch is offered again, never lost
        LOG.exception("handler failed on a batch of %d; offering it again", len(batch))
        outcome = Outcome(retry=[(a, f"{type(exc).__name__}: {exc}") for a in batch])
    settle(source, batch, outcome, stats)


def ready_now(source: EventSource, room: int, stats: PumpStats) -> list[Arrival]:
    """Up to ``room`` arrivals ready now, without waiting (a receive that raises ends the look: the next receive
    tries again)."""
    taken: list[Arrival] = []
    while len(taken) < room:
        try:
            received = source.receive(max_items=min(10, room - len(taken)), wait_seconds=0)
        except Exception:  # noqa: BLE001 - the batch goes as it is; the pump's next receive retries with backoff
            break
        if not received:
            break
        taken += received
        stats.received += len(received)
    return taken


def pump(
    source: EventSource,
    handler: Handler,
    *,
    batch_size: int = 100,
    batch_seconds: float = 2.0,
    wait_seconds: float = 20.0,
    should_stop: Callable[[], bool] = lambda: False,
    stats: PumpStats | None = None,
    heartbeat: Heartbeat | None = None,
    batch_full: BatchFull | None = None,
) -> PumpStats:
    """Receive until ``should_stop()``, handing arrivals to ``handler`` in batches bounded by count and age;
    each receive that returns (arrivals or none) beats ``heartbeat``. A batch that ``batch_full`` says makes a whole
    unit of work goes at once, with whatever else is ready by then (at a high rate the batches grow with the
    handler's time, as a group commit does)."""
    stats = stats if stats is not None else PumpStats()
    heartbeat = heartbeat or Heartbeat(None)
    batch: list[Arrival] = []
    first_at = 0.0
    failures = 0
    while not should_stop():
        if batch:
            wait = max(0.0, batch_seconds - (time.monotonic() - first_at))
        else:
            wait = wait_seconds
        try:
            received = source.receive(max_items=max(1, min(10, batch_size - len(batch))), wait_seconds=wait)
            failures = 0
            heartbeat.beat()
        except Exception as exc:  # noqa: BLE001 - a network blip or a throttle: try again, never stop listening
            failures += 1
            stats.errors += 1
            delay = backoff_seconds(failures)
            LOG.warning(
                "receive failed (%s: %s, %d in a row); trying again in %.0f s", type(exc).__name__, exc, failures, delay
            )
            _pause(delay, should_stop)
            received = []
        if received and not batch:
            first_at = time.monotonic()
        batch += received
        stats.received += len(received)
        full = bool(received) and batch_full is not None and batch_full(batch)
        if full:
            batch += ready_now(source, batch_size - len(batch), stats)
        if batch and (full or len(batch) >= batch_size or time.monotonic() - first_at >= batch_seconds):
            handle_batch(source, handler, batch, stats)
            batch = []
    if batch:  # stopping: finish what was received rather than wait for a redelivery
        handle_batch(source, handler, batch, stats)
    return stats


# objects one event names: Prefect (3.8) refuses an event with more than 100 related resources
# (PREFECT_EVENTS_MAXIMUM_RELATED_RESOURCES), the runs it started and the run context's own (flow, run, deployment,
# pool, tags) included; 80 leaves them room, so a batch of 100 files is two events, never one that is dropped
OBJECTS_PER_EVENT = 80
Landed = tuple[
    Arrival, str, Sequence[str]
]  # an arrival, what became of it (the event's last word), the runs it started


def emit_landed(pipeline: str, landed: Sequence[Landed]) -> None:
    """One Prefect event per outcome of a batch, ``pipelines.{pipeline}.object.{outcome}``: its objects as related
    resources (role ``object``, found by their URL) and in its payload (size, time, id, runs started), and the runs
    they started (role ``flow-run``, ``pipelines.relation: started``); one per arrival would cost the server a write
    each."""
    from prefect.events import emit_event

    by_outcome: dict[str, list[Landed]] = {}
    for item in landed:
        by_outcome.setdefault(item[1], []).append(item)
    for outcome, items in by_outcome.items():
        for start in range(0, len(items), OBJECTS_PER_EVENT):
            chunk = items[start : start + OBJECTS_PER_EVENT]
            runs = sorted({run for _, _, flow_run_ids in chunk for run in flow_run_ids})
            # marked "started": inside a listener run Prefect also relates the listener's own run and flow
            related = [
                {
                    "prefect.resource.id": f"prefect.flow-run.{run}",
                    "prefect.resource.role": "flow-run",
                    "pipelines.relation": "started",
                }
                for run in runs
            ]
            related += [
                {
                    "prefect.resource.id": arrival.url,
                    "prefect.resource.role": "object",
                    "prefect.resource.name": arrival.key or arrival.url,
                }
                for arrival, _, _ in chunk
            ]
            emit_event(
                event=f"pipelines.{pipeline}.object.{outcome}",
                resource={
                    "prefect.resource.id": f"pipelines.{pipeline}.landed.{chunk[0][0].event_id}",
                    "prefect.resource.name": f"{len(chunk)} object(s)",
                    "pipelines.pipeline": pipeline,
                },
                related=related,
                payload={
                    "objects": [
                        {
                            "url": arrival.url,
                            "size": arrival.size,
                            "event_time": arrival.event_time,
                            "event_id": arrival.event_id,
                            "flow_run_ids": list(flow_run_ids),
                        }
                        for arrival, _, flow_run_ids in chunk
                    ]
                },
            )


def open_source(
    kind: str, pipeline: str, store_url: str | None, prefix: str, suffixes: Sequence[str] | None = None, **watch_options
) -> EventSource:
    """A listener's source: ``local`` (a watch on ``prefix`` of the ``file://`` store) or ``sqs`` (the
    pipeline's queue of S3 notifications)."""
    if kind == "local":
        from tasks.landing.watch import LocalWatchSource

        return LocalWatchSource.for_prefix(store_url, prefix, suffixes, **watch_options)
    if kind == "sqs":
        from tasks.landing.sqs import SqsSource

        return SqsSource.for_pipeline(pipeline)
    raise ValueError(f"unknown event source {kind!r}: use 'local' or 'sqs'")


def open_with_retries(
    open_source: SourceFactory, should_stop: Callable[[], bool], stats: PumpStats
) -> EventSource | None:
    """``open_source()``, tried again after a growing pause while it raises; None if stopped first."""
    failures = 0
    while not should_stop():
        try:
            return open_source()
        except Exception as exc:  # noqa: BLE001 - the queue or the store unreachable for now: keep trying, loudly
            failures += 1
            stats.errors += 1
            delay = backoff_seconds(failures)
            LOG.error(
                "could not open the event source (%s: %s, %d in a row); trying again in %.0f s",
                type(exc).__name__,
                exc,
                failures,
                delay,
            )
            _pause(delay, should_stop)
    return None


def listen(
    source: EventSource | SourceFactory,
    handler: Handler,
    *,
    batch_size: int = 100,
    batch_seconds: float = 2.0,
    max_runtime_seconds: float = 0.0,
    idle_exit_seconds: float = 0.0,
    wait_seconds: float = 5.0,
    batch_full: BatchFull | None = None,
) -> PumpStats:
    """A listener deployment's body: pump until ``max_runtime_seconds`` elapse or nothing arrived for
    ``idle_exit_seconds`` (0: never), then close the source. ``source`` may be a function that opens it,
    called again (with backoff) while it raises. Each receive beats the heartbeat ``PIPELINES_LISTENER_HEARTBEAT``
    names (its ECS container's health check). ``batch_full``: as ``pump``'s."""
    stats = PumpStats()
    started = time.monotonic()
    last = {"seen": (-1, -1), "at": started}

    def should_stop() -> bool:
        now = time.monotonic()
        if (stats.received, stats.batches) != last["seen"]:  # idle: nothing received nor handled since
            last.update(seen=(stats.received, stats.batches), at=now)
        return (0 < max_runtime_seconds <= now - started) or (0 < idle_exit_seconds <= now - last["at"])

    if not isinstance(source, EventSource):
        opened = open_with_retries(source, should_stop, stats)
        if opened is None:
            return stats
        source = opened
    try:
        return pump(
            source,
            handler,
            batch_size=batch_size,
            batch_seconds=batch_seconds,
            wait_seconds=min(wait_seconds, idle_exit_seconds or wait_seconds),
            should_stop=should_stop,
            stats=stats,
            heartbeat=Heartbeat.from_env(),
            batch_full=batch_full,
        )
    finally:
        source.close()


def listen_report(
    listener: str, source: EventSource | SourceFactory, handler: Handler, **options: Any
) -> dict[str, int]:
    """``listen`` (same options), then one line on what the listener did; its counts, as its flow returns them."""
    stats = listen(source, handler, **options)
    print(
        f"{listener}: {stats.received} received, {stats.acked} done, "
        f"{stats.released} offered again in {stats.batches} batches"
        f"{f', {stats.errors} source error(s) tried again' if stats.errors else ''}"
    )
    return vars(stats)
