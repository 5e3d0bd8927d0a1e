"""ETL width limits and the catalog's failures (issue 50, item 5): a file of too many keys, or of a key no column can
be named, fails alone with its reason while its neighbours merge; a batch whose columns would pass the per-manifest
limit does not stall; a catalog registration that fails is an alarm until a retry registers the date."""

from __future__ import annotations

import json
import socket
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import boto3
import pytest

from blocks.health import HealthThresholds
from flows.etl import ndjson_flush_orphans, ndjson_ingest
from tasks.core.object_store import ObjectStore
from tasks.etl import alarms
from tasks.etl import keys as etl_keys
from tasks.etl import merge as etl_merge
from tasks.etl import ops as etl_ops
from tests.helpers.etl import DAY, TODAY, file_statuses, merged_rows, records, write_input

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


@pytest.fixture
def wide_env(etl_env, monkeypatch):
    """Ten files a manifest, and sizes from about 100 bytes to 2 MB (the hostile files pass the size check)."""
    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", "10")
    monkeypatch.setenv("ETL_EXPECTED_FILE_SIZE_MB", "1")
    monkeypatch.setenv("ETL_SIZE_TOLERANCE_PERCENT", "99.99")
    return etl_env


def _neighbours(root: Path, count: int, rows: int = 3) -> list[str]:
    return [
        write_input(root, DAY, f"n-{i}.ndjson", [{"id": f"n{i}-{k}", "v": "x" * 40} for k in range(rows)])
        for i in range(count)
    ]


def _file_records(table: str) -> dict[str, dict]:
    return {k[1]: v for k, v in records(table).items() if k[0] == DAY and k[1].endswith(".ndjson")}


def test_a_file_of_24000_keys_fails_fast_with_its_reason_while_its_nine_neighbours_merge(wide_env):
    root, table = wide_env["root"], wide_env["table"]
    urls = _neighbours(root, 9)
    wide = write_input(root, DAY, "wide.ndjson", [{f"k{i:05d}": i} for i in range(24_000)])
    assert 300_000 < Path(urlparse(wide).path).stat().st_size < 500_000

    started = time.monotonic()
    summary = ndjson_ingest(file_urls=[*urls, wide], merge_deployment=None)
    took = time.monotonic() - started
    print(f"ingest + merge of the batch with the 24,000-key file: {took:.1f} s")

    assert len(summary["manifests"]) == 1 and summary["launched"] == 1
    assert file_statuses(table) == {"completed": 9, "failed": 1}
    refused = _file_records(table)["wide.ndjson"]
    assert "24000 distinct top-level keys, more than max_columns_per_file (1000)" in refused["error_message"]
    assert Path(urlparse(wide).path).exists()  # its input is kept for a fix and `etl reprocess`
    assert sorted(r["id"] for r in merged_rows(root)) == sorted(f"n{i}-{k}" for i in range(9) for k in range(3))
    assert took < 30, took  # seconds, not minutes: the wide file costs its one key pass, no table is built


PAD = {"id": "pad", "v": "x" * 200}  # a first line that merges: the file is over the size floor, the key on line 2
BAD_KEYS = {
    "a-1mb-key.ndjson": ("k" * (1 << 20), "is 1048576 bytes, longer than max_key_bytes (255)"),
    "an-empty-key.ndjson": ("", "an empty key (Glue refuses empty column names)"),
    "a-nul-key.ndjson": ("\u0000", "holds U+0000, a control character"),
    "a-tab-key.ndjson": ("tab\there", "holds U+0009, a control character"),
    "a-glue-refused-key.ndjson": ("name\uffff", "holds U+FFFF, a noncharacter"),
    "case-twins.ndjson": ("ID", "keys 'id' and 'ID' differ only by case"),
}


def test_keys_no_column_can_be_named_fail_their_files_alone_with_the_reason_and_lose_nothing(wide_env):
    root, table = wide_env["root"], wide_env["table"]
    urls = _neighbours(root, 10 - len(BAD_KEYS))
    bad = {name: write_input(root, DAY, name, [PAD, {"id": "bad", key: 1}]) for name, (key, _) in BAD_KEYS.items()}
    summary = ndjson_ingest(file_urls=[*urls, *bad.values()], merge_deployment=None)

    assert len(summary["manifests"]) == 1
    assert file_statuses(table) == {"completed": len(urls), "failed": len(BAD_KEYS)}
    found = _file_records(table)
    for name, (_, reason) in BAD_KEYS.items():
        assert found[name]["status"].startswith("failed"), name
        assert reason in found[name]["error_message"], (name, found[name]["error_message"])
        assert Path(urlparse(bad[name]).path).exists(), name  # kept where the ETL keeps failed input
    assert "(line 2)" in found["an-empty-key.ndjson"]["error_message"]
    rows = merged_rows(root)
    assert {r["id"] for r in rows} == {f"n{i}-{k}" for i in range(len(urls)) for k in range(3)}  # none of theirs
    assert not any("" in r or "\u0000" in r for r in rows)


def test_a_batch_whose_columns_pass_the_manifest_limit_merges_what_fits_and_the_rest_after_reprocess(
    wide_env, monkeypatch
):
    """Ten files of 40 keys each (400 columns together) against 100 a manifest: each merge takes the files that fit,
    in order, and fails the others with the reason; `etl reprocess` and the flush merge them, each line once."""
    monkeypatch.setenv("ETL_MAX_COLUMNS_PER_FILE", "50")
    monkeypatch.setenv("ETL_MAX_COLUMNS_PER_MANIFEST", "100")
    root, table = wide_env["root"], wide_env["table"]
    urls = [
        write_input(root, DAY, f"w-{f}.ndjson", [{"id": f"w{f}-0", **{f"c{f}_{c}": c for c in range(39)}}])
        for f in range(10)
    ]
    ndjson_ingest(file_urls=urls, merge_deployment=None)
    assert file_statuses(table) == {"completed": 2, "failed": 8}  # id + 2 × 39 = 79 columns; a third passes 100
    found = _file_records(table)
    assert (
        "would widen its merged part to 118 columns, more than max_columns_per_manifest (100)"
        in (found["w-2.ndjson"]["error_message"])
    )
    for _ in range(4):  # each round merges two more: no batch stalls, every file ends merged
        assert etl_ops.reprocess_failed(DAY)["moved"] > 0
        ndjson_flush_orphans(today=TODAY, merge_deployment=None)
    assert file_statuses(table) == {"completed": 10}
    assert sorted(r["id"] for r in merged_rows(root)) == sorted(f"w{f}-0" for f in range(10))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_failed_catalog_registration_raises_the_alarm_until_the_flush_registers_the_date(
    etl_env, s3_base, s3_endpoint, monkeypatch
):
    database = f"db_{uuid.uuid4().hex[:8]}"  # moto's server is shared by the session's tests
    monkeypatch.setenv("ETL_CATALOG_DATABASE", database)
    monkeypatch.setenv("AWS_ENDPOINT_URL_GLUE", f"http://127.0.0.1:{_closed_port()}")  # Glue unreachable
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    store = ObjectStore.from_url(s3_base)
    urls = [
        store.put_bytes(etl_keys.input_key(DAY, f"f-{i}.ndjson"), json.dumps({"id": i}).encode() + b"\n")
        for i in range(3)
    ]
    summary = etl_merge.merge_manifest(DAY, "batch-0001-20260105-000000.json", urls)
    assert "error" in summary["partition"] and summary["rows"] == 3  # published all the same

    alarm = alarms.etl_catalog_unregistered(HealthThresholds())
    assert alarm.firing and alarm.value == 1 and alarm.severity == "CRITICAL"
    assert DAY in alarm.detail and "Could not connect" in alarm.detail, alarm.detail

    monkeypatch.setenv("AWS_ENDPOINT_URL_GLUE", s3_endpoint)  # Glue back
    flushed = ndjson_flush_orphans(today=TODAY, merge_deployment=None)
    assert flushed["catalog_registered"] == [DAY] and flushed["catalog_still_failing"] == {}
    assert not alarms.etl_catalog_unregistered(HealthThresholds()).firing
    glue = boto3.client("glue", endpoint_url=s3_endpoint)
    (partition,) = glue.get_partitions(DatabaseName=database, TableName="merged_parquet")["Partitions"]
    assert partition["Values"] == [DAY]
