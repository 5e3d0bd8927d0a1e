"""ETL test helpers: the small-file settings (``etl_env``), input files, the tracking records and merged rows."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.core import state_store
from tasks.etl import keys

DAY = "2026-01-05"
TODAY = "2026-01-10"
MISSING_DEPLOYMENT = "ndjson-merge/not-deployed"


@pytest.fixture
def etl_env(tables, store_root, monkeypatch):
    """Fresh tables and store; small files are the norm here (1 KiB ± 99%), 5 files per manifest, 4 shards."""
    for name, value in {
        "ETL_EXPECTED_FILE_SIZE_MB": "0.001",
        "ETL_SIZE_TOLERANCE_PERCENT": "99",
        "ETL_MAX_FILES_PER_MANIFEST": "5",
        "ETL_MIN_FILES_FOR_PARTIAL_BATCH": "1",
        "ETL_NUM_STATUS_SHARDS": "4",
        "ETL_TTL_DAYS": "30",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ETL_NOTIFY_BLOCK", raising=False)
    return {"tables": tables, "root": store_root, "table": tables["etl_file_tracking"]}


def write_input(root: Path, date: str, name: str, lines: list) -> str:
    """An input file under pipeline/input/{date}/ (dicts become JSON lines, str lines are written as they are)."""
    path = root / "pipeline" / "input" / date / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((json.dumps(line) if not isinstance(line, str) else line) + "\n" for line in lines))
    return path.as_uri()


def records(table: str) -> dict[tuple[str, str], dict]:
    """Every item of the tracking table, plain, by (date_prefix, file_key)."""
    return {(i["date_prefix"], i["file_key"]): state_store.to_plain(i) for i in state_store.scan_all(table)}


def good_lines(n: int, i: int) -> list[dict]:
    """``n`` valid rows of every JSON type, ids ``i * 100 + k``."""
    return [
        {
            "id": i * 100 + k,
            "name": f"row-{k}",
            "score": k / 2,
            "ok": k % 2 == 0,
            "tags": ["a", k],
            "meta": {"x": k},
            "when": "2026-01-05T10:00:00Z",
            "none": None,
        }
        for k in range(n)
    ]


def merged_rows(root, date: str = DAY) -> list[dict]:
    """Every row of the date's merged Parquet (each part read on its own: columns differ between parts)."""
    out = root / keys.merged_output_prefix(date)
    return [row for part in sorted(out.glob("*.parquet")) for row in pq.read_table(part).to_pylist()]


def manifests(table: str, date: str = DAY) -> dict[str, dict]:
    """The manifest records of ``date``, by file_key."""
    return {k[1]: v for k, v in records(table).items() if k[0] == date and k[1].startswith("MANIFEST#")}


def file_statuses(table: str, date: str = DAY) -> Counter:
    """How many input files of ``date`` are in each status (shard suffix dropped)."""
    return Counter(
        v["status"].split("#")[0] for k, v in records(table).items() if k[0] == date and k[1].endswith(".ndjson")
    )


def lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a surrogate with no pair (not encodable as UTF-8)."""
    try:
        text.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def write_five_inputs(root, prefix: str, lines_per_file: int = 3) -> list[str]:
    """Five input files of ``DAY``, ``lines_per_file`` rows each with ids unique to ``prefix``."""
    return [
        write_input(
            root, DAY, f"{prefix}-{i}.ndjson", [{"id": f"{prefix}{i}-{k}", "v": k} for k in range(lines_per_file)]
        )
        for i in range(5)
    ]


def assert_merged_exactly_once(root, urls: list[str], lines_per_file: int = 3) -> None:
    """Every row of ``urls`` (as ``write_five_inputs`` wrote them) is in the merged output of ``DAY`` once."""
    ids = Counter(r["id"] for r in merged_rows(root))
    assert sum(ids.values()) == len(urls) * lines_per_file and set(ids.values()) == {1}, ids
