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
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from tasks.core import config, state_store
from tasks.core.runtime import now_iso, run_logger
from tasks.etl.keys import MANIFEST_PREFIX, manifest_name_from_record_key
from tasks.phspectra.keys import CHUNK_SK_PREFIX, RUN_SK
from tasks.phspectra import survey
from tasks.core.state_store import Increment


TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
BAD = {"FAILED", "CRASHED", "CANCELLED"}


@dataclass(frozen=True)
class Tracked:
    """A record that carries Prefect run ids."""

    key: dict[str, Any]
    status: str
    role: str  # "in_flight" or "completed"
    flow_run_id: str | None
    task_run_id: str | None
    scope: str | None = None  # the run (for counters)
    # other flow runs that hold the record too (a video job's reassembly runs): it is alive while one of them is
    holders: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunState:
    id: str
    type: str  # StateType value: RUNNING, COMPLETED, CRASHED, ...
    name: str  # display name: Running, Crashed, ...
    what: str  # "task run" / "flow run"


@dataclass
class Finding:
    pipeline: str
    record: str
    problem: str
    record_status: str
    prefect_state: str
    action: str
    outcome: str = "planned"  # planned (dry run) / applied / stale (someone else moved it) / report-only

    @property
    def fixable(self) -> bool:
        """Whether the finding can be repaired (it is not report-only)."""
        return self.outcome != "report-only"


def transition_for(role: str, state_type: str | None) -> str | None:
    """The seed-free core rule: which record role a Prefect run state moves a record to (None: agree)."""
    if state_type is None:
        return None
    if role == "in_flight" and state_type in TERMINAL:
        return "failed"
    if role == "completed" and state_type in BAD:
        return "failed"
    return None


class Adapter(Protocol):
    name: str

    def tracked(self) -> Iterable[Tracked]:
        """The records held by a Prefect run, to compare with that run's state."""
        ...

    def repair(self, record: Tracked, reason: str) -> state_store.WriteResult:
        """Move ``record`` to failed, conditionally on it being unchanged."""
        ...

    def counters(self, scopes: set[str] | None, dry_run: bool) -> list[Finding]:
        """Findings for counters that disagree with their records (fixed unless ``dry_run``)."""
        ...


REGISTRY: dict[str, Adapter] = {}


def register(adapter: Adapter) -> Adapter:
    """Add ``adapter`` to the registry under its name; the adapter."""
    REGISTRY[adapter.name] = adapter
    return adapter


def _show(key: Mapping[str, Any]) -> str:
    return "/".join(str(v) for v in key.values())


@dataclass
class TableAdapter:
    """Records of one table with a status attribute: in-flight and completed values, and the failed value."""

    name: str
    table: str  # logical
    status_attr: str
    in_flight: str  # the status a record has while its Prefect run works on it
    completed: str | None  # None: completed records are not compared (their own exit status is the truth)
    failed: str
    key_attrs: tuple[str, ...]
    keep: Any = None  # extra predicate on items (e.g. chunk items only)
    error_attr: str = "error"
    ended_attr: str | None = None
    # the record is held by the whole flow run, not by the task that wrote it (that task ends at once)
    flow_level: bool = False
    action: str = "failed"  # what a repair does (shown in findings)

    def table_name(self) -> str:
        """The physical name of the adapter's table."""
        return config.table_name(self.table)

    def tracked(self) -> Iterable[Tracked]:
        """Items in the in-flight or completed status that carry Prefect run ids, as Tracked records."""
        roles = {self.in_flight: "in_flight"}
        if self.completed:
            roles[self.completed] = "completed"

        def wanted(item: Mapping[str, Any]) -> bool:
            """Whether the item has Prefect run ids, a compared status, and passes ``keep``."""
            has_ids = item.get("prefect_task_run_id") or item.get("prefect_flow_run_id")
            return bool(has_ids) and item.get(self.status_attr) in roles and (self.keep is None or self.keep(item))

        for item in state_store.scan_all(self.table_name(), keep=wanted):
            yield Tracked(
                {k: item[k] for k in self.key_attrs},
                item[self.status_attr],
                roles[item[self.status_attr]],
                item.get("prefect_flow_run_id"),
                None if self.flow_level else item.get("prefect_task_run_id"),
                self.scope_of(item),
            )

    def scope_of(self, item: Mapping[str, Any]) -> str | None:
        """The counter scope of an item: none for a plain table."""
        return None

    def increments(self, record: Tracked) -> list[Increment]:
        """Counter increments written with a repair: none for a plain table."""
        return []

    def guard(self, record: Tracked) -> state_store.Condition:
        """The repair's condition besides the status: the record is still owned by the same Prefect runs."""
        owners = {"prefect_flow_run_id": record.flow_run_id}
        if not self.flow_level:
            owners["prefect_task_run_id"] = record.task_run_id
        return state_store.unchanged(owners, "p")

    def repair(self, record: Tracked, reason: str) -> state_store.WriteResult:
        """Move to failed only if still in the status we saw and still owned by the same Prefect runs."""
        sets = {self.error_attr: reason, "reconciled_at": now_iso()}
        if self.ended_attr:
            sets[self.ended_attr] = now_iso()
        return state_store.transition(
            self.table_name(),
            record.key,
            record.status,
            self.failed,
            status_attr=self.status_attr,
            set=sets,
            condition=self.guard(record),
            increments=self.increments(record),
        )

    def counters(self, scopes: set[str] | None, dry_run: bool) -> list[Finding]:
        """Counter findings: none for a plain table (it keeps no counters)."""
        return []


class PhspectraAdapter(TableAdapter):
    """Seed 000 chunk items (``CHUNK#...``) and their RUN item's jobs_completed / jobs_failed counters.

    A chunk IN_PROGRESS whose lease is live has a fitter renewing it, whatever Prefect says of the run that
    started it: it is never compared, and a repair requires the lease to be still expired when it lands.
    """

    def __init__(self) -> None:
        super().__init__(
            "phspectra", "phspectra_runs", "status", survey.IN_PROGRESS, "COMPLETED", "FAILED", ("PK", "SK"),
            keep=self._unleased_chunk, ended_attr="completed_at",
        )

    @staticmethod
    def _unleased_chunk(item: Mapping[str, Any]) -> bool:
        """A chunk item, unless it is IN_PROGRESS with a live lease."""
        in_flight = item.get("status") == survey.IN_PROGRESS
        return item["SK"].startswith(CHUNK_SK_PREFIX) and not (in_flight and not survey.lease_expired(item))

    def guard(self, record: Tracked) -> state_store.Condition:
        """Unchanged owners and, for an in-flight chunk, a lease still expired (its fitter did not renew it)."""
        owned = super().guard(record)
        return owned & survey.lease_expired_condition() if record.role == "in_flight" else owned

    def scope_of(self, item: Mapping[str, Any]) -> str | None:
        """The chunk's run (its ``PK``)."""
        return item["PK"]

    def increments(self, record: Tracked) -> list[Increment]:
        """The RUN item's counter moves for a chunk marked failed (``jobs_completed`` back down if it had completed)."""
        amounts = {"jobs_failed": 1} if record.role == "in_flight" else {"jobs_failed": 1, "jobs_completed": -1}
        return [Increment(self.table_name(), {"PK": record.scope, "SK": RUN_SK}, amounts)]

    def counters(self, scopes: set[str] | None, dry_run: bool) -> list[Finding]:
        """RUN items whose job counters disagree with their chunks; reset them unless ``dry_run``."""
        table = self.table_name()
        if scopes is None:
            runs = list(state_store.scan_all(table, keep=lambda item: item["SK"] == RUN_SK))
        else:
            runs = [r for r in (state_store.get_item(table, {"PK": s, "SK": RUN_SK}) for s in sorted(scopes)) if r]
        findings = []
        for run in runs:
            chunks = survey.list_chunks(run["PK"])
            statuses = [c.get("status") for c in chunks]
            want = {"jobs_completed": statuses.count("COMPLETED"), "jobs_failed": statuses.count("FAILED")}
            have = {k: run.get(k) for k in want}
            if {k: (None if v is None else int(v)) for k, v in have.items()} == want:
                continue
            finding = Finding(
                self.name, _show({"PK": run["PK"], "SK": RUN_SK}), "run counters do not match chunk items",
                ", ".join(f"{k}={state_store.to_plain(v)}" for k, v in have.items()), "-",
                "set " + ", ".join(f"{k}={v}" for k, v in want.items()),
            )
            if not dry_run:
                result = state_store.transition(
                    table, {"PK": run["PK"], "SK": RUN_SK}, None, None, set=want, condition=state_store.unchanged(have, "c")
                )
                finding.outcome = "applied" if result.applied else "stale"
            findings.append(finding)
        return findings


register(PhspectraAdapter())


class GpuTaskAdapter(TableAdapter):
    """Seed 002 tasks: a task is held by its process on a node, not by the short Prefect task that started it,
    so the backend is asked first (local: the process; ECS: ``describe_tasks``). A task that still runs (or
    that the backend cannot tell about) is never tracked, so never TERMINATED; a stopped one gets the stop
    the backend reports (COMPLETE for exit 0, else TERMINATED), through the job's own guarded write, and
    ``gpu-sweep`` or the watcher moves its job on. A COMPLETE task stays: its exit code is the truth."""

    def __init__(self) -> None:
        super().__init__(
            "gpu", "ecs_task", "task_status", "IN_PROGRESS", None, "TERMINATED", ("ecs_task_id",),
            error_attr="termination_reason", ended_attr="updated_at",
        )

    def _exit(self, task_id: str):
        """The backend's answer (TaskExit), None while the task runs or when the backend cannot tell."""
        from tasks.gpu import jobs as gpu
        from tasks.gpu.backends import BackendError

        try:
            return gpu.make_runner().backend.poll(task_id)
        except BackendError as error:
            run_logger(__name__).warning("gpu task %s: cannot ask the backend (%s); left as it is", task_id, error)
            return None

    def tracked(self) -> Iterable[Tracked]:
        """In-flight task records whose task the backend says has stopped."""
        return [r for r in super().tracked() if self._exit(r.key["ecs_task_id"]) is not None]

    def repair(self, record: Tracked, reason: str) -> state_store.WriteResult:
        """Record the stop the backend reports, only if the task is still IN_PROGRESS and still stopped."""
        from tasks.gpu import jobs as gpu

        stopped = self._exit(record.key["ecs_task_id"])
        if stopped is None:
            return state_store.WriteResult(state_store.Outcome.STALE, None)
        return gpu.record_stop(record.key["ecs_task_id"], stopped.exit_code, f"{stopped.reason} ({reason})",
                               **{self.error_attr: reason, "reconciled_at": now_iso()})


register(GpuTaskAdapter())


class EtlManifestAdapter(TableAdapter):
    """Seed 001: a MANIFEST record `processing` while its ndjson-merge flow run ended -> completed with its files when
    the merge published its output (the best-effort status update was lost), else failed, and its files follow at
    once (``manifested#N -> failed#N``, what ``etl remediate`` / the hourly flush would do later)."""

    def __init__(self) -> None:
        super().__init__(
            "etl", "etl_file_tracking", "status", "processing", None, "failed", ("date_prefix", "file_key"),
            keep=lambda item: str(item.get("file_key", "")).startswith(MANIFEST_PREFIX),
            error_attr="error_message", ended_attr="updated_at", flow_level=True, action="finish",
        )

    def repair(self, record: Tracked, reason: str) -> state_store.WriteResult:
        """A published merge: the status update it lost (``complete_if_published``, guarded on ``processing``);
        otherwise the manifest to failed (guarded), then ``remediate_manifested`` for its date (guarded per file)."""
        from tasks.etl import merge as etl_merge
        from tasks.etl import ops as etl_ops

        item = state_store.get_item(self.table_name(), record.key)
        if item is not None and item.get("status") == record.status and item.get("prefect_flow_run_id") == record.flow_run_id:
            name = manifest_name_from_record_key(record.key["file_key"])
            finished = etl_merge.complete_if_published(record.key["date_prefix"], name, item["manifest_path"])
            if finished is not None:
                outcome = state_store.Outcome.APPLIED if finished["manifest_status"] == "completed" else state_store.Outcome.STALE
                run_logger(__name__).warning("etl %s: output published, status update completed: %s", _show(record.key), finished)
                return state_store.WriteResult(outcome, state_store.get_item(self.table_name(), record.key))
        result = super().repair(record, reason)
        if result.applied:
            moved = etl_ops.remediate_manifested(record.key["date_prefix"])
            run_logger(__name__).warning("etl %s: files followed the failed manifest: %s", _show(record.key), moved)
        return result


register(EtlManifestAdapter())


class VideoJobAdapter(TableAdapter):
    """Seed 003 jobs chunking or ``chunking_complete``: held by their video-process run and by the reassembly runs
    of their lock (``tasks.video.jobs.holders``). Once every one has ended, the job is recovered the way
    ``video-sweep-stuck`` does it (``recover_stuck_job``): reassembled, re-driven, or failed with the reason."""

    def __init__(self) -> None:
        super().__init__(
            "video", "video_jobs", "status", "chunking_in_progress", None, "failed", ("job_id",),
            error_attr="failure_reason", ended_attr="failed_at", flow_level=True, action="recover",
        )

    def tracked(self) -> Iterable[Tracked]:
        """Jobs chunking or chunking_complete with a process run, with the reassembly runs that also hold them."""
        from tasks.video import jobs as video

        active = (video.CHUNKING, video.CHUNKED)
        jobs = list(state_store.scan_all(
            self.table_name(), keep=lambda item: item.get("status") in active and bool(item.get("prefect_flow_run_id"))
        ))
        locks = {lock["job_id"]: lock for lock in state_store.get_many(config.table_name("video_reassembly_locks"),
                                                                       ({"job_id": job["job_id"]} for job in jobs))}
        for job in jobs:
            owner = str(job["prefect_flow_run_id"])
            others = tuple(r for r in video.holders(job, locks.get(job["job_id"])) if r != owner)
            yield Tracked({"job_id": job["job_id"]}, job["status"], "in_flight", owner, None, holders=others)

    def repair(self, record: Tracked, reason: str) -> state_store.WriteResult:
        """``recover_stuck_job`` for the job, only while it is held by the same run (else: stale)."""
        from tasks.video import jobs as video

        result = video.recover_stuck_job(record.key["job_id"], owner=record.flow_run_id, why=reason)
        run_logger(__name__).warning("video job %s: %s", record.key["job_id"], result)
        outcome = state_store.Outcome.STALE if result["action"] == "none" else state_store.Outcome.APPLIED
        return state_store.WriteResult(outcome, result)


register(VideoJobAdapter())


# --------------------------------------------------------------------------- Prefect's side


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
            for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=part)), limit=len(part)):
                if run.state is not None:
                    states[str(run.id)] = _ended_with_parent(client, run) or RunState(
                        str(run.id), run.state.type.value, run.state.name, "flow run")
        for start in range(0, len(tasks), 200):
            part = tasks[start : start + 200]
            for run in client.read_task_runs(task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=part)), limit=len(part)):
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
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=frontier)))
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


def reconcile(pipelines: Sequence[str] | None = None, dry_run: bool = True, run_ids: set[str] | None = None) -> list[Finding]:
    """Compare every adapter's tracked records with Prefect and repair (unless ``dry_run``)."""
    unknown = [p for p in pipelines or () if p not in REGISTRY]
    if unknown:
        raise LookupError(f"no reconciliation adapter for {', '.join(unknown)}; known: {', '.join(sorted(REGISTRY))}")
    adapters = [REGISTRY[p] for p in (pipelines or sorted(REGISTRY))]
    if run_ids is not None:
        run_ids = with_subflows(run_ids)
    tracked = {}
    for adapter in adapters:
        records = list(adapter.tracked())
        if run_ids is not None:
            records = [r for r in records if {r.flow_run_id, r.task_run_id, *r.holders} & run_ids]
        tracked[adapter.name] = records
    every = [r for records in tracked.values() for r in records]
    flow_runs = [run for r in every for run in (r.flow_run_id, *r.holders)]
    states = prefect_states(flow_runs, [r.task_run_id for r in every]) if every else {}
    findings: list[Finding] = []
    for adapter in adapters:
        for record in tracked[adapter.name]:
            state = effective_state(record, states)
            if state is None:
                if not {record.flow_run_id, record.task_run_id, *record.holders} & states.keys():
                    findings.append(Finding(adapter.name, _show(record.key), "Prefect run not found", record.status,
                                            "-", "none", "report-only"))
                continue
            target = transition_for(record.role, state.type)
            if target is None:
                continue
            label = f"{state.what} {state.id} {state.name}"
            reason = f"reconciled: record {record.status} while Prefect {label}"
            finding = Finding(adapter.name, _show(record.key), f"{record.status} while Prefect {state.name}", record.status, label,
                              f"-> {getattr(adapter, 'action', target)}")
            if not dry_run:
                result = adapter.repair(record, reason)
                finding.outcome = "applied" if result.applied else "stale"
            run_logger(__name__).warning("%s %s: %s (%s)", adapter.name, finding.record, finding.problem, finding.outcome)
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
            run_id = resource_id[len(prefix):]
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
    "Adapter", "Finding", "REGISTRY", "RunState", "TableAdapter", "Tracked", "disagreements", "effective_state",
    "prefect_states", "reconcile", "register", "rows", "run_ids_from_event", "transition_for", "wait_until_ended",
    "with_subflows",
]
