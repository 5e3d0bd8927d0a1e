"""``pipelines-retention`` as the shared machinery sees it: one scheduled upkeep flow over every pipeline."""

from __future__ import annotations

from tasks.core.registry import Pipeline

PIPELINE = Pipeline(name="retention", seed=91, maintenance_flows=("pipelines-retention",))
