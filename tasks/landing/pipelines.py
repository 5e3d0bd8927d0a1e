"""What every pipeline's listener shares: the source it opens, the loop with a time limit, starting a run once.

    open_source("local" | "sqs", …) ──> listen(source, handler, …) ──> pump() until max_runtime_seconds
    handler ──> start_deployment_run(name, parameters, idempotency_key) ──> the flow run's id

The sources' modules (``tasks.landing.watch`` locally, ``tasks.landing.sqs`` in AWS) are imported only when a
listener opens one, so a listener needs only the dependencies of the source it uses.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from tasks.core.keys import InvalidKey
from tasks.core.runtime import run_logger
from tasks.landing.listener import Handler, Outcome, PumpStats, emit_landed, pump
from tasks.landing.sources import Arrival, EventSource

def open_source(kind: str, pipeline: str, store_url: str | None, prefix: str, suffixes: Sequence[str] | None = None) -> EventSource:
    """A listener's source: ``local`` (a watch on ``prefix`` of the ``file://`` store, the configured one when
    ``store_url`` is empty) or ``sqs`` (the pipeline's queue)."""
    if kind == "local":
        from tasks.landing.watch import LocalWatchSource

        if not store_url:
            from tasks.core.config import object_store

            store_url = object_store().url
        return LocalWatchSource(store_url, prefix, suffixes=suffixes)
    if kind == "sqs":
        from tasks.landing.sqs import SqsSource

        return SqsSource.for_pipeline(pipeline)
    raise ValueError(f"unknown event source {kind!r}: use 'local' or 'sqs'")


def listen(
    source: EventSource,
    handler: Handler,
    *,
    batch_size: int = 100,
    batch_seconds: float = 2.0,
    max_runtime_seconds: float = 0.0,
    wait_seconds: float = 5.0,
) -> PumpStats:
    """A listener deployment's body: pump until ``max_runtime_seconds`` elapse (0: never), then close the source."""
    deadline = time.monotonic() + max_runtime_seconds
    try:
        return pump(
            source, handler, batch_size=batch_size, batch_seconds=batch_seconds,
            wait_seconds=min(wait_seconds, max_runtime_seconds or wait_seconds),  # never poll far past the deadline
            should_stop=lambda: 0 < max_runtime_seconds and time.monotonic() >= deadline,
        )  # fmt: skip
    finally:
        source.close()


def start_deployment_run(deployment: str, parameters: dict[str, Any], idempotency_key: str) -> str:
    """Create one run of ``deployment`` (not waiting for it); the same ``idempotency_key`` again returns the same run.

    The Prefect server keeps one flow run per (flow, idempotency key), so a listener that crashed after creating
    the run and asks again gets the run it created, never a second one. The run is top level, as when a person
    runs `prefect deployment run`, not a child of the listener.
    """
    from prefect.deployments import run_deployment

    run = run_deployment(deployment, parameters=parameters, timeout=0, idempotency_key=idempotency_key, as_subflow=False)
    return str(run.id)


def handle_each(arrivals: list[Arrival], pipeline: str, start: Callable[[Arrival], tuple[str, list[str]]]) -> Outcome:
    """A handler from a per-arrival ``start`` (what happened, the runs it started): one event per run (or one
    without), done when ``start`` returned or refused the key (one log line), offered again when it raised
    anything else (DynamoDB or the Prefect server down)."""
    outcome = Outcome()
    for arrival in arrivals:
        try:
            what, flow_run_ids = start(arrival)
        except InvalidKey as error:  # outside the pipeline's landing keys: a redelivery cannot change that
            run_logger(__name__).warning("ignored %s: %s", arrival.url, error)
            what, flow_run_ids = "ignored", []
        except Exception as error:  # noqa: BLE001 - offered again later, never lost
            outcome.retry.append((arrival, f"{type(error).__name__}: {error}"))
            continue
        for flow_run_id in flow_run_ids or [None]:
            emit_landed(arrival, pipeline, what, flow_run_id)
        outcome.done.append(arrival)
    return outcome
