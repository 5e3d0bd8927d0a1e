"""Every object key and DynamoDB sort key is built and parsed here; nothing else formats them by hand.

Each identifier that reaches a key (run ids, job ids, survey names, file names, dates) is validated so no
input can write outside its prefix: no ``/``, ``..``, backslash, control characters or empty values.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,127}$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class InvalidKey(ValueError):
    """An identifier or key that could escape its prefix, or does not parse."""


def safe_id(value: str, what: str = "id") -> str:
    """``value`` if it is a single safe path segment (letters, digits, ``._=-``; no ``..``), else InvalidKey."""
    if not isinstance(value, str) or not _ID.match(value) or ".." in value:
        raise InvalidKey(f"invalid {what} {value!r}: use 1-128 letters, digits, '.', '_', '=' or '-', no '/' or '..'")
    return value


def safe_key(key: str) -> str:
    """A relative object key with no empty, '.' or '..' segments and no backslash or control characters."""
    if not isinstance(key, str) or not key or key.startswith("/") or "\\" in key:
        raise InvalidKey(f"invalid object key {key!r}")
    if any(ord(c) < 32 for c in key):
        raise InvalidKey(f"invalid object key {key!r}: control character")
    parts = key.rstrip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidKey(f"invalid object key {key!r}: empty, '.' or '..' segment")
    return key


def safe_date(value: str) -> str:
    """A ``YYYY-MM-DD`` date that parses, else InvalidKey."""
    if not isinstance(value, str) or not _DATE.match(value):
        raise InvalidKey(f"invalid date prefix {value!r}: expected YYYY-MM-DD")
    try:
        date.fromisoformat(value)
    except ValueError as error:
        raise InvalidKey(f"invalid date prefix {value!r}: {error}") from None
    return value


# --------------------------------------------------------------------------- seed 000: phspectra

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
    match = re.fullmatch(r"tile=([^/]+)/" + re.escape(CATALOG_PART), key.removeprefix(prefix)) if key.startswith(prefix) else None
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


# --------------------------------------------------------------------------- seed 001: NDJSON -> Parquet

INPUT_PREFIX = "pipeline/input/"
OUTPUT_PREFIX = "pipeline/output/"
MANIFEST_PREFIX = "MANIFEST#"
LOCK_PREFIX = "LOCK#"
_INPUT = re.compile(r"(?:^|/)pipeline/input/([^/]+)/([^/]+)$")
INPUT_TREE_PREFIX = "tree-"  # file keys of inputs outside the pipeline's own input store: tree-{digest}/{name}
_TREE_FILE_KEY = re.compile(r"^tree-[0-9a-f]{16}/(.+)$")


@dataclass(frozen=True)
class InputFile:
    date_prefix: str
    filename: str
    tree: str = ""  # the input tree holding it: the URL before pipeline/input/ (a bucket, folder or prefix)


def input_tree(url: str) -> str:
    """One spelling per input tree (``s3://bucket/prefix`` or a resolved ``file://`` folder), for comparing trees."""
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        return Path(unquote(parts.path) if parts.scheme else url).resolve().as_uri().rstrip("/")
    return f"{parts.scheme}://{parts.netloc}/{parts.path.strip('/')}".rstrip("/")


def parse_input_path(path: str) -> InputFile:
    """Date prefix, file name and input tree of ``…/pipeline/input/YYYY-MM-DD/name``; InvalidKey if it does not parse."""
    match = _INPUT.search(path)
    if not match:
        raise InvalidKey(f"{path!r} is not under pipeline/input/YYYY-MM-DD/")
    tree = path[:match.start()] or "."
    return InputFile(safe_date(match.group(1)), safe_id(match.group(2), "file name"), input_tree(tree))


def input_file_key(parsed: InputFile, home_tree: str) -> str:
    """A file's tracking ``file_key``: its name in the pipeline's own input tree ``home_tree`` (the seed's key),
    else ``tree-{digest of its tree}/{name}``, so one name under two buckets or prefixes is two records."""
    if parsed.tree == input_tree(home_tree):
        return parsed.filename
    return f"{INPUT_TREE_PREFIX}{hashlib.md5(parsed.tree.encode()).hexdigest()[:16]}/{parsed.filename}"


def safe_file_key(file_key: str) -> str:
    """A file record's ``file_key`` (a safe file name, or ``tree-{digest}/{name}``), else InvalidKey."""
    match = _TREE_FILE_KEY.match(file_key) if isinstance(file_key, str) else None
    safe_id(match.group(1) if match else file_key, "file key")
    return file_key


def input_key(date_prefix: str, filename: str) -> str:
    """``pipeline/input/{date}/{filename}``: where an NDJSON input file lands."""
    return f"{INPUT_PREFIX}{safe_date(date_prefix)}/{safe_id(filename, 'file name')}"


def status_shard(filename: str, num_shards: int) -> int:
    """The seed's deterministic shard: MD5 of the file name mod NUM_STATUS_SHARDS."""
    return int(hashlib.md5(filename.encode()).hexdigest(), 16) % num_shards


def sharded_status(status: str, shard: int) -> str:
    """``{status}#{shard}``: the GSI status value of a file record in that shard."""
    return f"{status}#{shard}"


def split_status(value: str) -> tuple[str, int | None]:
    """``pending#3`` -> ('pending', 3); legacy unsharded ``pending`` -> ('pending', None)."""
    base, _, shard = value.partition("#")
    return base, (int(shard) if shard else None)


def is_meta_record(file_key: str) -> bool:
    """MANIFEST# and LOCK# records share the table with file records; they are filtered in code."""
    return file_key.startswith((MANIFEST_PREFIX, LOCK_PREFIX))


def manifest_name(sequence: int, at: datetime) -> str:
    """``batch-{sequence:04d}-{YYYYMMDD-HHMMSS}.json``: a manifest's file name."""
    return f"batch-{sequence:04d}-{at:%Y%m%d-%H%M%S}.json"


def manifest_key(date_prefix: str, name: str) -> str:
    """``manifests/{date}/batch-NNNN-YYYYMMDD-HHMMSS.json``."""
    return f"manifests/{safe_date(date_prefix)}/{safe_id(name, 'manifest name')}"


def manifest_record_key(name: str) -> str:
    """The MANIFEST meta-record's ``file_key``."""
    return f"{MANIFEST_PREFIX}{safe_id(name, 'manifest name')}"


def manifest_name_from_record_key(file_key: str) -> str:
    """The manifest name in a MANIFEST meta-record's ``file_key``; InvalidKey if it is not one."""
    if not file_key.startswith(MANIFEST_PREFIX):
        raise InvalidKey(f"not a manifest record key: {file_key!r}")
    return file_key[len(MANIFEST_PREFIX):]


def merged_output_prefix(date_prefix: str) -> str:
    """``pipeline/output/merged-parquet-{date}/``."""
    return f"{OUTPUT_PREFIX}merged-parquet-{safe_date(date_prefix)}/"


def merged_part_key(date_prefix: str, manifest: str, part: int) -> str:
    """Deterministic per manifest, so re-running a manifest overwrites instead of duplicating."""
    stem = safe_id(manifest, "manifest name").removesuffix(".json")
    return f"{merged_output_prefix(date_prefix)}{stem}-part-{part:05d}.parquet"


def rejects_key(date_prefix: str, manifest: str) -> str:
    """``pipeline/output/rejects/{date}/{manifest stem}.ndjson``: the rows a manifest's merge rejected."""
    stem = safe_id(manifest, "manifest name").removesuffix(".json")
    return f"{OUTPUT_PREFIX}rejects/{safe_date(date_prefix)}/{stem}.ndjson"


def quarantine_key(date_prefix: str, file_key: str) -> str:
    """``quarantine/{date}/{file_key}``: where a refused input file is copied."""
    return f"quarantine/{safe_date(date_prefix)}/{safe_file_key(file_key)}"


def quarantine_reason_key(quarantined_key: str) -> str:
    """``{quarantine key}.reason.json``: why the file at that quarantine key was refused."""
    if not quarantined_key.startswith("quarantine/"):
        raise InvalidKey(f"not a quarantine key: {quarantined_key!r}")
    return quarantined_key + ".reason.json"


MANIFEST_SEQUENCE_KEY = f"{LOCK_PREFIX}manifest-sequence"  # per-date counter behind batch-NNNN (a meta-record)
UNDATED_PREFIX = "UNDATED"  # date_prefix of tracking records for inputs whose path does not parse
CLAIM_PLACEHOLDER_PREFIX = "claiming:"  # manifest_path of files claimed before their manifest exists


def undated_file_key(url: str) -> str:
    """A tracking/quarantine name for an input whose path does not parse: digest of the URL + its safe tail."""
    digest = hashlib.md5(url.encode()).hexdigest()[:16]
    tail = re.sub(r"[^A-Za-z0-9._=-]", "_", url.rsplit("/", 1)[-1]).strip("._")[:80] or "file"
    return safe_id(f"{digest}-{tail}", "file name")


def undated_quarantine_key(url: str) -> str:
    """``quarantine/undated/{digest}-{name}``: where an input with an unparseable path is copied."""
    return f"quarantine/undated/{undated_file_key(url)}"


def claim_placeholder(token: str) -> str:
    """The placeholder ``manifest_path`` of a claim in progress (claim-first: files before manifest)."""
    return f"{CLAIM_PLACEHOLDER_PREFIX}{safe_id(token, 'claim token')}"


def merged_part_prefix(date_prefix: str, manifest: str) -> str:
    """Every part of one manifest's output starts with this (for removing parts a re-run no longer writes)."""
    return merged_part_key(date_prefix, manifest, 0).rsplit("-part-", 1)[0] + "-part-"


# --------------------------------------------------------------------------- seed 002: GPU jobs

GPU_JOB_ID_MAX = 96  # room for the task-id suffix inside safe_id's 128 characters


def gpu_job_id(value: str) -> str:
    """A job id: a safe id of at most 96 characters (task ids are built from it)."""
    safe_id(value, "job_id")
    if len(value) > GPU_JOB_ID_MAX:
        raise InvalidKey(f"invalid job_id {value!r}: at most {GPU_JOB_ID_MAX} characters")
    return value


def gpu_job_id_for_run(flow_run_id: str) -> str:
    """``job-{flow_run_id}``: the job id of a flow run that was given none."""
    return gpu_job_id(f"job-{flow_run_id}")


def gpu_node_name(value: str) -> str:
    """A node name, if it is a safe id (else InvalidKey)."""
    return safe_id(value, "node_name")


def gpu_local_node_name(index: int) -> str:
    """``local-{index}``: the local backend's node slots."""
    if not isinstance(index, int) or index < 0:
        raise InvalidKey(f"invalid local node index {index!r}")
    return f"local-{index}"


def gpu_local_task_id(job_id: str, retry: int, node_index: int) -> str:
    """``{job_id}-r{retry}-n{node_index}``: a local task's id, one per job attempt and node."""
    return safe_id(f"{gpu_job_id(job_id)}-r{int(retry)}-n{int(node_index)}", "ecs_task_id")


def gpu_task_id(value: str) -> str:
    """A task id, if it is a safe id (else InvalidKey)."""
    return safe_id(value, "ecs_task_id")


# --------------------------------------------------------------------------- seed 003: video

VIDEO_INPUT_PREFIX = "input/"  # every job's upload lands under it
_SEGMENT = re.compile(r"^segments/([^/]+)/(\d{5})_(\d{5})_([A-Za-z0-9-]+)\.mp4$")


@dataclass(frozen=True)
class SegmentKey:
    job_id: str
    segment_index: int
    total_segments: int
    mode: str


def source_key(job_id: str) -> str:
    """``input/{job_id}/source.mp4``."""
    return f"{VIDEO_INPUT_PREFIX}{safe_id(job_id, 'job_id')}/source.mp4"


def parse_source_key(key: str) -> str:
    """The job id of an upload key ``input/{job_id}/source.mp4``; InvalidKey if it is not one."""
    match = re.fullmatch(r"input/([^/]+)/source\.mp4", key)
    if not match:
        raise InvalidKey(f"not a video upload key (input/{{job_id}}/source.mp4): {key!r}")
    return safe_id(match.group(1), "job_id")


def segment_key(job_id: str, segment_index: int, total_segments: int, mode: str) -> str:
    """``segments/{job_id}/{segment_index:05d}_{total_segments:05d}_{mode}.mp4``."""
    if not re.fullmatch(r"[A-Za-z0-9-]+", mode):
        raise InvalidKey(f"invalid mode {mode!r}")
    if not 0 <= segment_index < total_segments <= 99999:
        raise InvalidKey(f"segment {segment_index} of {total_segments} is out of range")
    return f"segments/{safe_id(job_id, 'job_id')}/{segment_index:05d}_{total_segments:05d}_{mode}.mp4"


def parse_segment_key(key: str) -> SegmentKey:
    """Job id, index, total and mode of a ``segments/…`` key; InvalidKey if it is not one."""
    match = _SEGMENT.match(key)
    if not match:
        raise InvalidKey(f"not a segment key: {key!r}")
    job_id, index, total, mode = match.groups()
    return SegmentKey(safe_id(job_id, "job_id"), int(index), int(total), mode)


def segments_prefix(job_id: str) -> str:
    """``segments/{job_id}/``: every source segment of a job."""
    return f"segments/{safe_id(job_id, 'job_id')}/"


def job_output_prefix(job_id: str) -> str:
    """``jobs/{job_id}/``: every output object of a job."""
    return f"jobs/{safe_id(job_id, 'job_id')}/"


def output_segment_key(job_id: str, segment_index: int, total_segments: int, mode: str) -> str:
    """``jobs/{job_id}/segments/{index:05d}_{total:05d}_{mode}.mp4``: the inference output of one segment."""
    name = segment_key(job_id, segment_index, total_segments, mode).rsplit("/", 1)[1]
    return f"{job_output_prefix(job_id)}segments/{name}"


def detections_key(job_id: str, segment_index: int, total_segments: int, mode: str) -> str:
    """``jobs/{job_id}/detections/{index:05d}_{total:05d}_{mode}.json``: what a model backend found in one segment."""
    name = segment_key(job_id, segment_index, total_segments, mode).rsplit("/", 1)[1]
    return f"{job_output_prefix(job_id)}detections/{name.removesuffix('.mp4')}.json"


def final_key(job_id: str) -> str:
    """``jobs/{job_id}/final.mp4``."""
    return f"{job_output_prefix(job_id)}final.mp4"




def input_prefix(job_id: str) -> str:
    """``input/{job_id}/``: a job's uploaded inputs."""
    return f"{VIDEO_INPUT_PREFIX}{safe_id(job_id, 'job_id')}/"


# --------------------------------------------------------------------------- seed 004: dead-letter archive

DEAD_LETTER_PREFIX = "dead-letter-archive/"


RECORDS_INCOMING_PREFIX = "records/incoming/"  # the local stand-in for the workflow-message queue
RECORDS_PROCESSED_PREFIX = "records/processed/"


def records_processed_key(day: str, incoming_key: str) -> str:
    """``records/processed/{date}/{path under records/incoming/}``: a message file once its messages are written."""
    rest = safe_key(incoming_key).removeprefix(RECORDS_INCOMING_PREFIX)
    if rest == incoming_key:
        raise InvalidKey(f"not under {RECORDS_INCOMING_PREFIX}: {incoming_key!r}")
    return f"{RECORDS_PROCESSED_PREFIX}{safe_date(day)}/{rest}"


def dead_letter_key(day: str, message_id: str) -> str:
    """``dead-letter-archive/{date}/{message_id}.json``."""
    return f"{DEAD_LETTER_PREFIX}{safe_date(day)}/{safe_id(message_id, 'message id')}.json"


def dead_letter_failed_key(day: str, message_id: str) -> str:
    """``dead-letter-archive/failed/{date}/{message_id}.json``: failed again on replay."""
    return f"{DEAD_LETTER_PREFIX}failed/{safe_date(day)}/{safe_id(message_id, 'message id')}.json"


def dead_letter_prefix(day: str, failed: bool = False) -> str:
    """``dead-letter-archive/{date}/`` (or ``dead-letter-archive/failed/{date}/``)."""
    return f"{DEAD_LETTER_PREFIX}{'failed/' if failed else ''}{safe_date(day)}/"


def dead_letter_id(key: str) -> str:
    """The message id of an archive key (``…/{date}/{message_id}.json``); InvalidKey if it is not one."""
    match = re.fullmatch(r"dead-letter-archive/(?:failed/)?(\d{4}-\d{2}-\d{2})/([^/]+)\.json", key)
    if not match:
        raise InvalidKey(f"not a dead-letter archive key: {key!r}")
    safe_date(match.group(1))
    return safe_id(match.group(2), "message id")



def _manifest_stem(manifest: str) -> str:
    return safe_id(manifest, "manifest name").removesuffix(".json")


def merged_staging_prefix(date_prefix: str, manifest: str, token: str) -> str:
    """``pipeline/output/_staging/{date}/{manifest stem}/{token}/``: one merge run's parts before they are published."""
    return f"{MERGED_STAGING_PREFIX}{safe_date(date_prefix)}/{_manifest_stem(manifest)}/{safe_id(token, 'staging token')}/"


MERGED_STAGING_PREFIX = f"{OUTPUT_PREFIX}_staging/"


def merged_published_key(date_prefix: str, manifest: str) -> str:
    """``pipeline/output/_published/{date}/{manifest stem}.json``: written last when a manifest's parts are published."""
    return f"{OUTPUT_PREFIX}_published/{safe_date(date_prefix)}/{_manifest_stem(manifest)}.json"


CATALOG_PREFIX = "pipeline/catalog/"
RUN_REPORT_KINDS = ("lambda", "glue")  # the seed's report folders: ingest (manifest builder) and merge (Glue job)


def catalog_table_prefix(table: str) -> str:
    """``pipeline/catalog/{table}/``: one object per registered partition of a table."""
    return f"{CATALOG_PREFIX}{safe_id(table, 'table name')}/"


def catalog_partition_key(table: str, date_prefix: str) -> str:
    """``pipeline/catalog/{table}/date_prefix={date}.json``: a date's partition entry (one per date, so merges of
    different dates never rewrite each other's)."""
    return f"{catalog_table_prefix(table)}date_prefix={safe_date(date_prefix)}.json"


def catalog_partition_date(key: str) -> str:
    """The date of a ``…/date_prefix={date}.json`` catalog key; InvalidKey if it is not one."""
    match = re.fullmatch(r"pipeline/catalog/[^/]+/date_prefix=([^/]+)\.json", key)
    if not match:
        raise InvalidKey(f"not a catalog partition key: {key!r}")
    return safe_date(match.group(1))


def run_report_key(kind: str, at: datetime, run_id: str) -> str:
    """``logs/{lambda|glue}/{YYYY-MM-DD}-T{HHMMSS}-{run_id}.json``: the seed's per-run metadata report."""
    if kind not in RUN_REPORT_KINDS:
        raise InvalidKey(f"invalid report kind {kind!r}: one of {RUN_REPORT_KINDS}")
    return f"logs/{kind}/{at:%Y-%m-%d}-T{at:%H%M%S}-{safe_id(run_id, 'run id')}.json"
