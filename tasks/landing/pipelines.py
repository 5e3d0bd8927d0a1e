"""What the media listeners' handlers share: starting a run once per landing, and one outcome per arrival.

    handler ──> tasks.core.runtime.start_deployment_run(name, parameters, idempotency_key) ──> the flow run's id
    handle_each(arrivals, pipeline, start) ──> Outcome (done / retry) + one Prefect event per outcome of the batch

The source and the loop are ``tasks.landing.sources.open_source`` and ``tasks.landing.listener.listen``.
"""

from __future__ import annotations

from collections.abc import Callable

from tasks.core.errors import RefusedInput
from tasks.core.runtime import run_logger
from tasks.landing.listener import Landed, Outcome, emit_landed
from tasks.landing.sources import Arrival


def handle_each(arrivals: list[Arrival], pipeline: str, start: Callable[[Arrival], tuple[str, list[str]]]) -> Outcome:
    """A handler from a per-arrival ``start`` (what happened, the runs it started): one event per outcome naming
    its arrivals and runs, done when ``start`` returned or refused the input (a ``RefusedInput``: one log line), offered
    again when it raised anything else (DynamoDB or the Prefect server down)."""
    outcome = Outcome()
    landed: list[Landed] = []
    for arrival in arrivals:
        try:
            what, flow_run_ids = start(arrival)
        except RefusedInput as error:  # e.g. a key outside the landing keys: a redelivery cannot change it
            run_logger(__name__).warning("ignored %s: %s", arrival.url, error)
            what, flow_run_ids = "ignored", []
        except Exception as error:  # noqa: BLE001 - offered again later, never lost
            outcome.retry.append((arrival, f"{type(error).__name__}: {error}"))
            continue
        landed.append((arrival, what, flow_run_ids))
        outcome.done.append(arrival)
    emit_landed(pipeline, landed)
    return outcome
