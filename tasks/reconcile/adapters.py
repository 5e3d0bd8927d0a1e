"""What reconciliation compares: records that carry Prefect run ids, and the adapter each pipeline gives for them.

A pipeline declares its adapters (``reconcile_adapters`` in its ``pipeline.py``); most are a ``TableAdapter``: the
records of one table with a status attribute, repaired through guarded transitions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tasks.core import config, state_store
from tasks.core.runtime import now_iso
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


def show_key(key: Mapping[str, Any]) -> str:
    """A record's key as ``a/b``, for findings and logs."""
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
