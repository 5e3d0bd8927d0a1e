"""Seed 000's keys: the runs table's sort keys, chunk results, decompositions, the survey catalog and landings.

Every key of this pipeline is built and parsed here; nothing else formats them by hand. Identifiers are
validated by the shared validators of ``tasks.core.keys`` so no input can write outside its prefix.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from tasks.core.keys import InvalidKey, safe_id, safe_key

RUN_SK = "RUN"
CHUNK_SK_PREFIX = "CHUNK#"


def chunk_name(start: int) -> str:
    """``chunk-{start:07d}``: a chunk's name in sort keys and object keys."""
    return f"chunk-{start:07d}"


def chunk_sk(start: int) -> str:
    """``CHUNK#chunk-{start:07d}``: the chunk item's sort key."""
    return f"{CHUNK_SK_PREFIX}{chunk_name(start)}"


def chunk_start_from_sk(sk: str) -> int:
    """The start index in a ``CHUNK#chunk-NNNNNNN`` sort key (8+ digits past 10 million); InvalidKey if not one.

    Keys sort as strings, so past 10 million their order is not the chunks' order: sort by this number.
    """
    match = re.fullmatch(r"CHUNK#chunk-(\d{7}|[1-9]\d{7,})", sk)
    if not match:
        raise InvalidKey(f"not a chunk sort key: {sk!r}")
    return int(match.group(1))


def chunk_npz_key(run_id: str, start: int) -> str:
    """``chunks/{run_id}/chunk-{start:07d}.npz``: a chunk's spectra."""
    return f"chunks/{safe_id(run_id, 'run_id')}/{chunk_name(start)}.npz"


def decomposition_prefix(survey: str, run_id: str | None = None) -> str:
    """``decompositions/survey={survey}/`` (and ``run_id={run_id}/``): runs never overwrite each other."""
    prefix = f"decompositions/survey={safe_id(survey, 'survey')}/"
    return prefix if run_id is None else f"{prefix}run_id={safe_id(run_id, 'run_id')}/"


def decomposition_key(survey: str, run_id: str, start: int) -> str:
    """``decompositions/survey={survey}/run_id={run_id}/chunk-{start:07d}.parquet``: a chunk's components."""
    return f"{decomposition_prefix(survey, run_id)}{chunk_name(start)}.parquet"


_CUBE_SUFFIXES = (".fits.gz", ".fits", ".fit", ".npy")
CATALOG_PART = "part-0.parquet"  # a tile's one file in the survey catalog, replaced whole by a rebuild


def safe_tile(value: str) -> str:
    """A tile name: a safe id without ``=`` (it is a hive partition value, ``tile={tile}/``), else InvalidKey."""
    safe_id(value, "tile")
    if "=" in value:
        raise InvalidKey(f"invalid tile {value!r}: no '=' (it names a tile={{tile}}/ partition)")
    return value


def tile_name(cube_url: str) -> str:
    """A cube's tile: its file name without the cube suffix (``…/grs-15-l18.fits`` -> ``grs-15-l18``); InvalidKey
    when that is not a safe tile name."""
    name = unquote(urlsplit(cube_url).path).rsplit("/", 1)[-1]
    stem = next((name[: -len(s)] for s in _CUBE_SUFFIXES if name.lower().endswith(s)), name)
    try:
        return safe_tile(stem)
    except InvalidKey as error:
        raise InvalidKey(f"cube {cube_url!r} has no usable tile name: {error}") from None


def survey_catalog_prefix(survey: str) -> str:
    """``catalogs/survey={survey}/``: the survey's combined catalog, one ``tile={tile}/`` partition per tile."""
    return f"catalogs/survey={safe_id(survey, 'survey')}/"


def survey_catalog_key(survey: str, tile: str) -> str:
    """``catalogs/survey={survey}/tile={tile}/part-0.parquet``: every component of one tile."""
    return f"{survey_catalog_prefix(survey)}tile={safe_tile(tile)}/{CATALOG_PART}"


def survey_catalog_tile(survey: str, key: str) -> str:
    """The tile of a ``survey_catalog_key``; InvalidKey if ``key`` is not one."""
    prefix = survey_catalog_prefix(survey)
    match = (
        re.fullmatch(r"tile=([^/]+)/" + re.escape(CATALOG_PART), key.removeprefix(prefix))
        if key.startswith(prefix)
        else None
    )
    if not match:
        raise InvalidKey(f"not a catalog partition of survey {survey!r}: {key!r}")
    return safe_tile(match.group(1))


SURVEY_INCOMING_PREFIX = "surveys/incoming/"  # where a cube or a survey manifest lands to start a run
LANDING_PK_PREFIX = "LANDING#"
LANDING_SK = "LANDING"


@dataclass(frozen=True)
class SurveyLanding:
    survey: str | None  # the folder's survey (``surveys/incoming/{survey}/…``); None for a file right under the prefix
    name: str
    is_manifest: bool  # ``*.json``: a manifest listing cubes; otherwise the object is a cube


def parse_survey_landing(key: str) -> SurveyLanding:
    """A key under ``surveys/incoming/``: ``{survey}/{cube}.fits|.npy``, ``{survey}/{name}.json`` or ``{name}.json``."""
    rest = safe_key(key).removeprefix(SURVEY_INCOMING_PREFIX)
    if rest == key:
        raise InvalidKey(f"not under {SURVEY_INCOMING_PREFIX}: {key!r}")
    parts = rest.split("/")
    if len(parts) > 2:
        raise InvalidKey(f"too deep under {SURVEY_INCOMING_PREFIX}: {key!r} (use {{survey}}/{{file}})")
    name = parts[-1]
    is_manifest = name.lower().endswith(".json")
    if not is_manifest and not name.lower().endswith((".fits", ".fit", ".fits.gz", ".npy")):
        raise InvalidKey(f"not a cube (.fits, .npy) or a manifest (.json): {key!r}")
    survey = safe_id(parts[0], "survey") if len(parts) == 2 else None
    if survey is None and not is_manifest:
        raise InvalidKey(f"a cube must land in its survey's folder, {SURVEY_INCOMING_PREFIX}{{survey}}/: {key!r}")
    return SurveyLanding(survey, name, is_manifest)


def landing_pk(url: str, event_id: str) -> str:
    """``LANDING#{sha256(url, event_id)[:32]}``: the item that makes one landing of an object start its runs once."""
    digest = hashlib.sha256(f"{url}\n{event_id}".encode()).hexdigest()[:32]
    return f"{LANDING_PK_PREFIX}{digest}"


def landing_run_id(pk: str, index: int) -> str:
    """``{landing digest}-{index:04d}``: the run id of the landing's ``index``-th cube."""
    match = re.fullmatch(re.escape(LANDING_PK_PREFIX) + r"([0-9a-f]{32})", pk)
    if not match or not 0 <= index <= 9999:
        raise InvalidKey(f"no run id for landing {pk!r} and cube {index!r}")
    return f"{match.group(1)}-{index:04d}"


def landing_pk_of_run(run_id: str) -> str | None:
    """The ``LANDING#…`` key of the landing that started ``run_id``; None for a run started otherwise."""
    match = re.fullmatch(r"([0-9a-f]{32})-\d{4}", run_id)
    return f"{LANDING_PK_PREFIX}{match.group(1)}" if match else None
