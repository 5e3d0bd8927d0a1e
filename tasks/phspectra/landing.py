"""A cube or a survey manifest landing under ``surveys/incoming/`` starts `phspectra-survey` (seed 000's upload).

    surveys/incoming/{survey}/{cube}.fits|.npy  ──> one run of the cube, for the folder's survey
    surveys/incoming/[{survey}/]{name}.json     ──> one run per cube the manifest lists, for the survey it names:
        {"survey": "grs-15", "cubes": ["cubes/a.fits", "s3://bucket/b.fits"], "fit_params": {"beta": 3.0},
         "chunk_size": 500}                      (cubes: keys of the object store, or file:// / s3:// URLs)

One landing (the object's URL and event id) is one ``LANDING#…`` item in ``phspectra-runs``, created before any
run (STARTING), then STARTED with the runs' ids and tiles (a cube's file name without ``.fits``), or REJECTED with
the reason for a manifest that is not valid (it stays where it landed; nothing retries it). A second event for the
same landing starts nothing; a listener that died before STARTED starts the runs again with the same idempotency
keys, which the Prefect server answers with the runs it already created. Each run's ``run_id`` comes from the
landing too, so the RUN items are the landing's own.
"""

from __future__ import annotations

import json
from typing import Any

from tasks.core import keys, state_store
from tasks.core.config import object_store
from tasks.core.errors import RefusedInput
from tasks.core.object_store import ObjectNotFound, open_url
from tasks.core.runtime import now_iso, run_logger, start_deployment_run
from tasks.landing.listener import Outcome
from tasks.landing.pipelines import handle_each
from tasks.landing.sources import Arrival
from tasks.phspectra import keys as phspectra_keys
from tasks.phspectra import survey as ph
from tasks.phspectra.worker import validate_fit_params

PIPELINE = "phspectra"
SURVEY_DEPLOYMENT = "phspectra-survey/local"
STARTING, STARTED, REJECTED = "STARTING", "STARTED", "REJECTED"
MANIFEST_FIELDS = {"survey", "cubes", "fit_params", "chunk_size"}
MAX_CUBES = 1000
MAX_MANIFEST_BYTES = 1024 * 1024


class InvalidManifest(RefusedInput):
    """A survey manifest that cannot start runs; the message says why."""


def cube_url(entry: Any) -> str:
    """A manifest's cube as a URL: ``file://`` / ``s3://`` as given, a plain key in the configured object store."""
    if not isinstance(entry, str) or not entry:
        raise InvalidManifest(f"a cube must be a key or a file:// or s3:// URL, got {entry!r}")
    if "://" in entry:
        if not entry.startswith(("file:///", "s3://")):
            raise InvalidManifest(f"cube {entry!r}: use a key of the object store, or a file:// or s3:// URL")
        return entry
    try:
        return object_store().url_for(keys.safe_key(entry))
    except keys.InvalidKey as error:
        raise InvalidManifest(f"cube {entry!r}: {error}") from None


def parse_manifest(data: bytes, folder_survey: str | None) -> tuple[str, list[str], dict[str, Any]]:
    """(survey, cube URLs, the runs' other parameters) of a manifest; InvalidManifest naming what is wrong."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise InvalidManifest(f"the manifest has {len(data)} bytes; at most {MAX_MANIFEST_BYTES}")
    try:
        manifest = json.loads(data)
    except ValueError as error:
        raise InvalidManifest(f"the manifest is not JSON: {error}") from None
    if not isinstance(manifest, dict):
        raise InvalidManifest(
            f"the manifest must be a JSON object with {sorted(MANIFEST_FIELDS)}, not {type(manifest).__name__}"
        )
    unknown = sorted(set(manifest) - MANIFEST_FIELDS)
    if unknown:
        raise InvalidManifest(f"unknown manifest field(s) {unknown}: use {sorted(MANIFEST_FIELDS)}")
    survey = manifest.get("survey", folder_survey)
    try:
        keys.safe_id(survey, "survey")
    except keys.InvalidKey as error:
        raise InvalidManifest(str(error)) from None
    if folder_survey is not None and survey != folder_survey:
        raise InvalidManifest(f"the manifest names survey {survey!r} but landed in the folder of {folder_survey!r}")
    cubes = manifest.get("cubes")
    if not isinstance(cubes, list) or not cubes or len(cubes) > MAX_CUBES:
        raise InvalidManifest(f"cubes must be a list of 1 to {MAX_CUBES} cubes, got {cubes!r}"[:300])
    urls = [cube_url(entry) for entry in cubes]
    if len(set(urls)) != len(urls):
        raise InvalidManifest("a cube is listed twice")
    tiles = tiles_of(urls)
    if len(set(tiles)) != len(tiles):
        raise InvalidManifest(f"two cubes share a tile name (a cube's file name without .fits): {sorted(tiles)}"[:300])
    params: dict[str, Any] = {}
    try:
        if manifest.get("fit_params"):
            params["fit_params"] = validate_fit_params(manifest["fit_params"])
        if "chunk_size" in manifest:
            params["chunk_size"] = ph.validate_chunk_size(manifest["chunk_size"])
    except (ValueError, TypeError) as error:
        raise InvalidManifest(str(error)) from None
    return survey, urls, params


def tiles_of(urls: list[str]) -> list[str]:
    """The cubes' tile names (``keys.tile_name``); InvalidManifest naming a cube without a usable one."""
    try:
        return [phspectra_keys.tile_name(url) for url in urls]
    except keys.InvalidKey as error:
        raise InvalidManifest(str(error)) from None


def runs_of(arrival: Arrival, landing: phspectra_keys.SurveyLanding) -> tuple[str, list[str], dict[str, Any]]:
    """(survey, cube URLs, other parameters) an arrival asks for: its own cube, or its manifest's list."""
    if not landing.is_manifest:
        tiles_of([arrival.url])
        return landing.survey, [arrival.url], {}
    store, key = open_url(arrival.url)
    try:
        data = store.get_bytes(key)
    except ObjectNotFound:
        raise InvalidManifest("the manifest was deleted before it could be read") from None
    return parse_manifest(data, landing.survey)


def landing_key(arrival: Arrival) -> dict[str, str]:
    """The key of the landing's item in ``phspectra-runs``."""
    return {"PK": phspectra_keys.landing_pk(arrival.url, arrival.event_id), "SK": phspectra_keys.LANDING_SK}


def claim_landing(arrival: Arrival) -> state_store.WriteResult:
    """The landing's item, created STARTING (APPLIED once per landing; EXISTS with the item after that)."""
    item = {
        **landing_key(arrival),
        "status": STARTING,
        "url": arrival.url,
        "event_id": arrival.event_id,
        "landed_at": now_iso(),
    }
    return state_store.create_if_absent(ph.runs_table(), item, ["PK", "SK"])


def object_arrived(arrival: Arrival, deployment: str = SURVEY_DEPLOYMENT) -> tuple[str, list[str]]:
    """Start the runs one landing asks for: (what happened, the flow run ids); one log line when none is started
    (InvalidKey: not a landing key)."""
    log = run_logger(__name__)
    landing = phspectra_keys.parse_survey_landing(arrival.key)
    claim = claim_landing(arrival)
    if not claim.applied and claim.item and claim.item.get("status") == STARTED:
        log.info("%s landed again: its runs %s were started already", arrival.url, claim.item.get("flow_run_ids"))
        return "duplicate", list(claim.item.get("flow_run_ids", []))
    if not claim.applied and claim.item and claim.item.get("status") == REJECTED:
        log.info("%s landed again: rejected already (%s)", arrival.url, claim.item.get("error"))
        return "rejected", []
    try:
        survey, cubes, params = runs_of(arrival, landing)
    except InvalidManifest as error:
        state_store.transition(ph.runs_table(), landing_key(arrival), STARTING, REJECTED, set={"error": str(error)})
        log.error("survey manifest %s rejected, no run started: %s", arrival.url, error)
        return "rejected", []
    pk = landing_key(arrival)["PK"]
    flow_run_ids, run_ids = [], []
    for index, cube in enumerate(cubes):
        run_id = phspectra_keys.landing_run_id(pk, index)
        parameters = {"cube_url": cube, "survey": survey, "run_id": run_id, **params}
        flow_run_ids.append(start_deployment_run(deployment, parameters, f"phspectra-landing:{pk}:{index}"))
        run_ids.append(run_id)
    state_store.transition(
        ph.runs_table(),
        landing_key(arrival),
        STARTING,
        STARTED,
        set={
            "survey": survey,
            "run_ids": run_ids,
            "tiles": tiles_of(cubes),
            "flow_run_ids": flow_run_ids,
            "started_at": now_iso(),
        },
    )
    log.info("%s started %d %s run(s) for survey %s: %s", arrival.url, len(cubes), deployment, survey, run_ids)
    return "started", flow_run_ids


def handle_landings(arrivals: list[Arrival], deployment: str = SURVEY_DEPLOYMENT) -> Outcome:
    """The phspectra listener's handler: each landing starts its runs once; one that cannot be handled now is
    retried."""
    return handle_each(arrivals, PIPELINE, lambda arrival: object_arrived(arrival, deployment))
