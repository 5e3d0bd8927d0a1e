"""Seed 000, spectral-cube survey fitting, as the shared machinery sees it (``tasks.core.registry``)."""

from __future__ import annotations

from tasks.core.registry import OBJECTS, Landing, Pipeline, QueueSpec, Table
from tasks.core.tables import Index, TableSpec
from tasks.phspectra import keys

PIPELINE = Pipeline(
    name="phspectra",
    seed=0,
    tables={
        "phspectra_runs": Table(
            TableSpec("PK", "SK", gsis=(Index("GSI1", "GSI1_PK", "GSI1_SK"),), ttl_attribute="ttl"), "phspectra-runs"
        ),
    },
    # the survey CLI uploads a cube or a manifest that starts a run (access pattern 3); the seed's Lambda worker ran
    # 15 minutes at most, and starting a run takes seconds, so the ETL's 6 minutes is ample
    landing=Landing(
        "phspectra-listen",
        keys.SURVEY_INCOMING_PREFIX,
        QueueSpec(
            "phspectra-survey-uploads-{env}",
            "phspectra-survey-uploads-dlq-{env}",
            360,
            OBJECTS,
            keys.SURVEY_INCOMING_PREFIX,
        ),
    ),
    flows=("phspectra-survey", "phspectra-fit-chunks"),
    maintenance_flows=("phspectra-sweep-stuck",),
    health_checks="tasks.phspectra.alarms:CHECKS",
    severities={"phspectra-stuck-chunks": "WARNING"},
    retention_rules="tasks.phspectra.retention:RULES",
    reconcile_adapters="tasks.phspectra.reconcile:ADAPTERS",
    dashboard="tasks.phspectra.alarms:figures",
)
