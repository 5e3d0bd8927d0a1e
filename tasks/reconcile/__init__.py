"""Prefect <-> DynamoDB reconciliation: records in flight whose Prefect run ended, and counters that drifted.

Pipelines store ``prefect_flow_run_id`` / ``prefect_task_run_id`` on a record when it goes in flight. An
*adapter* per pipeline finds those records and repairs them through guarded transitions (conditional on the
status we saw AND on the same Prefect run ids, so a re-driven record is never touched); the core asks the
Prefect API for the runs' states and decides, with one rule for every pipeline (``transition_for``):

- record in flight, its Prefect task run (or, when that never ended, its flow run) is terminal -> FAILED
  (a worker that was killed runs no hooks; FAILED rather than back to PENDING so the chunk is counted in
  ``jobs_failed`` and the pipeline's own re-drive of FAILED chunks picks it up);
- record COMPLETED while its own Prefect task run is Failed/Crashed/Cancelled -> FAILED (the pipelines write
  COMPLETED as their last step, so Prefect saying otherwise means the result is not trustworthy; re-drive
  rewrites the same deterministic output keys); a task run not yet ended (its flow crashed before the task's
  final state reached the server) is no evidence, so the recorded result stands;
- a video job whose runs all ended -> recovered as ``video-sweep-stuck`` does (reassembled, re-driven, failed);
- run counters that do not match their chunk items -> set to the counts, conditional on the values read.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from tasks.core import registry
from tasks.core.runtime import run_logger
from tasks.reconcile.adapters import (
    BAD,
    TERMINAL,
    Adapter,
    Finding,
    RunState,
    TableAdapter,
    Tracked,
    show_key,
    transition_for,
)


def adapters() -> dict[str, Adapter]:
    """Adapter name -> adapter, over every pipeline that declares ``reconcile_adapters``."""
    return {adapter.name: adapter for _, declared in registry.hooks("reconcile_adapters") for adapter in declared}


def _uuids(ids: Iterable[str | None]) -> list[uuid.UUID]:
    out = []
    for value in ids:
        try:
            out.append(uuid.UUID(str(value)))
        except ValueError:
            continue
    return sorted(set(out), key=str)


def prefect_states(flow_run_ids: Iterable[str | None], task_run_ids: Iterable[str | None]) -> dict[str, RunState]:
    """Run id -> its current state, read from the Prefect API (``read_flow_runs`` / ``read_task_runs``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterId

    states: dict[str, RunState] = {}
    flows, tasks = _uuids(flow_run_ids), _uuids(task_run_ids)
    with get_client(sync_client=True) as client:
        for start in range(0, len(flows), 200):
            part = flows[start : start + 200]
            for run in client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=part)), limit=len(part)
            ):
                if run.state is not None:
                    states[str(run.id)] = _ended_with_parent(client, run) or RunState(
                        str(run.id), run.state.type.value, run.state.name, "flow run"
                    )
        for start in range(0, len(tasks), 200):
            part = tasks[start : start + 200]
            for run in client.read_task_runs(
                task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=part)), limit=len(part)
            ):
                if run.state is not None:
                    states[str(run.id)] = RunState(str(run.id), run.state.type.value, run.state.name, "task run")
    return states


def _in_process(run: Any) -> bool:
    """Whether a flow run is a subflow run in its parent's process (no deployment of its own): it dies with it."""
    return run.parent_task_run_id is not None and run.deployment_id is None


def _ended_with_parent(client: Any, run: Any, depth: int = 8) -> RunState | None:
    """A live in-process subflow run whose parent flow run ended: it ended too (the process that ran it is gone,
    and nothing reports it), so it takes its parent's end state; None otherwise."""
    from prefect.exceptions import ObjectNotFound

    if depth == 0 or run.state is None or run.state.type.value in TERMINAL or not _in_process(run):
        return None
    try:
        parent = client.read_flow_run(client.read_task_run(run.parent_task_run_id).flow_run_id)
    except ObjectNotFound:
        return None
    ended = _ended_with_parent(client, parent, depth - 1)
    if ended is None and parent.state is not None and parent.state.type.value in TERMINAL:
        ended = RunState(str(parent.id), parent.state.type.value, parent.state.name, "flow run")
    if ended is None:
        return None
    return RunState(str(run.id), ended.type, f"{ended.name} (with its parent flow run {ended.id})", "flow run")


def with_subflows(run_ids: set[str]) -> set[str]:
    """``run_ids`` and, recursively, the in-process subflow runs of those flow runs (a crashed run's event names
    only the run its worker started; its subflows died with it and hold records of their own)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    found, frontier = set(run_ids), _uuids(run_ids)
    with get_client(sync_client=True) as client:
        while frontier:
            children = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=frontier))
            )
            frontier = [c.id for c in children if _in_process(c) and str(c.id) not in found]
            found |= {str(c) for c in frontier}
    return found


def effective_state(record: Tracked, states: Mapping[str, RunState]) -> RunState | None:
    """The task run's state when it ended; else the flow run's when that ended (a killed worker leaves its
    task runs Running while the flow run is marked Crashed); else the task's (or flow's) live state.

    A run in ``record.holders`` that has not ended keeps the record alive (its live state is returned). A
    completed record is judged by its own task run's end alone (None until then): a flow that crashed before
    its task runs' terminal states reached the server says nothing against work whose result was recorded.
    """
    task = states.get(record.task_run_id or "")
    flow = states.get(record.flow_run_id or "")
    live = [states[r] for r in record.holders if r in states and states[r].type not in TERMINAL]
    if live:
        return live[0]
    if record.role == "completed" and record.task_run_id:
        return task if task is not None and task.type in TERMINAL else None
    if task is not None and task.type in TERMINAL:
        return task
    if flow is not None and flow.type in TERMINAL:
        return flow
    return task or flow


def reconcile(
    pipelines: Sequence[str] | None = None, dry_run: bool = True, run_ids: set[str] | None = None
) -> list[Finding]:
    """Compare every adapter's tracked records with Prefect and repair (unless ``dry_run``)."""
    known = adapters()
    unknown = [p for p in pipelines or () if p not in known]
    if unknown:
        raise LookupError(f"no reconciliation adapter for {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    chosen = [known[p] for p in (pipelines or sorted(known))]
    if run_ids is not None:
        run_ids = with_subflows(run_ids)
    tracked = {}
    for adapter in chosen:
        records = list(adapter.tracked())
        if run_ids is not None:
            records = [r for r in records if {r.flow_run_id, r.task_run_id, *r.holders} & run_ids]
        tracked[adapter.name] = records
    every = [r for records in tracked.values() for r in records]
    flow_runs = [run for r in every for run in (r.flow_run_id, *r.holders)]
    states = prefect_states(flow_runs, [r.task_run_id for r in every]) if every else {}
    findings: list[Finding] = []
    for adapter in chosen:
        for record in tracked[adapter.name]:
            state = effective_state(record, states)
            if state is None:
                if not {record.flow_run_id, record.task_run_id, *record.holders} & states.keys():
                    findings.append(
                        Finding(
                            adapter.name,
                            show_key(record.key),
                            "Prefect run not found",
                            record.status,
                            "-",
                            "none",
                            "report-only",
                        )
                    )
                continue
            target = transition_for(record.role, state.type)
            if target is None:
                continue
            label = f"{state.what} {state.id} {state.name}"
            reason = f"reconciled: record {record.status} while Prefect {label}"
            finding = Finding(
                adapter.name,
                show_key(record.key),
                f"{record.status} while Prefect {state.name}",
                record.status,
                label,
                f"-> {getattr(adapter, 'action', target)}",
            )
            if not dry_run:
                result = adapter.repair(record, reason)
                finding.outcome = "applied" if result.applied else "stale"
            run_logger(__name__).warning(
                "%s %s: %s (%s)", adapter.name, finding.record, finding.problem, finding.outcome
            )
            findings.append(finding)
        scopes = None if run_ids is None else {r.scope for r in tracked[adapter.name] if r.scope}
        if scopes is None or scopes:
            findings.extend(adapter.counters(scopes, dry_run))
    return findings


def reconcile_rows(pipelines: list[str] | None, dry_run: bool, run_ids: list[str] | None = None) -> list[dict]:
    """``reconcile`` as table rows (the records flows' task): compare, repair through guarded transitions."""
    return rows(reconcile(pipelines, dry_run=dry_run, run_ids=set(run_ids) if run_ids else None))


def disagreements(pipelines: Sequence[str] | None = None) -> list[Finding]:
    """What reconciliation would fix now (a dry run), excluding records whose runs Prefect does not know."""
    return [f for f in reconcile(pipelines, dry_run=True) if f.fixable]


def run_ids_from_event(event: Mapping[str, Any]) -> tuple[str, set[str]]:
    """(event name, {run id}) of a Prefect ``prefect.flow-run.*`` / ``prefect.task-run.*`` event."""
    name = str(event.get("event", ""))
    resource = event.get("resource") or {}
    resource_id = str(resource.get("prefect.resource.id", ""))
    for prefix in ("prefect.flow-run.", "prefect.task-run."):
        if resource_id.startswith(prefix):
            run_id = resource_id[len(prefix) :]
            try:
                return name, {str(uuid.UUID(run_id))}
            except ValueError:
                break
    raise ValueError(f"not a Prefect flow-run/task-run event: resource id {resource_id!r} (event {name!r})")


def wait_until_ended(run_ids: set[str], timeout: float = 15.0, poll: float = 1.0) -> dict[str, RunState]:
    """The runs' states once every one is terminal (or at ``timeout``): an event can arrive before the API
    shows the state it announces (task-run states are recorded from events)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        states = prefect_states(run_ids, run_ids)
        if all(r in states and states[r].type in TERMINAL for r in run_ids) or time.monotonic() >= deadline:
            return states
        time.sleep(poll)


def rows(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """Findings as table-artifact rows."""
    return [asdict(f) for f in findings]


__all__ = [
    "BAD",
    "TERMINAL",
    "Adapter",
    "Finding",
    "RunState",
    "TableAdapter",
    "Tracked",
    "adapters",
    "disagreements",
    "effective_state",
    "prefect_states",
    "reconcile",
    "rows",
    "run_ids_from_event",
    "transition_for",
    "wait_until_ended",
    "with_subflows",
]
