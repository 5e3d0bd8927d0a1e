"""Seed 004, the status-write rules of Cumulus's records with a dead-letter archive, as the shared machinery sees
it (``tasks.core.registry``)."""

from __future__ import annotations

from tasks.core.registry import MESSAGES, RECORD_FLOWS, Deployment, Landing, Pipeline, QueueSpec, Table
from tasks.core.tables import TableSpec
from tasks.records import keys

PIPELINE = Pipeline(
    name="records",
    seed=4,
    tables={  # no TTL: Cumulus keeps granule and execution records until an operator deletes them
        "granules": Table(TableSpec("granuleId"), "granules"),
        "executions": Table(TableSpec("arn"), "executions"),
        "pdrs": Table(TableSpec("pdrName"), "pdrs"),
    },
    # workflow messages on sfEventSqsToDbRecordsInputQueue in batches of 10; visibility acquireTimeoutMillis / 1000
    # + 60 = 150 s with Cumulus's default 90 s acquire timeout; locally, message files in a folder
    landing=Landing(
        "records-listen",
        keys.RECORDS_INCOMING_PREFIX,
        QueueSpec("sfEventSqsToDbRecordsInputQueue-{env}", "sfEventSqsToDbRecordsDeadLetterQueue-{env}", 150, MESSAGES),
        suffixes=keys.MESSAGE_SUFFIXES,
    ),
    flows=("records-ingest",),
    maintenance_flows=("records-replay-dla", "records-reconcile"),
    health_checks="tasks.records.alarms:CHECKS",
    service_checks="tasks.records.alarms:SERVICE_CHECKS",
    severities={"records-dead-letter-archive": "CRITICAL", "records-archived-per-hour": "CRITICAL"},
    object_retention="tasks.records.retention:age_out_failed_dead_letters",
    dashboard="tasks.records.alarms:figures",
    deployments=(
        Deployment(
            "flows/records.py:records_ingest",
            "Seed 004: workflow messages (text bodies as SQS delivers them, or messages_url of a batch file) →"
            " execution and granule records under the stale-write rules.",
            limit="fan_out_local",
            aws_limit="records_limit_aws",
        ),
        Deployment(
            "flows/records.py:records_listen",
            "Seed 004's queue: workflow messages in batches of 10 through records-ingest. Locally: message files"
            " dropped under records/incoming/ (moved to records/processed/{date}/ once written); in AWS: the SQS"
            " queue.",
        ),
        Deployment(
            "flows/records.py:records_replay_dla",
            "Replay dead-letter-archive/{day}/ (default yesterday); failures move to failed/{day}/.",
            schedule="replay_needs_a_person",
        ),
        Deployment(
            "flows/records.py:records_reconcile",
            "Compare Prefect's run/task states with the DynamoDB records and repair through guarded transitions.",
            schedule="every_10_minutes",
            parameters={"dry_run": False},
            maintenance_service=True,
        ),
        Deployment(
            "flows/records.py:records_prefect_state",
            "React to a pipeline run that Prefect marks Crashed/Failed/Cancelled: move its records.",
            triggers=(
                {
                    "type": "event",
                    "enabled": True,
                    "match": {"prefect.resource.id": ["prefect.flow-run.*", "prefect.task-run.*"]},
                    # only the pipelines' runs (Pipeline.record_flows), never this flow's own (it would trigger itself)
                    "match_related": {"prefect.resource.role": "flow", "prefect.resource.name": RECORD_FLOWS},
                    "expect": [
                        "prefect.flow-run.Crashed",
                        "prefect.flow-run.Failed",
                        "prefect.flow-run.Cancelled",
                        "prefect.task-run.Failed",
                        "prefect.task-run.Crashed",
                    ],
                    "posture": "Reactive",
                    "threshold": 1,
                    "parameters": {"event": "{{ event }}"},
                },
            ),
        ),
    ),
)
