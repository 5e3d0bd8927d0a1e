"""The phspectra pipeline's retention: an ended run's RUN item and its chunk items get the same ttl."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.phspectra import survey
from tasks.phspectra.keys import RUN_SK
from tasks.retention.sweep import Child, Rule


def _chunks(run: Mapping[str, Any], cache: dict[str, Any]) -> list[Child]:
    return [("phspectra_runs", {"PK": c["PK"], "SK": c["SK"]}, "ttl" in c) for c in survey.list_chunks(run["PK"])]


RULES = (
    Rule(
        "phspectra_runs",
        ("PK", "SK"),
        "status",
        (survey.RUN_COMPLETED, survey.RUN_FAILED),
        ("completed_at", "created_at"),
        keep=lambda item: item["SK"] == RUN_SK,
        children=_chunks,
    ),
)
