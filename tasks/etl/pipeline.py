"""Seed 001, NDJSON -> Parquet, as the shared machinery sees it (``tasks.core.registry``)."""

from __future__ import annotations

from tasks.core.registry import OBJECTS, SET, Deployment, Landing, Pipeline, QueueSpec, Table, run_trigger
from tasks.core.tables import Index, TableSpec
from tasks.etl import keys

MERGE_TIMEOUT_S = 48 * 3600  # the Glue job's timeout: 2880 minutes
STATUS_UPDATE_TIMEOUT_S = 180  # the batch status updater Lambda's
MANIFEST_BUILDER_TIMEOUT_S = 180  # the manifest builder Lambda's
MERGE_DEPLOYMENT = f"ndjson-merge/{SET}"
THIS_SET = {"prefect.resource.role": "deployment", "prefect.resource.name": SET}  # a run of the same set's deployment
MERGE_RUN = {"prefect.resource.role": "flow", "prefect.resource.name": "ndjson-merge"}
ENDED_BADLY = ["prefect.flow-run.Failed", "prefect.flow-run.Crashed", "prefect.flow-run.TimedOut"]

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
    deployments=(
        Deployment(
            "flows/etl.py:ndjson_ingest",
            "Seed 001 manifest builder: validate, track, claim-first batching, start merges.",
            limit="ingest_limit",
            aws_limit="ingest_limit_aws",
            parameters={"merge_deployment": MERGE_DEPLOYMENT},
        ),
        Deployment(
            "flows/etl.py:ndjson_listen",
            "Seed 001's S3 event → SQS → Lambda: files landing under pipeline/input/{date}/ tracked and batched as they"
            " arrive (long-running; `make up` starts it).",
            parameters={"merge_deployment": MERGE_DEPLOYMENT},
        ),
        Deployment(
            "flows/etl.py:ndjson_merge",
            "Seed 001 Step Functions + Glue + batch status updater: Dask/pyarrow merge of the manifest its"
            " manifest.ready event names, then of further pending ones (each its own record, output, retries).",
            limit="merge_limit",
            aws_limit="merge_limit_aws",
            # a run's start costs seconds of CPU and ~25 Prefect API requests, a manifest's merge a fraction of a
            # second: each run takes what is pending and stays for what comes until more_seconds from its start (the
            # launcher leaves new manifests to it), so a steady feed costs a run a minute
            parameters={"more_manifests": 500, "more_seconds": 60, "stay_for_more": True},
            aws_parameters={
                "more_seconds": 120
            },  # an ECS run's start is a Fargate task's (~1 minute): each stays longer
            triggers=(
                {  # seed 001's decoupled route (ManifestReady on EventBridge → Step Functions): the ingest emits it
                    "type": "event",
                    "enabled": True,
                    "match": {"prefect.resource.id": "etl.manifest.*", "etl.merge-deployment": MERGE_DEPLOYMENT},
                    "expect": ["manifest.ready"],  # tasks.etl.ingest.MANIFEST_READY
                    "posture": "Reactive",
                    "threshold": 1,
                    "parameters": {
                        "date_prefix": "{{ event.payload.date_prefix }}",
                        "manifest_name": "{{ event.payload.manifest_name }}",
                    },
                },
            ),
        ),
        Deployment(
            "flows/etl.py:ndjson_merge_breaker",
            "Seed 001 circuit breaker: 3 merge failures in 300 s pause ndjson-merge (manifests wait pending); one trial"
            " after 300 s (a check the trip schedules for then); closed on its success. Each check makes the pause"
            " follow the state and announces manifests no run will take; the schedule is a backstop.",
            limit="breaker_limit",
            schedule="every_10_minutes",
            parameters={"merge_deployment": MERGE_DEPLOYMENT},
            triggers=(
                # seed: 3 failures → OPEN for 300 s (Prefect counts them: threshold and window)
                run_trigger(
                    ENDED_BADLY,
                    [MERGE_RUN, THIS_SET],
                    threshold=3,
                    within=300,
                    parameters={
                        "merge_deployment": MERGE_DEPLOYMENT,
                        "action": "trip",
                        "reason": "3 merge runs failed within 300 s",
                    },
                ),
                # the HALF_OPEN trial (tasks.etl.ingest.TRIAL_TAG) ended: close or open again at once
                run_trigger(
                    ["prefect.flow-run.Completed", *ENDED_BADLY, "prefect.flow-run.Cancelled"],
                    [{"prefect.resource.role": "tag", "prefect.resource.id": "prefect.tag.breaker-trial"}, THIS_SET],
                    parameters={"merge_deployment": MERGE_DEPLOYMENT, "action": "check"},
                ),
                # a merge run ended Cancelled/Crashed, maybe while queued with manifests left to it: a check announces
                # them at once (the run they were left to is gone: whatever is pending now)
                run_trigger(
                    ["prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"],
                    [MERGE_RUN, THIS_SET],
                    parameters={"merge_deployment": MERGE_DEPLOYMENT, "action": "check", "announce_after_seconds": 0},
                ),
            ),
            maintenance_service=True,
        ),
        Deployment(
            "flows/etl.py:ndjson_flush_orphans",
            "Close earlier days' partial batches, restart manifests left pending, release claims whose manifest never"
            " came to exist.",
            schedule="hourly",
            parameters={"merge_deployment": MERGE_DEPLOYMENT},
        ),
    ),
    record_flows=("ndjson-ingest", "ndjson-merge", "ndjson-flush-orphans"),
)
