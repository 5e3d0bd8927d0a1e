"""Seed 001, NDJSON -> Parquet, as the shared machinery sees it (``tasks.core.registry``)."""

from __future__ import annotations

from tasks.core.registry import OBJECTS, Landing, Pipeline, QueueSpec, Table
from tasks.core.tables import Index, TableSpec
from tasks.etl import keys

MERGE_TIMEOUT_S = 48 * 3600  # the Glue job's timeout: 2880 minutes
STATUS_UPDATE_TIMEOUT_S = 180  # the batch status updater Lambda's
MANIFEST_BUILDER_TIMEOUT_S = 180  # the manifest builder Lambda's

PIPELINE = Pipeline(
    name="etl",
    seed=1,
    tables={
        "etl_file_tracking": Table(
            TableSpec(
                "date_prefix", "file_key", gsis=(Index("status-index", "status", "date_prefix"),), ttl_attribute="ttl"
            ),
            "ndjson-parquet-sqs-file-tracking-{env}",
        ),
        "etl_metrics": Table(
            TableSpec("metric_type", "timestamp", ttl_attribute="ttl", key_types={"timestamp": "N"}),
            "ndjson-parquet-sqs-metrics-{env}",
        ),
    },
    # `ndjson-parquet-file-events-{env}`, 6-minute visibility (sqs_visibility_timeout = 360), long polling 20 s,
    # 3 receives then `ndjson-parquet-dlq-{env}`; its objects land in the ETL's own input store
    landing=Landing(
        "ndjson-listen",
        keys.INPUT_PREFIX,
        QueueSpec("ndjson-parquet-file-events-{env}", "ndjson-parquet-dlq-{env}", 360, OBJECTS, keys.INPUT_PREFIX),
        store="tasks.etl.landing:input_store_url",
    ),
    flows=("ndjson-ingest", "ndjson-merge"),
    maintenance_flows=("ndjson-flush-orphans",),
    flow_timeouts={"ndjson-merge": MERGE_TIMEOUT_S},
    task_timeouts={
        "track-and-batch-files": MANIFEST_BUILDER_TIMEOUT_S,
        "claim-and-create-manifests": MANIFEST_BUILDER_TIMEOUT_S,
        "batch-status-update": STATUS_UPDATE_TIMEOUT_S,
    },
    health_checks="tasks.etl.alarms:CHECKS",
    service_checks="tasks.etl.alarms:SERVICE_CHECKS",
    # failures, timeouts and dead letters are CRITICAL; backlog, age and throttling are WARNING
    severities={
        "etl-merge-runs-failed": "CRITICAL",
        "etl-merge-file-failures": "CRITICAL",
        "etl-failed-manifests": "CRITICAL",
        "etl-merge-paused": "CRITICAL",  # every ingest's merges held
        "etl-catalog-unregistered": "CRITICAL",  # a date's rows missing from every query of the table
        "etl-merges-waiting-for-space": "CRITICAL",  # a merge met a full disk (ENOSPC): nothing merges there
        "etl-iterator-age": "WARNING",
        "etl-files-pending": "WARNING",
        "etl-files-pending-too-long": "WARNING",
        "etl-tracking-read-throttles": "WARNING",
        "etl-tracking-write-throttles": "WARNING",
    },
    object_retention="tasks.etl.retention:age_out_staging",
    reconcile_adapters="tasks.etl.reconcile:ADAPTERS",
    dashboard="tasks.etl.alarms:figures",
    aws="tasks.etl.aws:PARTS",
)
