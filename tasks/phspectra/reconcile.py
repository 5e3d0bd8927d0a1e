"""The phspectra pipeline's reconciliation adapter: chunk items and their run's counters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.core import state_store
from tasks.core.state_store import Increment
from tasks.phspectra import survey
from tasks.phspectra.keys import CHUNK_SK_PREFIX, RUN_SK
from tasks.reconcile.adapters import Finding, TableAdapter, Tracked, show_key


class PhspectraAdapter(TableAdapter):
    """Seed 000 chunk items (``CHUNK#...``) and their RUN item's jobs_completed / jobs_failed counters.

    A chunk IN_PROGRESS whose lease is live has a fitter renewing it, whatever Prefect says of the run that
    started it: it is never compared, and a repair requires the lease to be still expired when it lands.
    """

    def __init__(self) -> None:
        super().__init__(
            "phspectra",
            "phspectra_runs",
            "status",
            survey.IN_PROGRESS,
            "COMPLETED",
            "FAILED",
            ("PK", "SK"),
            keep=self._unleased_chunk,
            ended_attr="completed_at",
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
                self.name,
                show_key({"PK": run["PK"], "SK": RUN_SK}),
                "run counters do not match chunk items",
                ", ".join(f"{k}={state_store.to_plain(v)}" for k, v in have.items()),
                "-",
                "set " + ", ".join(f"{k}={v}" for k, v in want.items()),
            )
            if not dry_run:
                result = state_store.transition(
                    table,
                    {"PK": run["PK"], "SK": RUN_SK},
                    None,
                    None,
                    set=want,
                    condition=state_store.unchanged(have, "c"),
                )
                finding.outcome = "applied" if result.applied else "stale"
            findings.append(finding)
        return findings


ADAPTERS = (PhspectraAdapter(),)
