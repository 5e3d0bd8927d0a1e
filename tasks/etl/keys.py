"""Seed 001's keys: input files, tracking records, manifests, merged output, the catalog and run reports.

Every key of this pipeline is built and parsed here; nothing else formats them by hand. Identifiers are
validated by the shared validators of ``tasks.core.keys`` so no input can write outside its prefix.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tasks.core.keys import InvalidKey, safe_date, safe_id

INPUT_PREFIX = "pipeline/input/"
OUTPUT_PREFIX = "pipeline/output/"
MANIFEST_PREFIX = "MANIFEST#"
LOCK_PREFIX = "LOCK#"
CATALOG_RECORD_PREFIX = "CATALOG#"  # a date whose catalog registration failed: CATALOG#{table} (tasks.etl.catalog)
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
    """Date prefix, file name and input tree of ``…/pipeline/input/YYYY-MM-DD/name``; InvalidKey if unparsable."""
    match = _INPUT.search(path)
    if not match:
        raise InvalidKey(f"{path!r} is not under pipeline/input/YYYY-MM-DD/")
    tree = path[: match.start()] or "."
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
    """MANIFEST#, LOCK# and CATALOG# records share the table with file records; they are filtered in code."""
    return file_key.startswith((MANIFEST_PREFIX, LOCK_PREFIX, CATALOG_RECORD_PREFIX))


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
    return file_key[len(MANIFEST_PREFIX) :]


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


def _manifest_stem(manifest: str) -> str:
    return safe_id(manifest, "manifest name").removesuffix(".json")


def merged_staging_prefix(date_prefix: str, manifest: str, token: str) -> str:
    """``pipeline/output/_staging/{date}/{manifest stem}/{token}/``: one merge run's parts before they are published."""
    return (
        f"{MERGED_STAGING_PREFIX}{safe_date(date_prefix)}/{_manifest_stem(manifest)}/{safe_id(token, 'staging token')}/"
    )


MERGED_STAGING_PREFIX = f"{OUTPUT_PREFIX}_staging/"


def merged_published_key(date_prefix: str, manifest: str) -> str:
    """``pipeline/output/_published/{date}/{manifest stem}.json``: written last, once a manifest's parts are out."""
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


def catalog_record_key(table: str) -> str:
    """The ``file_key`` of a date's record of a failed registration in catalog table ``table``."""
    return f"{CATALOG_RECORD_PREFIX}{safe_id(table, 'table name')}"


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
