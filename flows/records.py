"""Records that agree (seed 004): workflow messages -> guarded records, dead-letter replay, reconciliation.

messages ──parse/validate──▶ invalid ──▶ granule failed + dead-letter-archive/{date}/
    │
    └─▶ derive (+ CMR file dates, Prefect run times) ──▶ execution ──▶ PDR ──▶ granules (guarded writes)
                                                                                      └─▶ rejected ──▶ archive
dead-letter-archive/{date}/ ──replay──▶ written: deleted │ failed again: dead-letter-archive/failed/{date}/
Prefect run states ──▶ records in flight / COMPLETED / run counters ──▶ guarded repairs + table artifact
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

from prefect import Flow, get_run_logger, task
from prefect.artifacts import create_table_artifact

from flows.policies import HEAVY_RETRIES, TRANSIENT_RETRIES, pipeline_flow, retry_policy
from tasks import reconcile
from tasks.core.errors import RefusedInput
from tasks.core.runtime import utc_now
from tasks.landing.listener import listen_report, open_source
from tasks.records import keys
from tasks.records import landing as records_landing
from tasks.records import messages as records_messages

# The Prefect server stores a flow run's parameters as given but serves them back through orjson, which refuses
# integers beyond 64 bits: one such run makes every flow-run listing that includes it answer 500 (Prefect issue
# #15031), the UI's Runs page included. Prefect Cloud also caps a run's parameters at 512 KB.
JSON_INTS = (-(2**63), 2**64 - 1)
PARAMETERS_BYTES = 512 * 1024


class UnservableParameters(RefusedInput):
    """Flow-run parameters the Prefect server could not serve back: refused before the run is created."""


def parameter_problems(value: Any, path: str = "") -> list[str]:
    """Where ``value`` (JSON-ready) holds what the Prefect server cannot serve back: big integers, NaN/Infinity."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, int):
        return [] if JSON_INTS[0] <= value <= JSON_INTS[1] else [f"{path or '(value)'}: integer beyond 64 bits"]
    if isinstance(value, float):
        return [] if math.isfinite(value) else [f"{path or '(value)'}: {value} is not JSON"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in parameter_problems(v, f"{path}/{k}" if path else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in parameter_problems(v, f"{path}/{i}" if path else str(i))]
    return []


class CheckedFlow(Flow):
    """A flow that refuses, before its run exists, parameters that would break the Prefect server's listings or
    exceed Prefect Cloud's cap (``with_options`` returns a plain Flow: check again if you use it)."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """Prefect's serialisation, then the checks; ``UnservableParameters`` names every problem."""
        serialized = super().serialize_parameters(parameters)
        problems = parameter_problems(serialized)
        if problems:
            raise UnservableParameters(
                f"{self.name}: refused before creating the flow run, the Prefect server could not list it "
                f"(Prefect issue #15031): {'; '.join(problems[:5])}{' …' if len(problems) > 5 else ''}. "
                "Pass messages as text bodies (as SQS delivers them) or as messages_url."
            )
        size = len(json.dumps(serialized))
        if size > PARAMETERS_BYTES:
            raise UnservableParameters(
                f"{self.name}: parameters of {size} bytes exceed {PARAMETERS_BYTES} (Prefect Cloud's cap): "
                "write the batch to the object store and pass messages_url"
            )
        return serialized


ingest_task = task(records_messages.ingest_messages, name="ingest-messages", **TRANSIENT_RETRIES)
replay_task = task(records_messages.replay_archive, name="replay-dead-letters", **retry_policy(5))
reconcile_task = task(reconcile.reconcile_rows, name="reconcile-records", **HEAVY_RETRIES)


def _summary_artifact(key: str, findings: list[dict], dry_run: bool) -> None:
    rows = findings or [{"pipeline": "-", "record": "-", "problem": "none: Prefect and DynamoDB agree", "outcome": "-"}]
    create_table_artifact(
        key=key, table=rows, description=f"records reconciliation ({'dry run' if dry_run else 'repairs applied'})"
    )


@pipeline_flow("records-ingest", flow_class=CheckedFlow)
def records_ingest(messages: list[str] | None = None, messages_url: str | None = None) -> dict[str, Any]:
    """Cumulus workflow messages as text bodies (as SQS delivers them), or the batch file at ``messages_url``
    (a JSON list or one body per line, file:// or s3://) -> execution and granule records."""
    if (messages is None) == (messages_url is None):
        raise ValueError(
            "records-ingest: give messages (a list of text bodies) or messages_url (an object-store URL), not both"
        )
    logger = get_run_logger()
    summary = ingest_task(messages, messages_url)
    stale = sum(kind["stale"] for kind in summary["records"].values())
    logger.info(
        "%d messages: %d ok, %d archived; %d stale writes dropped; records %s",
        summary["messages"],
        summary["ok"],
        summary["archived"],
        stale,
        summary["records"],
    )
    for message_id, error in summary["errors"].items():
        text = error["message"] if len(error["message"]) <= 1000 else error["message"][:1000] + " …"
        logger.warning("message %s archived: %s: %s", message_id, error["type"], text)
    return summary


def ingest_batch(bodies: list[str]) -> tuple[dict[str, Any], str]:
    """One batch through records-ingest (a child run of the listener): its summary and its flow run's id."""
    state = records_ingest(messages=bodies, return_state=True)
    return state.result(), str(state.state_details.flow_run_id)


@pipeline_flow("records-listen")
def records_listen(
    source: str = "local",
    max_runtime_seconds: float = 0,
    batch_size: int = records_landing.BATCH,
    batch_seconds: float = 1.0,
    wait_seconds: float = 20.0,
) -> dict[str, int]:
    """Seed 004's queue: workflow messages, in batches of 10, through records-ingest (records or dead-letter archive).

    ``source``: "sqs" reads the workflow-message queue; "local" watches ``records/incoming/`` of the object store
    for message files (one message, a JSON list, or one per line), moved to ``records/processed/{date}/`` once
    written. Runs for ``max_runtime_seconds`` (0: until cancelled); the deployment restarts it.
    """

    def events():
        return open_source(
            source, records_landing.PIPELINE, None, keys.RECORDS_INCOMING_PREFIX, records_landing.SUFFIXES
        )

    return listen_report(
        "records-listen",
        events,
        lambda batch: records_landing.handle_messages(batch, ingest_batch),
        batch_size=batch_size,
        batch_seconds=batch_seconds,
        max_runtime_seconds=max_runtime_seconds,
        wait_seconds=wait_seconds,
    )


@pipeline_flow("records-replay-dla", flow_class=CheckedFlow)
def records_replay_dla(day: str | None = None, message_ids: list[str] | None = None) -> dict[str, Any]:
    """Reprocess dead-letter-archive/{day}/ (or only ``message_ids``)."""
    if day is None:  # the scheduled run replays yesterday's archive (UTC)
        day = (utc_now() - timedelta(days=1)).date().isoformat()
    result = replay_task(day, message_ids)
    get_run_logger().info(
        "replayed %s: %d written (deleted), %d failed again (moved to failed/)",
        day,
        len(result["written"]),
        len(result["failed"]),
    )
    return result


@pipeline_flow("records-reconcile", flow_class=CheckedFlow)
def records_reconcile(pipelines: list[str] | None = None, dry_run: bool = False) -> list[dict]:
    """Prefect <-> DynamoDB reconciliation for every registered pipeline (or ``pipelines``)."""
    findings = reconcile_task(pipelines, dry_run)
    _summary_artifact("records-reconcile", findings, dry_run)
    get_run_logger().info("%d disagreements found (%s)", len(findings), "dry run" if dry_run else "repaired")
    return findings


@pipeline_flow("records-prefect-state", flow_class=CheckedFlow)
def records_prefect_state(event: dict[str, Any]) -> list[dict]:
    """A Prefect flow-run/task-run Crashed/Failed event -> repair the records of that run."""
    name, run_ids = reconcile.run_ids_from_event(event)
    states = reconcile.wait_until_ended(run_ids)
    get_run_logger().info("event %s: Prefect now says %s", name, {r: s.name for r, s in states.items()})
    findings = reconcile_task(None, False, sorted(run_ids))
    get_run_logger().info("event %s for %s: %d records repaired", name, ", ".join(run_ids), len(findings))
    _summary_artifact("records-prefect-state", findings, False)
    return findings
