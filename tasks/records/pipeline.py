"""Seed 004, the status-write rules of Cumulus's records with a dead-letter archive, as the shared machinery sees
it (``tasks.core.registry``)."""

from __future__ import annotations

from tasks.core.registry import MESSAGES, Landing, Pipeline, QueueSpec, Table
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
)
