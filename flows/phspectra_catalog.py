"""PHSpectra survey level (seed 000's 22-tile run as one survey): progress over its tiles, and its combined catalog.

    every tile's run aggregates ─> survey status (phspectra-runs) ─> progress / table / markdown artifacts keyed by
    survey
                                   └ every tile finished ─> catalog: catalogs/survey=…/tile=…/part-0.parquet

`phspectra-survey-catalog` does the same on demand: the status artifacts, then the catalog rebuilt (only tiles whose
newest completed run changed are rewritten; ``force`` rewrites all).
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.policies import pipeline_flow
from tasks.core.runtime import artifact_key, run_logger
from tasks.phspectra import catalog, survey_status

survey_status_task = task(survey_status.survey_status, name="survey-status", cache_policy=NO_CACHE)
build_catalog_task = task(catalog.build_catalog, name="build-survey-catalog", cache_policy=NO_CACHE)


def publish_survey(status: dict[str, Any], built: dict[str, Any] | None = None) -> None:
    """The survey's progress (tiles finished), its tile table and a markdown summary as artifacts keyed by survey."""
    survey = status["survey"]
    create_progress_artifact(
        survey_status.progress_percent(status),
        key=artifact_key("phspectra-survey-progress", survey),
        description=f"Tiles of survey {survey} finished",
    )
    create_table_artifact(
        key=artifact_key("phspectra-survey-tiles", survey),
        table=status["tiles"],
        description=f"Tiles of survey {survey}, each its newest run",
    )
    finished = status["tiles_completed"] + status["tiles_failed"]
    markdown = (
        f"# PHSpectra survey `{survey}`: {finished} / {status['tiles_total']} tiles finished\n\n"
        "| tiles completed | failed | running | pending | spectra fitted / total | components "
        "|\n|---|---|---|---|---|---|\n"
        f"| {status['tiles_completed']} | {status['tiles_failed']} | {status['tiles_running']} | "
        f"{status['tiles_pending']} | "
        f"{status['spectra_fitted']} / {status['n_spectra']} | {status['n_components']} |\n"
    )
    if built:
        markdown += (
            f"\nCatalog `{built['catalog_url']}`: {len(built['written'])} tile(s) written, "
            f"{len(built['unchanged'])} unchanged"
            + (f", no completed run for {', '.join(built['missing'])}" if built["missing"] else "")
            + "\n"
        )
    create_markdown_artifact(
        key=artifact_key("phspectra-survey", survey),
        markdown=markdown,
        description=f"Survey {survey}: tiles and catalog",
    )


def survey_progress(survey: str, catalog_url: str | None = None) -> dict[str, Any] | None:
    """After a tile's run aggregates: the survey's artifacts, and its catalog once every tile has finished.

    Never fails the tile's run (its records are final already): an error is logged with the command that redoes it.
    """
    try:
        status = survey_status_task(survey)
        built = build_catalog_task(survey, catalog_url) if status["finished"] else None
        publish_survey(status, built)
        return {**status, "catalog": built}
    except Exception as error:  # noqa: BLE001 - the survey view is redone by phspectra-survey-catalog
        run_logger(__name__).warning(
            "survey %s: progress or catalog not updated (%s: %s); run `prefect deployment run "
            "'phspectra-survey-catalog/local' --param survey=%s`",
            survey,
            type(error).__name__,
            error,
            survey,
        )
        return None


@pipeline_flow("phspectra-survey-catalog")
def phspectra_survey_catalog(survey: str, catalog_url: str | None = None, force: bool = False) -> dict[str, Any]:
    """A survey's progress artifacts, then its catalog (re)built from each tile's newest completed run.

    Unchanged tiles are not rewritten unless ``force``; ``catalog_url``: another store than the configured one.
    """
    status = survey_status_task(survey)
    built = build_catalog_task(survey, catalog_url, force)
    publish_survey(status, built)
    return {**{k: v for k, v in status.items() if k != "tiles"}, "catalog": built}
