"""What every pipeline's listener shares: the source it opens, the loop with a time limit, starting a run once.

    open_source("local" | "sqs") ──> listen(source, handler, …) ──> pump() until max_runtime_seconds
    handler ──> start_deployment_run(name, parameters, idempotency_key) ──> the flow run's id

The sources' modules (``tasks.landing.watch`` locally, ``tasks.landing.sqs`` in AWS) are imported only when a
listener opens one, so a listener needs only the dependencies of the source it uses.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Callable

from tasks.core.keys import InvalidKey
from tasks.core.runtime import run_logger
from tasks.landing.listener import Handler, Outcome, emit_landed, pump
from tasks.landing.sources import Arrival, EventSource

SOURCES = ("local", "sqs")


def open_source(source: str, pipeline: str, prefix: str, suffixes: list[str] | None = None) -> EventSource:
    """The pipeline's event source: a watch over ``prefix`` of the configured ``file://`` store, or its SQS queue."""
    if source == "local":
        from tasks.core.config import object_store
        from tasks.landing.watch import LocalWatchSource

        return LocalWatchSource(object_store().url, prefix, suffixes=suffixes)
    if source == "sqs":
        from tasks.landing.sqs import SqsSource

        return SqsSource.for_pipeline(pipeline)
    raise ValueError(f"unknown event source {source!r}: choose one of {SOURCES}")


def listen(
    source: str,
    pipeline: str,
    prefix: str,
    handler: Handler,
    *,
    suffixes: list[str] | None = None,
    batch_size: int,
    batch_seconds: float,
    wait_seconds: float,
    max_runtime_seconds: float = 0,
) -> dict[str, int]:
    """Open the pipeline's source, pump it into ``handler`` for ``max_runtime_seconds`` (0: until stopped), close it."""
    events = open_source(source, pipeline, prefix, suffixes)
    deadline = time.monotonic() + max_runtime_seconds if max_runtime_seconds > 0 else None
    wait = min(wait_seconds, max_runtime_seconds) if deadline else wait_seconds  # never poll past the deadline
    try:
        stats = pump(
            events, handler, batch_size=batch_size, batch_seconds=batch_seconds, wait_seconds=wait,
            should_stop=lambda: deadline is not None and time.monotonic() >= deadline,
        )  # fmt: skip
    finally:
        events.close()
    return asdict(stats)


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
