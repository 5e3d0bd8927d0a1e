"""Foundation: tables, blocks, object store and a flow writing through the state store."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from prefect import flow, task

from blocks import DynamoTables, ObjectStorage, load_config
from tasks.core import keys, state_store
from tasks.core.config import table_names
from tasks.core.object_store import LocalStore, ObjectNotFound, ObjectStore
from tasks.core.registry import table_specs
from tasks.core.tables import SchemaMismatch, TableSpec, ensure_table

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

ROOT = Path(__file__).resolve().parents[2]


def test_ensure_tables_is_idempotent_and_matches_the_seeds(tables):
    from tasks.core.tables import ensure_tables

    assert set(ensure_tables(table_specs(), tables).values()) == {"exists"}
    description = state_store.client().describe_table(TableName=tables["etl_file_tracking"])["Table"]
    assert {k["AttributeName"]: k["KeyType"] for k in description["KeySchema"]} == {
        "date_prefix": "HASH",
        "file_key": "RANGE",
    }
    gsi = description["GlobalSecondaryIndexes"][0]
    assert gsi["IndexName"] == "status-index" and gsi["Projection"]["ProjectionType"] == "ALL"
    assert [k["AttributeName"] for k in gsi["KeySchema"]] == ["status", "date_prefix"]
    ttl = state_store.client().describe_time_to_live(TableName=tables["etl_file_tracking"])["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "ttl"
    runs = state_store.client().describe_table(TableName=tables["phspectra_runs"])["Table"]
    assert [k["AttributeName"] for k in runs["GlobalSecondaryIndexes"][0]["KeySchema"]] == ["GSI1_PK", "GSI1_SK"]


def test_a_table_with_the_wrong_keys_is_refused_and_left_alone(tables):
    name = tables["ecs_job"]
    state_store.put(name, {"job_id": "keep-me"})
    with pytest.raises(SchemaMismatch) as error:
        ensure_table(name, TableSpec("job_id", "created_at"))
    assert "key schema" in str(error.value) and "created_at" in str(error.value)
    assert state_store.get_item(name, {"job_id": "keep-me"}) == {"job_id": "keep-me"}


def test_blocks_default_to_seed_names_and_env_overrides(monkeypatch):
    monkeypatch.delenv("TABLE_ETL_FILE_TRACKING", raising=False)
    monkeypatch.setenv("TABLE_ENV", "prod")
    names = table_names()
    assert names["etl_file_tracking"] == "ndjson-parquet-sqs-file-tracking-prod"
    assert set(names) == set(table_specs())
    monkeypatch.setenv("TABLE_ETL_FILE_TRACKING", "my-tracking")
    assert table_names()["etl_file_tracking"] == "my-tracking"
    saved_by_field = DynamoTables(env="prod", etl_metrics="old-style-metrics")  # a block saved with one field per table
    assert saved_by_field.name_of("etl_metrics", "seed-name") == "old-style-metrics"
    monkeypatch.setenv("OBJECT_STORE_BASE_URL", "s3://bucket/prefix")
    assert load_config(ObjectStorage).base_url == "s3://bucket/prefix"


@pytest.mark.parametrize("bad", ["../etc/passwd", "a/../../b", "/abs", "a//b", "a\\b", "", "a/./b"])
def test_object_keys_cannot_escape_the_store(tmp_path, bad):
    store = LocalStore(tmp_path)
    with pytest.raises(ValueError):
        store.put_bytes(bad, b"x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", "", "x" * 200, "a\nb"])
def test_ids_are_validated(bad):
    with pytest.raises(keys.InvalidKey):
        keys.safe_id(bad)


def test_local_store_round_trip(tmp_path):
    store = ObjectStore.from_url(tmp_path.as_uri())
    url = store.put_bytes("a/b/c.txt", b"hello")
    assert url == (tmp_path / "a/b/c.txt").as_uri()
    assert store.get_bytes("a/b/c.txt") == b"hello" and store.size("a/b/c.txt") == 5
    store.copy("a/b/c.txt", "d/e.txt")
    assert sorted(store.list("")) == ["a/b/c.txt", "d/e.txt"]
    assert list(store.list("a/")) == ["a/b/c.txt"]
    assert store.delete_prefix("a/") == 1 and not store.exists("a/b/c.txt")
    with pytest.raises(ObjectNotFound):
        store.get_bytes("a/b/c.txt")


def write_and_die(root: str, key: str) -> None:
    """The child's step: a local write whose writer is SIGKILLed halfway through the stream."""
    import os
    import signal

    def pieces():
        yield b"x" * 1024
        os.kill(os.getpid(), signal.SIGKILL)
        yield b"never"

    class Stream:
        def __init__(self):
            self.source = pieces()

        def read(self, _size=-1):
            return next(self.source, b"")

    LocalStore(root).put_stream(key, Stream())


def test_a_killed_local_writer_leaves_no_object_and_its_temp_file_is_cleaned_up(tmp_path):
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor

    from tests.helpers.crashpoints import killed, run_child

    store = LocalStore(tmp_path / "store")
    store.put_bytes("jobs/a/keep.bin", b"kept")
    keys_written = ("jobs/a/segments/1.mp4", "jobs/a/segments/2.mp4", "jobs/b/segments/1.mp4")
    with ThreadPoolExecutor(3) as pool:  # three writers at once, each killed mid-stream
        results = list(
            pool.map(
                lambda key: run_child(
                    "tests.core.test_foundation:write_and_die", {"root": str(store.root), "key": key}
                ),
                keys_written,
            )
        )
    assert all(killed(result) for result in results), [result.stderr[-500:] for result in results]
    left = sorted(p.name for p in store.root.rglob("*.part"))
    assert len(left) == 3 and all(name.startswith((".1.mp4.", ".2.mp4.")) for name in left), left
    assert not store.exists("jobs/a/segments/1.mp4") and list(store.list("jobs/")) == ["jobs/a/keep.bin"]
    # an age threshold spares what a live writer may still be writing
    assert store.abort_incomplete_uploads(older_than_s=3600, prefix="jobs/b/") == 0
    old = time.time() - 7200
    for part in (store.root / "jobs/b/segments").glob(".*.part"):
        os.utime(part, (old, old))
    assert store.abort_incomplete_uploads(older_than_s=3600, prefix="jobs/") == 1
    # deleting a prefix takes its unfinished writes too, and nothing outside it
    assert store.delete_prefix("jobs/a/segments/") == 0
    assert list(store.root.rglob("*.part")) == [] and store.get_bytes("jobs/a/keep.bin") == b"kept"


def test_s3_store_through_moto():
    moto = pytest.importorskip("moto")
    import boto3

    with moto.mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bkt")
        store = ObjectStore.from_url("s3://bkt/root")
        store.put_bytes("x/y.json", b"{}")
        assert store.exists("x/y.json") and not store.exists("x/z.json")
        assert list(store.list("x/")) == ["x/y.json"]
        assert store.copy("x/y.json", "x/z.json") == "s3://bkt/root/x/z.json"
        assert store.delete("x/y.json") and list(store.list("")) == ["x/z.json"]
        assert "bkt" in store.presign_put("x/up.mp4")


@task(retries=2, retry_delay_seconds=[0, 0])
def bump(table_name: str, run_id: str) -> str:
    """Complete a chunk and count it, in one transaction."""
    result = state_store.transition(
        table_name,
        {"PK": run_id, "SK": "CHUNK#chunk-0000000"},
        ["PENDING", "IN_PROGRESS"],
        "COMPLETED",
        increments=[state_store.Increment(table_name, {"PK": run_id, "SK": "RUN"}, {"jobs_completed": 1})],
    )
    return result.outcome.value


@flow
def bump_twice(table_name: str, run_id: str) -> list[str]:
    return [bump(table_name, run_id), bump(table_name, run_id)]


def test_a_flow_writes_through_the_state_store_on_the_ephemeral_server(tables):
    name = tables["phspectra_runs"]
    state_store.create_if_absent(name, {"PK": "r", "SK": "RUN", "jobs_completed": 0}, ["PK", "SK"])
    state_store.create_if_absent(name, {"PK": "r", "SK": "CHUNK#chunk-0000000", "status": "PENDING"}, ["PK", "SK"])
    assert bump_twice(name, "r") == ["applied", "stale"]
    assert state_store.get_item(name, {"PK": "r", "SK": "RUN"})["jobs_completed"] == 1


@flow
def tiny_flow() -> str:
    from prefect.runtime import flow_run

    return str(flow_run.id)


def test_flow_runs_still_send_heartbeats_once_their_exit_stops_waiting_for_the_heartbeat_thread():
    import time

    from prefect import flow_engine, get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.events.worker import EventsWorker

    importlib.import_module("flows.etl")  # loading a flow module installs the quick exit

    assert getattr(flow_engine._send_heartbeats, "quick_exit", False)
    by_path = (
        "from prefect.utilities.importtools import load_script_as_module as load; load('flows/video.py'); "
        "from prefect import flow_engine; print(getattr(flow_engine._send_heartbeats, 'quick_exit', False))"
    )
    loaded = subprocess.run([sys.executable, "-c", by_path], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert loaded.stdout.strip().splitlines()[-1:] == ["True"], loaded.stderr[-2000:]  # as a worker loads a flow
    run_id = tiny_flow()
    EventsWorker.drain_all()
    wanted = EventFilter(
        event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
        resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]),
    )
    with get_client(sync_client=True) as client:
        for _ in range(50):  # the server files incoming events in the background
            if client.read_events(filter=wanted, limit=50).events:
                break
            time.sleep(0.2)
        assert [e.resource.id for e in client.read_events(filter=wanted, limit=50).events] == [
            f"prefect.flow-run.{run_id}"
        ]
        assert client.read_flow_run(run_id).state.is_completed()


@pytest.mark.parametrize("benchmark", ["state_store.py", "records.py"])
def test_a_benchmark_against_the_stacks_dynamodb_leaves_no_table_behind(benchmark):
    """Pointed at a running DynamoDB (as after `make up`), a benchmark removes the tables it made."""
    import os

    def all_tables() -> set[str]:
        pages = state_store.client().get_paginator("list_tables").paginate()
        return {name for page in pages for name in page["TableNames"]}

    before = all_tables()
    result = subprocess.run(
        [sys.executable, f"benchmarks/{benchmark}", "--quick"],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PIPELINES_USE_BLOCKS": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "RATIO" in result.stdout or "ratio" in result.stdout.lower(), result.stdout[-2000:]
    assert all_tables() == before
