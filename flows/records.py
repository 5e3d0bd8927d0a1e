"""Records that agree (seed 004): workflow messages -> guarded records, dead-letter replay, reconciliation.

    messages ──parse/validate──▶ invalid ──▶ granule failed + dead-letter-archive/{date}/
        │
        └─▶ derive ──▶ granules (guarded writes) ──▶ execution (guarded write) ──▶ rejected ──▶ archive
    dead-letter-archive/{date}/ ──replay──▶ written: deleted │ failed again: dead-letter-archive/failed/{date}/
    Prefect run states ──▶ records in flight / COMPLETED / run counters ──▶ guarded repairs + table artifact
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact

from tasks import dead_letter, reconcile, records_messages
from tasks.notify import notify_on_failure


def ingest_messages(messages: list[dict[str, Any] | str]) -> dict[str, Any]:
    """Write the records of a batch of messages under the write rules; archive rejected messages."""
    report = records_messages.ingest(messages)
    return {**report.counts(), "errors": report.errors()}


def replay_archive(day: str, message_ids: list[str] | None) -> dict[str, Any]:
    """Reprocess archived messages of one day; delete what was written, move what failed to failed/."""

    def process(payloads: list[Any], ids: list[str]) -> list[dict | None]:
        report = records_messages.ingest(payloads, ids=ids, archive=False)
        return [o.error for o in report.outcomes]

    return dead_letter.replay(day, process, message_ids).as_dict()


def reconcile_records(pipelines: list[str] | None, dry_run: bool, run_ids: list[str] | None = None) -> list[dict]:
    """Compare Prefect run states with the pipelines' records and repair through guarded transitions."""
    findings = reconcile.reconcile(pipelines, dry_run=dry_run, run_ids=set(run_ids) if run_ids else None)
    return reconcile.rows(findings)


ingest_task = task(ingest_messages, name="ingest-messages", retries=2, retry_delay_seconds=[2, 10])
replay_task = task(replay_archive, name="replay-dead-letters", retries=1, retry_delay_seconds=[5])
reconcile_task = task(reconcile_records, name="reconcile-records", retries=2, retry_delay_seconds=[5, 30])


def _summary_artifact(key: str, findings: list[dict], dry_run: bool) -> None:
    rows = findings or [{"pipeline": "-", "record": "-", "problem": "none: Prefect and DynamoDB agree", "outcome": "-"}]
    create_table_artifact(key=key, table=rows, description=f"records reconciliation ({'dry run' if dry_run else 'repairs applied'})")


@flow(name="records-ingest", log_prints=True, on_failure=[notify_on_failure], on_crashed=[notify_on_failure])
def records_ingest(messages: list[dict[str, Any] | str]) -> dict[str, Any]:
    """Cumulus workflow messages (dicts or raw JSON bodies) -> execution and granule records."""
    logger = get_run_logger()
    summary = ingest_task(messages)
    stale = sum(kind["stale"] for kind in summary["records"].values())
    logger.info("%d messages: %d ok, %d archived; %d stale writes dropped; records %s",
                summary["messages"], summary["ok"], summary["archived"], stale, summary["records"])
    for message_id, error in summary["errors"].items():
        logger.warning("message %s archived: %s: %s", message_id, error["type"], error["message"])
    return summary


@flow(name="records-replay-dla", log_prints=True, on_failure=[notify_on_failure], on_crashed=[notify_on_failure])
def records_replay_dla(day: str | None = None, message_ids: list[str] | None = None) -> dict[str, Any]:
    """Reprocess dead-letter-archive/{day}/ (or only ``message_ids``)."""
    if day is None:  # the scheduled run replays yesterday's archive (UTC)
        from datetime import datetime, timedelta, timezone

        day = (datetime.now(timezone.utc) - timedelta(days=1)).date().isoformat()
    result = replay_task(day, message_ids)
    get_run_logger().info("replayed %s: %d written (deleted), %d failed again (moved to failed/)",
                          day, len(result["written"]), len(result["failed"]))
    return result


@flow(name="records-reconcile", log_prints=True, on_failure=[notify_on_failure], on_crashed=[notify_on_failure])
def records_reconcile(pipelines: list[str] | None = None, dry_run: bool = False) -> list[dict]:
    """Prefect <-> DynamoDB reconciliation for every registered pipeline (or ``pipelines``)."""
    findings = reconcile_task(pipelines, dry_run)
    _summary_artifact("records-reconcile", findings, dry_run)
    get_run_logger().info("%d disagreements found (%s)", len(findings), "dry run" if dry_run else "repaired")
    return findings


@flow(name="records-prefect-state", log_prints=True, on_failure=[notify_on_failure], on_crashed=[notify_on_failure])
def records_prefect_state(event: dict[str, Any]) -> list[dict]:
    """A Prefect flow-run/task-run Crashed/Failed event -> repair the records of that run."""
    name, run_ids = reconcile.run_ids_from_event(event)
    states = reconcile.wait_until_ended(run_ids)
    get_run_logger().info("event %s: Prefect now says %s", name, {r: s.name for r, s in states.items()})
    findings = reconcile_task(None, False, sorted(run_ids))
    get_run_logger().info("event %s for %s: %d records repaired", name, ", ".join(run_ids), len(findings))
    _summary_artifact("records-prefect-state", findings, False)
    return findings
