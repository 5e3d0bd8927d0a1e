"""The merged Parquet as a findable table (issue 24 item 5): catalog partitions per date, `open_table`, the CLI
query, the Glue Data Catalog on moto's server, and the seed's per-run reports under logs/lambda and logs/glue."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import boto3
import pyarrow.parquet as pq
import pytest

from deployments.cli import main as cli
from flows.etl import ndjson_ingest, ndjson_merge
from tasks.core import keys
from tasks.core.object_store import ObjectStore
from tasks.etl import catalog, reports
from tasks.etl import keys as etl_keys
from tasks.etl import merge as etl_merge
from tests.helpers.etl import good_lines, write_input

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

DAYS = ("2026-03-01", "2026-03-02")


def _cli_json(capsys, *argv: str):
    assert cli(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _merged_rows(root, day: str) -> list[dict]:
    """The date's Parquet parts read directly, each row with its date (what the table must hold)."""
    parts = sorted((root / etl_keys.merged_output_prefix(day)).glob("*.parquet"))
    return [dict(r, date_prefix=day) for p in parts for r in pq.read_table(p).to_pylist()]


def test_two_merged_dates_are_a_table_with_a_query_and_reports(etl_env, capsys):
    root = etl_env["root"]
    urls = [write_input(root, day, f"f-{i}.ndjson", good_lines(2, i)) for day in DAYS for i in range(5)]
    summary = ndjson_ingest(file_urls=urls, merge_deployment=None)  # 5 files a date: one manifest each, merged inline
    assert len(summary["manifests"]) == 2 and summary["launched"] == 2

    partitions = catalog.registered_partitions()
    assert [p["date_prefix"] for p in partitions] == list(DAYS)
    assert [p["location"] for p in partitions] == [
        (root / etl_keys.merged_output_prefix(d)).as_uri() + "/" for d in DAYS
    ]
    assert partitions[0]["columns"] == [
        "id",
        "name",
        "score",
        "ok",
        "tags",
        "meta",
        "when",
        "none",
        "_processing_timestamp",
        "_source_file",
    ]

    expected = _merged_rows(root, DAYS[0]) + _merged_rows(root, DAYS[1])
    assert len(expected) == 20
    table = catalog.open_table().to_table()
    assert table.column_names == partitions[0]["columns"] + ["date_prefix"]
    assert sorted(table.to_pylist(), key=lambda r: (r["date_prefix"], r["_source_file"], r["id"])) == sorted(
        expected, key=lambda r: (r["date_prefix"], r["_source_file"], r["id"])
    )

    # registering a date again changes nothing
    entry = root / etl_keys.catalog_partition_key("merged_parquet", DAYS[0])
    before = (entry.read_bytes(), entry.stat().st_mtime_ns)
    assert catalog.register_partition(DAYS[0])["changed"] is False
    assert (entry.read_bytes(), entry.stat().st_mtime_ns) == before

    # the CLI: one date's columns, a limit, and SQL over every partition
    rows = _cli_json(capsys, "etl", "rows", "--date", DAYS[1], "--columns", "id,_source_file")
    assert sorted((r["id"], r["_source_file"]) for r in rows) == sorted(
        (r["id"], r["_source_file"]) for r in expected[10:]
    )
    assert len(_cli_json(capsys, "etl", "rows", "--limit", "3")) == 3
    counts = _cli_json(
        capsys, "etl", "rows", "--sql", "select date_prefix, count(*) as n from merged_parquet group by 1 order by 1"
    )
    assert counts == [{"date_prefix": DAYS[0], "n": 10}, {"date_prefix": DAYS[1], "n": 10}]
    assert [p["date_prefix"] for p in _cli_json(capsys, "etl", "partitions")] == list(DAYS)
    assert cli(["etl", "rows", "--columns", "nope"]) == 2 and "no column nope" in capsys.readouterr().err

    # the seed's metadata reports: one per ingest run, one per merge
    (ingest_report,) = [json.loads(p.read_text()) for p in (root / "logs/lambda").iterdir()]
    assert {k: ingest_report[k] for k in ("status", "files", "tracked", "quarantined", "launched")} == {
        "status": "succeeded",
        "files": 10,
        "tracked": 10,
        "quarantined": 0,
        "launched": 2,
    }
    assert len(ingest_report["manifests"]) == 2 and ingest_report["quarantined_files"] == []
    assert ingest_report["duration_seconds"] >= 0 and ingest_report["run_id"]
    merge_reports = sorted(
        (json.loads(p.read_text()) for p in (root / "logs/glue").iterdir()), key=lambda r: r["date_prefix"]
    )
    assert [(r["date_prefix"], r["status"], r["rows"], r["files"], r["files_failed"]) for r in merge_reports] == [
        (d, "completed", 10, 5, 0) for d in DAYS
    ]
    assert [r["parts"] for r in merge_reports] == [
        [p.as_uri() for p in sorted((root / etl_keys.merged_output_prefix(d)).glob("*.parquet"))] for d in DAYS
    ]
    assert all(
        r["manifest_path"].endswith(r["manifest"])
        and r["partition"]["date_prefix"] == r["date_prefix"]
        and r["duration_seconds"] >= 0
        for r in merge_reports
    )
    assert sorted(p.name for p in (root / "logs/glue").iterdir()) == sorted(
        etl_keys.run_report_key("glue", datetime.fromisoformat(r["started_at"]), r["run_id"]).removeprefix("logs/glue/")
        for r in merge_reports
    )


def test_a_failed_merge_leaves_a_failed_report_and_no_partition(etl_env):
    root = etl_env["root"]
    urls = [write_input(root, DAYS[0], f"h-{i}.ndjson", good_lines(1, i)) for i in range(5)]
    (manifest,) = ndjson_ingest(file_urls=urls, merge_deployment="ndjson-merge/not-deployed")["manifests"]
    (root / etl_keys.manifest_key(DAYS[0], manifest)).unlink()  # the manifest JSON is lost: the merge fails
    assert ndjson_merge(date_prefix=DAYS[0], manifest_name=manifest, return_state=True).is_failed()
    (report,) = [json.loads(p.read_text()) for p in (root / "logs/glue").iterdir()]
    assert (report["status"], report["manifest"], report["date_prefix"]) == ("failed", manifest, DAYS[0])
    assert report["error"].startswith(f"{manifest} ({DAYS[0]}): ObjectNotFound")
    assert catalog.registered_partitions() == [] and len(list((root / "logs/lambda").iterdir())) == 1


def test_a_report_that_cannot_be_written_is_logged_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the manifest store should be")
    monkeypatch.setenv("ETL_MANIFEST_STORE_URL", blocked.as_uri())
    assert reports.write_run_report("glue", datetime.now(UTC), {"status": "completed"}) is None
    assert "glue report of run" in caplog.text and "not written" in caplog.text
    with pytest.raises(keys.InvalidKey):
        etl_keys.run_report_key("spark", datetime.now(UTC), "x")


def test_a_merge_on_s3_registers_its_partition_in_glue_once(etl_env, s3_base, s3_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_GLUE", s3_endpoint)
    database = f"db_{uuid.uuid4().hex[:8]}"  # moto's server is shared by the session's tests
    monkeypatch.setenv("ETL_CATALOG_DATABASE", database)
    store = ObjectStore.from_url(s3_base)
    day = DAYS[0]
    urls = [
        store.put_bytes(etl_keys.input_key(day, f"f-{i}.ndjson"), json.dumps({"id": i, "v": "x"}).encode() + b"\n")
        for i in range(3)
    ]
    summary = etl_merge.merge_manifest(day, "batch-0001-20260301-000000.json", urls)
    assert summary["partition"]["glue"] == {
        "database": database,
        "table": "merged_parquet",
        "partition": day,
        "created": True,
    }

    glue = boto3.client("glue", endpoint_url=s3_endpoint)
    (partition,) = glue.get_partitions(DatabaseName=database, TableName="merged_parquet")["Partitions"]
    assert partition["Values"] == [day]
    assert partition["StorageDescriptor"]["Location"] == store.url_for(etl_keys.merged_output_prefix(day))
    assert [c["Name"] for c in partition["StorageDescriptor"]["Columns"]] == [
        "id",
        "v",
        "_processing_timestamp",
        "_source_file",
    ]
    table = glue.get_table(DatabaseName=database, Name="merged_parquet")["Table"]
    assert table["PartitionKeys"] == [{"Name": "date_prefix", "Type": "string"}]
    assert table["StorageDescriptor"]["Location"] == store.url_for(etl_keys.OUTPUT_PREFIX)

    again = catalog.register_partition(day)  # twice: nothing new, in the local catalog or in Glue
    assert (again["changed"], again["glue"]["created"]) == (False, False)
    skipped = etl_merge.merge_manifest(day, "batch-0001-20260301-000000.json", urls)  # published: skipped, registered
    assert skipped["already_published"] is True and skipped["partition"]["glue"]["created"] is False
    assert len(glue.get_partitions(DatabaseName=database, TableName="merged_parquet")["Partitions"]) == 1
    assert sorted(r["id"] for r in catalog.open_table().to_table().to_pylist()) == ["0", "1", "2"]


def test_a_publish_reads_only_its_own_parts_schemas_unless_they_bring_a_new_column(etl_env, monkeypatch):
    """Issue 40 item 3: registering the date after a publish read every part of the date (a cost that grew with each
    manifest of the day); it reads the parts just published, and the whole date only when they add a column."""
    root, day = etl_env["root"], DAYS[0]
    read: list[list[str]] = []
    real = catalog._schema
    monkeypatch.setattr(catalog, "_schema", lambda target, files: read.append(list(files)) or real(target, files))

    def merge(n: int, record: dict) -> dict:
        urls = [write_input(root, day, f"m{n}-{i}.ndjson", [dict(record, id=f"{n}-{i}")]) for i in range(2)]
        read.clear()
        return etl_merge.merge_manifest(day, f"batch-{n:04d}-20260301-000000.json", urls)

    def part(n: int) -> str:
        return etl_keys.merged_part_key(day, f"batch-{n:04d}-20260301-000000.json", 0)

    for n in (1, 2, 3):
        merge(n, {"v": "x"})
    assert read == [[part(3)]]  # the date's two earlier parts not read again
    assert catalog.registered_partitions()[0]["columns"] == ["v", "id", "_processing_timestamp", "_source_file"]
    merge(4, {"v": "x", "late": "y"})  # a new column: the entry rebuilt from every part
    assert read == [[part(4)], [part(n) for n in (1, 2, 3, 4)]]
    assert "late" in catalog.registered_partitions()[0]["columns"]
    assert catalog.register_partition(day)["changed"] is False  # what a whole rebuild makes of it
