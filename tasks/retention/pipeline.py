"""``pipelines-retention`` as the shared machinery sees it: one scheduled upkeep flow over every pipeline."""

from __future__ import annotations

from tasks.core.registry import Deployment, Pipeline

PIPELINE = Pipeline(
    name="retention",
    seed=91,
    maintenance_flows=("pipelines-retention",),
    deployments=(
        Deployment(
            "flows/retention.py:pipelines_retention",
            "Finished records get a DynamoDB TTL (30 days after they ended; live ones never), merge staging older"
            " than the merge timeout is deleted; failed dead letters only when dead_letter_days is set.",
            schedule="daily",
            parameters={"record_days": 30},
        ),
    ),
)
