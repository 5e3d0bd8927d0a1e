"""NDJSON→Parquet ETL (seed 001): ingest, claim-first batching, Dask/pyarrow merge, status updates, flush, ops."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blocks import load_config
from blocks.etl import EtlSettings
from flows.etl import ndjson_flush_orphans, ndjson_ingest, ndjson_merge
from tasks.core import keys, state_store
from tasks.etl import ingest as etl
from tasks.etl import keys as etl_keys
from tasks.etl import ops as etl_ops
from tests.helpers.etl import DAY, MISSING_DEPLOYMENT, TODAY, good_lines, records, write_input

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


def test_settings_use_the_seed_names_and_env_overrides(monkeypatch):
    for name in ("ETL_MAX_FILES_PER_MANIFEST", "ETL_NUM_STATUS_SHARDS", "ETL_EXPECTED_FILE_SIZE_MB"):
        monkeypatch.delenv(name, raising=False)
    config = load_config(EtlSettings)
    assert (
        config.max_files_per_manifest,
        config.expected_file_size_mb,
        config.size_tolerance_percent,
        config.min_files_for_partial_batch,
        config.ttl_days,
        config.num_status_shards,
    ) == (10, 10, 99, 1, 30, 10)
    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", "25")
    monkeypatch.setenv("ETL_NUM_STATUS_SHARDS", "3")
    config = load_config(EtlSettings)
    assert (config.max_files_per_manifest, config.num_status_shards) == (25, 3)


def test_bad_input_gets_a_recorded_reason_and_good_files_still_flow(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    good = [write_input(root, DAY, f"good-{i}.ndjson", good_lines(3, i)) for i in range(3)]
    wrong_ext = write_input(root, DAY, "data.json", good_lines(3, 9))
    too_big = write_input(root, DAY, "big.ndjson", good_lines(40, 8))
    empty = write_input(root, DAY, "empty.ndjson", [])
    undated = write_input(root, "not-a-date", "x.ndjson", good_lines(3, 7))
    gone = (root / "pipeline" / "input" / DAY / "gone.ndjson").as_uri()

    summary = ndjson_ingest(
        file_urls=good + [wrong_ext, too_big, empty, undated, gone, good[0]], merge_deployment=MISSING_DEPLOYMENT
    )

    assert (summary["tracked"], summary["already_tracked"], summary["quarantined"]) == (3, 1, 5)
    items = records(table)
    reasons = {k[1]: v["error_message"] for k, v in items.items() if v["status"].startswith("quarantined")}
    undated_key = etl_keys.undated_file_key(undated)
    assert set(reasons) == {"data.json", "big.ndjson", "empty.ndjson", "gone.ndjson", undated_key}
    assert reasons["data.json"] == "wrong extension: expected .ndjson"
    assert reasons["empty.ndjson"] == "empty file (0 bytes)"
    assert reasons["big.ndjson"].startswith("size ") and "outside 0.001 MB ± 99.0%" in reasons["big.ndjson"]
    assert reasons["gone.ndjson"].startswith("file not found")
    assert reasons[undated_key].startswith("unparseable input path") and items[(etl_keys.UNDATED_PREFIX, undated_key)]
    # copies and reason files in quarantine; nothing removed from the input
    assert (root / etl_keys.quarantine_key(DAY, "big.ndjson")).read_bytes() == Path(too_big[7:]).read_bytes()
    assert (
        json.loads((root / keys.quarantine_reason_key(etl_keys.quarantine_key(DAY, "data.json"))).read_text())["reason"]
        == reasons["data.json"]
    )
    assert (root / keys.quarantine_reason_key(etl_keys.undated_quarantine_key(undated))).exists()
    assert all(Path(u[7:]).exists() for u in good + [wrong_ext, too_big, empty, undated])
    # valid files: pending#N with the seed's MD5 shard, TTL ~30 days ahead
    for i in range(3):
        item = items[(DAY, f"good-{i}.ndjson")]
        shard = etl_keys.status_shard(f"good-{i}.ndjson", 4)
        assert (item["status"], item["shard_id"]) == (f"pending#{shard}", shard)
        assert abs(item["ttl"] - (time.time() + 30 * 86400)) < 120
    metrics = list(state_store.scan_all(etl_env["tables"]["etl_metrics"]))
    assert (
        [m["metric_type"] for m in metrics] == ["ingest"] and metrics[0]["quarantined"] == 5 and metrics[0]["ttl"] > 0
    )


def _install_query_spy(monkeypatch) -> list[dict]:
    """Record every Query's kwargs (to prove no FilterExpression names file_key)."""
    seen: list[dict] = []
    real_table = state_store.table

    class Spy:
        def __init__(self, inner):
            self._inner = inner

        def query(self, **kwargs):
            seen.append(kwargs)
            return self._inner.query(**kwargs)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    monkeypatch.setattr(state_store, "table", lambda name: Spy(real_table(name)))
    return seen


def _expression_text(expression) -> str:
    if expression is None:
        return ""
    if isinstance(expression, str):
        return expression
    from boto3.dynamodb.conditions import ConditionExpressionBuilder

    built = ConditionExpressionBuilder().build_expression(expression)
    return built.condition_expression + json.dumps(built.attribute_name_placeholders)


def test_ingest_merge_flush_end_to_end(etl_env, monkeypatch):
    root, table = etl_env["root"], etl_env["table"]
    queries = _install_query_spy(monkeypatch)
    urls = [write_input(root, DAY, f"f-{i:02d}.ndjson", good_lines(4, i)) for i in range(6)]
    # malformed lines among good ones, and a file that is not JSON at all
    urls.append(
        write_input(
            root,
            DAY,
            "f-06.ndjson",
            [{"id": 1, "name": "ok"}, "{broken json", "[1, 2]", {"id": 2, "extra": {"deep": [1]}}],
        )
    )
    urls.append(write_input(root, DAY, "f-07.ndjson", ["id,name", "1,abc", "2,def"]))

    first = ndjson_ingest(file_urls=urls, merge_deployment=None)
    assert first["tracked"] == 8 and len(first["manifests"]) == 1 and first["launched"] == 1  # 5 files: a full batch
    flushed = ndjson_flush_orphans(today=TODAY, merge_deployment=None)
    assert flushed["orphaned_dates"] == {DAY: 3} and len(flushed["manifests"]) == 1 and flushed["launched"] == 1

    items = records(table)
    manifests = {k[1]: v for k, v in items.items() if k[1].startswith("MANIFEST#")}
    assert sorted(m["status"] for m in manifests.values()) == ["completed", "completed"]
    # taken by the merge run itself (a plain conditional write, no task run of its own): its flow run's id alone
    assert all(m["prefect_flow_run_id"] and "prefect_task_run_id" not in m for m in manifests.values())
    assert sorted(m["file_count"] for m in manifests.values()) == [3, 5]
    files = {k[1]: v for k, v in items.items() if k[1].endswith(".ndjson")}
    for name, item in files.items():  # the shard suffix survived pending → manifested → completed/failed
        assert item["status"].split("#")[1] == str(etl_keys.status_shard(name, 4)) == str(item["shard_id"])
    assert files["f-07.ndjson"]["status"].startswith("failed#")
    assert files["f-07.ndjson"]["error_message"] == "not JSON: all 3 non-empty lines are malformed"
    assert {n for n, i in files.items() if i["status"].startswith("completed#")} == {
        f"f-{i:02d}.ndjson" for i in range(7)
    }
    assert (files["f-06.ndjson"]["rows"], files["f-06.ndjson"]["rejected_lines"]) == (2, 2)
    assert (
        sum(m["rejected_lines"] for m in manifests.values()) == 5 and sum(m["rows"] for m in manifests.values()) == 26
    )

    # the Parquet output: every good line once, every column a string, metadata columns present
    out = root / etl_keys.merged_output_prefix(DAY)
    table_read = pq.read_table(out)
    assert table_read.num_rows == 6 * 4 + 2
    assert all(pa.types.is_string(f.type) for f in table_read.schema)
    assert {"_processing_timestamp", "_source_file"} <= set(table_read.column_names)
    assert pq.ParquetFile(next(out.glob("*.parquet"))).metadata.row_group(0).column(0).compression == "SNAPPY"
    rows = {r["id"]: {k: v for k, v in r.items() if k != "extra"} for r in table_read.to_pylist()}  # extra: see duckdb
    assert rows["0"] == {
        "id": "0",
        "name": "row-0",
        "score": "0.0",
        "ok": "true",
        "tags": '["a",0]',
        "meta": '{"x":0}',
        "when": "2026-01-05T10:00:00Z",
        "none": None,
        "_processing_timestamp": rows["0"]["_processing_timestamp"],
        "_source_file": urls[0],
    }
    extra = duckdb.sql(f"select extra from read_parquet('{out}/*.parquet', union_by_name=true) where extra is not null")
    assert extra.fetchall() == [('{"deep":[1]}',)]
    assert (
        duckdb.sql(f"select count(*) from read_parquet('{out}/*.parquet', union_by_name=true)").fetchall()[0][0] == 26
    )
    # rejects keep file name and line number
    rejects = [
        json.loads(line)
        for p in (root / "pipeline/output/rejects" / DAY).glob("*.ndjson")
        for line in p.read_text().splitlines()
    ]
    assert sorted((Path(r["source_file"]).name, r["line_number"]) for r in rejects) == [
        ("f-06.ndjson", 2),
        ("f-06.ndjson", 3),
        ("f-07.ndjson", 1),
        ("f-07.ndjson", 2),
        ("f-07.ndjson", 3),
    ]

    # re-running a manifest overwrites its parts: same row count
    name = etl_keys.manifest_name_from_record_key(sorted(manifests)[0])
    again = ndjson_merge(date_prefix=DAY, manifest_name=name, rerun=True)
    assert again["manifest_status"] == "completed"
    assert (
        duckdb.sql(f"select count(*) from read_parquet('{out}/*.parquet', union_by_name=true)").fetchall()[0][0] == 26
    )
    # a duplicate launch of a finished manifest does nothing
    assert ndjson_merge(date_prefix=DAY, manifest_name=name)["skipped"] is True

    # no Query ever named file_key in a FilterExpression (meta-records are filtered in code)
    assert queries and all("file_key" not in _expression_text(q.get("FilterExpression")) for q in queries)
    assert not any("FilterExpression" in q for q in queries)


def test_a_failed_launch_leaves_the_manifest_pending_and_the_flush_starts_it(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    urls = [write_input(root, TODAY, f"g-{i}.ndjson", good_lines(2, i)) for i in range(5)]
    summary = ndjson_ingest(file_urls=urls, merge_deployment=MISSING_DEPLOYMENT)
    assert (summary["launched"], summary["launch_failures"]) == (0, 1)
    (record,) = [v for k, v in records(table).items() if k[1].startswith("MANIFEST#")]
    assert record["status"] == "pending"
    # a file disappears between event and merge: it fails with its reason, the others complete
    Path(urls[0][7:]).unlink()
    flushed = ndjson_flush_orphans(today=TODAY, merge_deployment=None, restart_pending_after_seconds=0)
    assert flushed["manifests"] == [] and flushed["launched"] == 1
    items = records(table)
    assert items[(TODAY, record["file_key"])]["status"] == "completed"
    assert items[(TODAY, "g-0.ndjson")]["status"].startswith("failed#")
    assert "disappeared" in items[(TODAY, "g-0.ndjson")]["error_message"]
    assert sum(1 for k, v in items.items() if k[1].endswith(".ndjson") and v["status"].startswith("completed#")) == 4


def test_a_failed_merge_marks_everything_failed_and_alerts(etl_env, caplog):
    root, table = etl_env["root"], etl_env["table"]
    urls = [write_input(root, TODAY, f"h-{i}.ndjson", good_lines(2, i)) for i in range(5)]
    ndjson_ingest(file_urls=urls, merge_deployment=MISSING_DEPLOYMENT)
    (record,) = [v for k, v in records(table).items() if k[1].startswith("MANIFEST#")]
    (
        root / etl_keys.manifest_key(TODAY, etl_keys.manifest_name_from_record_key(record["file_key"]))
    ).unlink()  # manifest lost
    with caplog.at_level(logging.ERROR):
        state = ndjson_merge(
            date_prefix=TODAY,
            manifest_name=etl_keys.manifest_name_from_record_key(record["file_key"]),
            return_state=True,
        )
    assert state.is_failed()
    items = records(table)
    assert items[(TODAY, record["file_key"])]["status"] == "failed"
    assert "ObjectNotFound" in items[(TODAY, record["file_key"])]["error_message"]
    assert sorted(v["status"].split("#")[0] for k, v in items.items() if k[1].endswith(".ndjson")) == ["failed"] * 5
    assert "MERGE FAILED" in caplog.text

    # ops: failed files back to pending (guarded, shard kept), then a flush batches them again
    out = etl_ops.reprocess_failed(TODAY)
    assert out["moved"] == 5 and etl_ops.reprocess_failed(TODAY)["moved"] == 0
    status = etl_ops.status_by_date(TODAY, "pending")
    assert status["files"] == {"pending": 5} and all(f["status"].startswith("pending#") for f in status["selected"])


def test_ops_remediate_follows_the_manifest_or_releases_dead_claims(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    config = etl.settings()
    urls = [write_input(root, DAY, f"r-{i}.ndjson", good_lines(1, i)) for i in range(7)]
    etl.track_files(etl.validate_files(urls, config), config)
    (ref,) = etl.create_manifests(DAY, 5, config)
    # the merge ended but the batch status update never ran: files stuck in manifested
    state_store.transition(
        table, {"date_prefix": DAY, "file_key": etl_keys.manifest_record_key(ref.manifest_name)}, "pending", "completed"
    )
    # a claimer that died before writing its manifest
    dead = etl._claim(etl.pending_files(DAY), etl_keys.claim_placeholder("dead"))
    assert len(dead) == 2
    assert etl_ops.remediate_manifested(DAY, placeholder_older_than_minutes=60)["moved"] == 5  # young claims left alone
    out = etl_ops.remediate_manifested(DAY, placeholder_older_than_minutes=0)
    assert out["moved"] == 2 and out["left_in_flight"] == 0
    items = records(table)
    by_status = sorted(v["status"].split("#")[0] for k, v in items.items() if k[1].endswith(".ndjson"))
    assert by_status == ["completed"] * 5 + ["pending"] * 2
    assert all(v["status"].endswith(f"#{v['shard_id']}") for k, v in items.items() if k[1].endswith(".ndjson"))
    from deployments.cli import main

    assert main(["etl", "status", "--status", "pending", "--before", TODAY]) == 0
    assert etl_ops.files_with_status("pending", TODAY) == {DAY: 2}
    assert main(["etl", "status"]) == 2  # a clear error, no trace


def test_ops_remediate_gives_the_files_of_a_failed_manifest_its_reason(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    config = etl.settings()
    urls = [write_input(root, DAY, f"w-{i}.ndjson", good_lines(1, i)) for i in range(3)]
    etl.track_files(etl.validate_files(urls, config), config)
    (ref,) = etl.create_manifests(DAY, 3, config)
    key = {"date_prefix": DAY, "file_key": etl_keys.manifest_record_key(ref.manifest_name)}
    # what the reconciler does to a manifest whose merge run crashed: failed with the reason, files left behind
    state_store.transition(table, key, "pending", "failed", set={"error_message": "its flow run Crashed"})
    assert etl_ops.remediate_manifested(DAY)["moved"] == 3
    files = [v for k, v in records(table).items() if k[1].endswith(".ndjson")]
    assert sorted(f["status"].split("#")[0] for f in files) == ["failed"] * 3
    assert {f["error_message"] for f in files} == {f"its manifest {ref.manifest_path} failed: its flow run Crashed"}


def test_files_an_earlier_batch_left_pending_go_in_the_next_manifest_oldest_first(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    config = etl.settings()
    size = config.max_files_per_manifest
    # files left pending by earlier batches, tracked one at a time, the oldest with the highest name
    old = [f"old-{i:02d}.ndjson" for i in range(2 * size - 1)]
    for name in reversed(old):
        etl.track_files(etl.validate_files([write_input(root, DAY, name, good_lines(1, 0))], config), config)
    new = [write_input(root, DAY, f"new-{i}.ndjson", good_lines(1, i)) for i in range(size - 2)]
    tracked = etl.track_files(etl.validate_files(new, config), config)

    made = etl.create_manifests(DAY, size, config, prefer=tracked["new_files"][DAY])

    files = {k[1]: v for k, v in records(table).items() if k[1].endswith(".ndjson")}
    first = sorted(k for k, v in files.items() if v.get("manifest_path") == made[0].manifest_path)
    # the batch's own files, then the two that waited longest (not two picked at random)
    assert first == sorted(tracked["new_files"][DAY] + old[-2:])
    assert len(made) == 2 and sorted(k for k, v in files.items() if not v.get("manifest_path")) == old[: size - 3]


@pytest.mark.sweep  # slow for make test; CI runs it in make test-sweep
def test_four_ingest_runs_at_once_put_every_file_in_exactly_one_manifest(etl_env, monkeypatch):
    """Four ndjson-ingest flow runs in threads over 1,020 files on 3 dates, with redelivered events."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", "10")
    root, table = etl_env["root"], etl_env["table"]
    dates = ["2026-01-01", "2026-01-02", "2026-01-03"]
    urls = [write_input(root, dates[i % 3], f"c-{i:04d}.ndjson", [{"i": i, "pad": "x" * 20}]) for i in range(1020)]
    quarters = [urls[q::4] for q in range(4)]
    batches = [quarters[q] + quarters[(q + 1) % 4][:40] for q in range(4)]  # SQS redelivers some events elsewhere

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda b: ndjson_ingest(file_urls=b, merge_deployment=MISSING_DEPLOYMENT), batches))
    assert sum(r["tracked"] for r in results) == 1020 and sum(r["already_tracked"] for r in results) == 160
    made_by_ingest = [m for r in results for m in r["manifests"]]
    ndjson_flush_orphans(today=TODAY, merge_deployment=MISSING_DEPLOYMENT)

    manifests = {}
    for date in dates:
        for path in (root / "manifests" / date).glob("*.json"):
            manifests[(date, path.name)] = json.loads(path.read_text())["fileLocations"][0]["URIPrefixes"]
    listed = [u for files in manifests.values() for u in files]
    assert len(listed) == len(set(listed)) == 1020 and set(listed) == set(urls)  # disjoint, complete
    assert all(len(files) == 10 for (d, n), files in manifests.items() if n in made_by_ingest)
    items = records(table)
    file_items = {k: v for k, v in items.items() if k[1].startswith("c-")}
    assert not [v for v in file_items.values() if not v["status"].startswith("manifested#")]  # none pending
    meta = {k: v for k, v in items.items() if k[1].startswith("MANIFEST#")}
    assert {(d, etl_keys.manifest_name_from_record_key(f)) for d, f in meta} == set(manifests)
    for (date, name), files in manifests.items():  # every file points at the one manifest that lists it
        path = meta[(date, etl_keys.manifest_record_key(name))]["manifest_path"]
        assert {file_items[(date, Path(u).name)]["manifest_path"] for u in files} == {path}
        assert meta[(date, etl_keys.manifest_record_key(name))]["file_count"] == len(files)
