"""Seed 000, spectral-cube survey fitting, as the shared machinery sees it (``tasks.core.registry``)."""

from __future__ import annotations

from tasks.core.registry import OBJECTS, SET, Deployment, Landing, Pipeline, QueueSpec, Table
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
    deployments=(
        Deployment(
            "flows/phspectra_survey.py:phspectra_survey",
            "Seed 000: split a cube → map(fit chunk) → aggregate, per-chunk records in phspectra-runs. Resume: run_id"
            " alone (the run's stored parameters).",
            limit="fan_out_local",
            aws_limit="survey_limit_aws",
            # no chunk_size here: a new run's default is 500, and a resume keeps the run's own (a given one must match)
            parameters={"lease_seconds": 60},
        ),
        Deployment(
            "flows/phspectra_survey.py:phspectra_sweep_stuck",
            "No run stays RUNNING: re-drive runs whose flow run ended or went quiet (at most max_sweeps times, then"
            " FAILED with the reason), and chunks whose lease expired.",
            schedule="every_5_minutes",
            parameters={"lease_seconds": 60, "quiet_minutes": 15, "max_sweeps": 3},
            maintenance_service=True,
        ),
        Deployment(
            "flows/phspectra_survey.py:phspectra_listen",
            "Seed 000 upload: a cube (surveys/incoming/{survey}/*.fits) or a survey manifest (*.json listing cubes)"
            " landing starts one phspectra-survey run per cube.",
            parameters={"survey_deployment": f"phspectra-survey/{SET}"},
        ),
        Deployment(
            "flows/phspectra_catalog.py:phspectra_survey_catalog",
            "A survey's tiles (one phspectra-survey run each): progress artifacts, and its catalog"
            " (catalogs/survey=…/tile=…/) rebuilt from each tile's newest completed run (a survey's last tile run"
            " builds it too).",
        ),
    ),
    record_flows=("phspectra-survey", "phspectra-fit-chunks", "phspectra-sweep-stuck"),
)
