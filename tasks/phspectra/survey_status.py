"""A survey's progress over its tiles (seed 000's "22 tiles" as one view): one RUN per tile, summarised.

    runs of the survey ── GSI1 (access pattern 3, every run) ──> RUN items, re-read strongly consistent
    runs a landing started ── their LANDING item (run ids and tiles) ──> tiles whose run has not split yet
    per tile: its newest run (PENDING before its split) ──> tiles completed / failed / running / pending,
                                                            spectra fitted of total, components

A tile is a cube (``keys.tile_name``: its file name without ``.fits``); a re-run of a cube is a newer run of the
same tile and replaces the older one here. Nothing is written: every figure comes from ``phspectra-runs``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from boto3.dynamodb.conditions import Key

from tasks.core import keys, state_store
from tasks.core.state_store import to_plain
from tasks.phspectra import keys as phspectra_keys
from tasks.phspectra import survey as ph

PENDING = "PENDING"  # a tile whose run a landing started but whose split has not written its RUN item yet


def run_tile(run: dict[str, Any]) -> str:
    """The tile of a run: its cube's (``keys.tile_name``), or the run id for a cube with no usable name."""
    try:
        return phspectra_keys.tile_name(run.get("cube_url") or "")
    except keys.InvalidKey:
        return run["PK"]


def survey_runs(survey: str) -> list[dict[str, Any]]:
    """Every RUN item of ``survey``, newest first: GSI1 finds them (access pattern 3 without its limit), then each
    is read again strongly consistent (a GSI lags its table)."""
    condition = Key("GSI1_PK").eq(keys.safe_id(survey, "survey"))
    found = state_store.query_all(
        ph.runs_table(), IndexName="GSI1", KeyConditionExpression=condition, ScanIndexForward=False
    )
    runs = state_store.get_many(ph.runs_table(), [ph.run_key(item["PK"]) for item in found])
    return sorted((to_plain(run) for run in runs), key=lambda run: (run.get("created_at", ""), run["PK"]), reverse=True)


def started_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """(run_id, tile, started_at) of every run that the landings of ``runs`` started, from their LANDING items."""
    pks = {phspectra_keys.landing_pk_of_run(run["PK"]) for run in runs} - {None}
    landings = state_store.get_many(
        ph.runs_table(), [{"PK": pk, "SK": phspectra_keys.LANDING_SK} for pk in sorted(pks)]
    )
    return [
        {"run_id": run_id, "tile": tile, "started_at": landing.get("started_at", "")}
        for landing in map(to_plain, landings)
        for run_id, tile in zip(
            landing.get("run_ids", []), landing.get("tiles", [])
        )  # tiles: landings since survey status
    ]


def tile_runs(survey: str) -> dict[str, list[dict[str, Any]]]:
    """Tile -> its runs, newest first; a run a landing started that has no RUN item yet is a PENDING placeholder.

    LookupError when the survey has no run at all.
    """
    runs = survey_runs(survey)
    if not runs:
        raise LookupError(f"no run for survey {survey}")
    tiles: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        tiles.setdefault(run_tile(run), []).append(run)
    have = {run["PK"] for run in runs}
    for started in started_runs(runs):
        if started["run_id"] not in have:
            placeholder = {"PK": started["run_id"], "status": PENDING, "created_at": started["started_at"]}
            tiles.setdefault(started["tile"], []).append(placeholder)
    for tile_list in tiles.values():
        tile_list.sort(key=lambda run: (run.get("created_at", ""), run["PK"]), reverse=True)
    return dict(sorted(tiles.items()))


def tile_row(tile: str, run: dict[str, Any]) -> dict[str, Any]:
    """One tile's line: its newest run's status, chunks, spectra fitted of total and components."""
    row = {
        "tile": tile,
        "run_id": run["PK"],
        "status": run.get("status"),
        "chunks_completed": run.get("jobs_completed", 0),
        "chunks_failed": run.get("jobs_failed", 0),
        "chunks_total": run.get("jobs_total", 0),
        "n_spectra": run.get("n_spectra", 0),
        "created_at": run.get("created_at"),
        "error": run.get("error"),
    }
    if run.get("status") == ph.RUN_COMPLETED:
        return {**row, "spectra_fitted": row["n_spectra"], "n_components": run.get("n_components", 0)}
    if run.get("status") == PENDING:
        return {**row, "spectra_fitted": 0, "n_components": 0}
    summary = ph.summarize(run["PK"])  # still running or failed: what its COMPLETED chunks hold
    return {**row, "spectra_fitted": summary["spectra_fitted"], "n_components": summary["n_components"]}


def survey_status(survey: str) -> dict[str, Any]:
    """The survey's tiles summarised: counts by status of each tile's newest run, spectra fitted of total, one
    row per tile; ``finished`` once no tile is running or pending. LookupError for a survey with no run."""
    rows = [tile_row(tile, runs[0]) for tile, runs in tile_runs(survey).items()]
    statuses = Counter(row["status"] for row in rows)
    return {
        "survey": survey,
        "tiles_total": len(rows),
        "tiles_completed": statuses[ph.RUN_COMPLETED],
        "tiles_failed": statuses[ph.RUN_FAILED],
        "tiles_running": statuses[ph.RUN_RUNNING],
        "tiles_pending": statuses[PENDING],
        "spectra_fitted": sum(row["spectra_fitted"] for row in rows),
        "n_spectra": sum(row["n_spectra"] for row in rows),
        "n_components": sum(row["n_components"] for row in rows),
        "finished": not (statuses[ph.RUN_RUNNING] or statuses[PENDING]),
        "tiles": rows,
    }


def progress_percent(status: dict[str, Any]) -> float:
    """The survey's progress for the UI: tiles finished (completed or failed) of all its tiles, in percent."""
    return 100.0 * (status["tiles_completed"] + status["tiles_failed"]) / max(status["tiles_total"], 1)
