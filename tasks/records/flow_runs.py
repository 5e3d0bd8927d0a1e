"""The orchestrator's own record of an execution: a Prefect flow run's start and end (the seed asks Step
Functions' ``describeExecution``; here the execution name of a workflow run by Prefect is its flow run id)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from tasks.core.runtime import run_logger

READ_LIMIT = 200  # flow runs per read_flow_runs request


@dataclass(frozen=True)
class RunTimes:
    """A flow run's start and end as ISO 8601 UTC with milliseconds; None where the run has none (yet)."""

    start: str | None
    end: str | None


def utc_iso(moment: datetime | None) -> str | None:
    """``moment`` as ISO 8601 UTC with milliseconds (the records' date-time format)."""
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="milliseconds")


def _run_ids(execution_names: Iterable[str]) -> dict[str, list[str]]:
    """Flow run id (canonical text) -> the execution names that spell it; names that are no UUID are left out."""
    ids: dict[str, list[str]] = {}
    for name in execution_names:
        try:
            ids.setdefault(str(uuid.UUID(name)), []).append(name)
        except (TypeError, ValueError):
            continue  # not a Prefect flow run: its times come from the message
    return ids


def run_times(execution_names: Iterable[str]) -> dict[str, RunTimes]:
    """Execution name -> its Prefect flow run's start and end, for the names that are ids of flow runs Prefect
    knows; the others (and all of them when the Prefect API cannot be asked, logged) are left out."""
    ids = _run_ids(execution_names)
    if not ids:
        return {}
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    wanted = [uuid.UUID(i) for i in sorted(ids)]
    found: dict[str, RunTimes] = {}
    try:
        with get_client(sync_client=True) as client:
            for first in range(0, len(wanted), READ_LIMIT):
                part = wanted[first : first + READ_LIMIT]
                for run in client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=part)), limit=len(part)
                ):
                    for name in ids.get(str(run.id), []):
                        found[name] = RunTimes(utc_iso(run.start_time), utc_iso(run.end_time))
    except Exception as error:  # noqa: BLE001 - an unreachable API costs the records Prefect's times, not the batch
        run_logger(__name__).warning(
            "Prefect API unavailable for %d flow runs (%s: %s): processing times taken from the messages",
            len(wanted),
            type(error).__name__,
            error,
        )
        return {}
    return found
