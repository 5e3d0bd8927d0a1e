"""The local arrival path: the file watch source alone, then the ETL listener end to end on DynamoDB Local."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tasks.landing.watch import LocalWatchSource
from tests.helpers.etl import DAY, TODAY
from tests.helpers.landing import receive_all

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

INPUT = "pipeline/input/"


@pytest.fixture
def watched(tmp_path):
    """A store folder and a factory of watch sources over its ``pipeline/input/`` (closed after the test)."""
    sources = []

    def make(**options) -> LocalWatchSource:
        options.setdefault("settle_seconds", 0.5)
        source = LocalWatchSource(tmp_path.as_uri(), INPUT, **options)
        sources.append(source)
        return source

    yield tmp_path, make
    for source in sources:
        source.close()


def test_a_file_renamed_in_is_taken_once_and_hidden_or_temporary_files_never(watched):
    root, make = watched
    source = make(settle_seconds=30)  # only the rename fast path can take it within the test
    day = root / INPUT / "2026-01-05"
    day.mkdir(parents=True)
    staged = root / "staged.ndjson"
    staged.write_text('{"a": 1}\n')
    os.rename(staged, day / "f.ndjson")
    (day / ".hidden.ndjson").write_text("x\n")
    (day / "g.ndjson.tmp").write_text("x\n")
    (day / ".g.ndjson.123.part").write_text("x\n")
    got = receive_all(source, 2)
    assert [(a.key, a.size, a.url) for a in got] == [
        ("pipeline/input/2026-01-05/f.ndjson", 9, (day / "f.ndjson").as_uri())
    ]
    stat = (day / "f.ndjson").stat()
    assert (
        got[0].event_id == f"pipeline/input/2026-01-05/f.ndjson:9:{stat.st_mtime_ns}:{stat.st_ino}:{stat.st_ctime_ns}"
    )
    assert receive_all(source, 0.5) == []  # in flight: not offered twice
    source.ack(got)
    assert receive_all(source, 0.5) == []


def test_a_file_written_in_place_is_taken_only_once_stable(watched):
    root, make = watched
    source = make(settle_seconds=1.0)
    path = root / INPUT / "2026-01-05" / "slow.ndjson"
    path.parent.mkdir(parents=True)
    with open(path, "w") as handle:
        for i in range(4):  # a growing file, still open
            handle.write(f'{{"i": {i}}}\n')
            handle.flush()
            assert source.receive(max_items=10, wait_seconds=0.4) == []
    written = time.monotonic()
    got = receive_all(source, 5, until=1)
    assert [(a.key, a.size) for a in got] == [("pipeline/input/2026-01-05/slow.ndjson", 36)]
    assert time.monotonic() - written >= 0.6  # stable for the settle time (1 s, measured from its last write)


def test_the_catch_up_listing_finds_files_written_before_start_and_a_restart_offers_unacked_ones(watched):
    root, make = watched
    day = root / INPUT / "2026-01-06"
    day.mkdir(parents=True)
    for name in ("a.ndjson", "b.ndjson", "c.ndjson"):
        (day / name).write_text("{}\n")
    (root / "elsewhere.ndjson").write_text("{}\n")  # outside the prefix
    first = make()
    got = receive_all(first, 3, until=3)
    assert sorted(a.key.rsplit("/", 1)[1] for a in got) == ["a.ndjson", "b.ndjson", "c.ndjson"]
    first.ack([a for a in got if a.key.endswith("a.ndjson")])
    first.release([a for a in got if a.key.endswith("b.ndjson")], "database down")
    first.close()  # c.ndjson: neither acked nor released (the listener died)
    again = make()
    offered = receive_all(again, 3, until=3)
    # a new process knows nothing of the old one's acks: everything is offered again, the pipeline's
    # create-if-absent makes the repeat a no-op
    assert sorted(a.key.rsplit("/", 1)[1] for a in offered) == ["a.ndjson", "b.ndjson", "c.ndjson"]
    assert all(a.receive_count == 1 for a in offered)


def test_a_released_arrival_comes_back_after_a_delay_with_its_count(watched):
    root, make = watched
    source = make()
    path = root / INPUT / "2026-01-07" / "r.ndjson"
    path.parent.mkdir(parents=True)
    path.write_text("{}\n")
    (first,) = receive_all(source, 3, until=1)
    source.release([first], "busy")
    assert source.receive(max_items=10, wait_seconds=0.5) == []  # not before 1 s
    (second,) = receive_all(source, 3, until=1)
    assert (second.event_id, second.receive_count) == (first.event_id, 2)


# --------------------------------------------------------------------------- the ETL listener


def land(root: Path, date: str, name: str, rows: list[int]) -> str:
    """Land an NDJSON file the way uploads do: written beside, renamed in (the store's atomic write)."""
    from tasks.core.object_store import LocalStore

    body = "".join(json.dumps({"id": i, "name": f"row-{i}"}) + "\n" for i in rows)
    return LocalStore(root).put_bytes(f"{INPUT}{date}/{name}", body.encode())


def statuses(table: str) -> dict[str, str]:
    """file key -> status of every file record (meta-records left out)."""
    from tasks.core import state_store
    from tasks.etl import keys

    return {i["file_key"]: i["status"] for i in state_store.scan_all(table) if not keys.is_meta_record(i["file_key"])}


def manifests(table: str) -> dict[str, dict]:
    """MANIFEST# record key -> record."""
    from tasks.core import state_store

    return {i["file_key"]: i for i in state_store.scan_all(table) if i["file_key"].startswith("MANIFEST#")}


def merged_ids(root: Path, date: str) -> list[int]:
    """Every id in the date's merged Parquet, sorted (repeats kept)."""
    import duckdb

    from tasks.etl import keys

    out = root / keys.merged_output_prefix(date)
    return sorted(
        int(r[0]) for r in duckdb.sql(f"select id from read_parquet('{out}/*.parquet', union_by_name=true)").fetchall()
    )


def no_launch(made):
    """A launcher that starts nothing (merges left pending for the flush)."""
    from tasks.etl import ingest as etl

    return etl.launch_merges(made, lambda ref: None)


def arrival_for(url: str, size: int | None = 10):
    from tasks.landing.sources import Arrival

    return Arrival(
        url=url, key=url.split("/objects/", 1)[-1], size=size, event_time="2026-01-05T00:00:00+00:00", event_id=url
    )


def test_repeated_late_gone_and_unknown_arrivals_change_nothing_and_say_so_once(etl_env, caplog):
    from tasks.etl import ingest as etl
    from tasks.etl.landing import handle_landed

    root, table = etl_env["root"], etl_env["table"]
    config = etl.settings()
    urls = [land(root, DAY, f"f-{i}.ndjson", [i]) for i in range(3)]
    bad = land(root, DAY, "notes.txt", [9])
    gone = (root / INPUT / DAY / "gone.ndjson").as_uri()
    outside = land(root, "x", "y.ndjson", [7]).replace(f"/{INPUT}x/", "/elsewhere/x/")
    first = [arrival_for(u) for u in urls] + [arrival_for(urls[0]), arrival_for(bad)]
    with caplog.at_level("DEBUG", logger="tasks.etl.landing"):  # a file's line is DEBUG: its batch's is INFO
        outcome = handle_landed(first, config, no_launch)
        assert outcome.done == first and outcome.retry == []
        later = [
            arrival_for(urls[1]),
            arrival_for(gone),
            arrival_for(outside),
        ]  # a late repeat, a deleted file, unknown
        again = handle_landed(later, config, no_launch)
        assert again.done == later and again.retry == []
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.etl.landing"]
    assert lines == [
        f"{urls[0]}: tracked ({DAY})",
        f"{urls[1]}: tracked ({DAY})",
        f"{urls[2]}: tracked ({DAY})",
        f"{urls[0]}: already tracked (a repeat in this batch): nothing to do",
        f"{bad}: quarantined: wrong extension: expected .ndjson",
        "5 landed file(s): 1 already_tracked, 1 quarantined, 3 tracked",
        f"{outside}: outside every known prefix (pipeline/input/YYYY-MM-DD/): ignored",
        f"{gone}: missing (deleted since it landed): nothing to do",
        f"{urls[1]}: already tracked ({statuses(table)['f-1.ndjson']}): nothing to do",
        "3 landed file(s): 1 already_tracked, 1 missing, 1 outside_prefix",
    ]
    levels = {r.getMessage(): r.levelname for r in caplog.records if r.name == "tasks.etl.landing"}
    assert levels[f"{urls[0]}: tracked ({DAY})"] == "DEBUG"  # not sent to the Prefect API: one INFO line a batch
    assert levels["5 landed file(s): 1 already_tracked, 1 quarantined, 3 tracked"] == "INFO"
    found = statuses(table)
    assert sorted(found) == ["f-0.ndjson", "f-1.ndjson", "f-2.ndjson", "notes.txt"]
    assert [found[f"f-{i}.ndjson"].split("#")[0] for i in range(3)] == ["pending"] * 3  # 3 < 5: no manifest yet
    assert found["notes.txt"].startswith("quarantined#") and manifests(table) == {}


def test_repeats_of_files_a_killed_run_left_pending_are_batched_and_repeats_of_batched_ones_claim_nothing(etl_env):
    from tasks.etl import ingest as etl
    from tasks.etl.landing import handle_landed

    root, table = etl_env["root"], etl_env["table"]
    config = etl.settings()
    urls = [land(root, DAY, f"k-{i}.ndjson", [i]) for i in range(5)]
    etl.track_files(etl.validate_files(urls, config), config)  # a run killed between tracking and batching
    assert manifests(table) == {}
    outcome = handle_landed([arrival_for(u) for u in urls], config, no_launch)  # the restart's catch-up listing
    assert len(outcome.done) == 5 and outcome.retry == []
    (record,) = manifests(table).values()
    assert (record["status"], record["file_count"]) == ("pending", 5)
    assert {s.split("#")[0] for s in statuses(table).values()} == {"manifested"}
    again = handle_landed([arrival_for(u) for u in urls], config, no_launch)  # listed once more: nothing to claim
    assert len(again.done) == 5 and len(manifests(table)) == 1
    assert {s.split("#")[0] for s in statuses(table).values()} == {"manifested"}


def landed_events(url: str, wait_for: int = 1) -> list:
    """The Prefect events naming ``url`` (the server files events in the background: polled)."""
    from prefect import get_client
    from prefect.events.filters import EventAnyResourceFilter, EventFilter
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all()
    wanted = EventFilter(any_resource=EventAnyResourceFilter(id=[url]))
    with get_client(sync_client=True) as client:
        for _ in range(100):
            events = client.read_events(filter=wanted, limit=50).events
            if len(events) >= wait_for:
                return events
            time.sleep(0.2)
    return events


def test_a_batch_of_a_hundred_files_inside_a_run_is_announced_in_events_the_server_accepts():
    from prefect import flow

    from tasks.landing.listener import emit_landed

    urls = [f"file:///landing/pipeline/input/{DAY}/big-{i:03d}.ndjson" for i in range(100)]

    @flow(name="landing-events-batch")
    def announce() -> None:  # a run's context adds its own related resources to each event
        emit_landed("etl", [(arrival_for(url), "tracked", ["0b6c3f0e-3f7a-4f53-9a51-1c2d3e4f5a6b"]) for url in urls])

    announce()
    (first,) = landed_events(urls[0])
    (last,) = landed_events(urls[-1])
    assert first.id != last.id and first.event == last.event == "pipelines.etl.object.tracked"
    assert len(first.payload["objects"]) + len(last.payload["objects"]) == 100


def test_files_landing_while_the_listener_runs_end_completed_once_in_the_parquet_with_their_events(etl_env):
    import threading

    from flows.etl import ndjson_listen

    root, table = etl_env["root"], etl_env["table"]
    before = [land(root, DAY, f"a-{i}.ndjson", [i]) for i in range(5)]  # landed while nothing watched
    later = threading.Timer(2.0, lambda: [land(root, DAY, f"b-{i}.ndjson", [10 + i]) for i in range(5)])
    later.start()
    stats = ndjson_listen(
        merge_deployment=None,
        batch_size=5,
        batch_seconds=0.5,
        settle_seconds=0.2,
        idle_exit_seconds=4,
        max_runtime_seconds=120,
    )
    later.join()
    assert stats["received"] == stats["acked"] == 10 and stats["released"] == 0
    found = statuses(table)
    assert sorted(found) == sorted([f"a-{i}.ndjson" for i in range(5)] + [f"b-{i}.ndjson" for i in range(5)])
    assert {s.split("#")[0] for s in found.values()} == {"completed"}
    assert [m["status"] for m in manifests(table).values()] == ["completed", "completed"]
    assert merged_ids(root, DAY) == list(range(5)) + list(range(10, 15))  # every row exactly once

    (event,) = landed_events(before[0])  # one event for the first batch's five tracked files
    assert event.event == "pipelines.etl.object.tracked"
    assert sorted(o["url"] for o in event.payload["objects"]) == sorted(before)
    assert [r.id for r in event.related if r.role == "object"] == [o["url"] for o in event.payload["objects"]]
    assert {o["url"]: o["size"] for o in event.payload["objects"]} == {
        url: (root / INPUT / DAY / f"a-{i}.ndjson").stat().st_size for i, url in enumerate(before)
    }
    runs = [r.id for r in event.related if r.role == "flow-run"]
    from prefect import get_client

    with get_client(sync_client=True) as client:  # related to the listener's run and the merge it started
        flows = sorted(
            client.read_flow(client.read_flow_run(r.removeprefix("prefect.flow-run.")).flow_id).name for r in runs
        )
    assert flows == ["ndjson-listen", "ndjson-merge"]


LISTENER = """
import sys
from tasks.etl import ingest as etl
from tasks.etl.landing import handle_landed
from tasks.landing.listener import listen
from tasks.landing.watch import LocalWatchSource

config = etl.settings()
launch = lambda made: etl.launch_merges(made, lambda ref: None)  # merges left pending: the flush starts them
source = LocalWatchSource(sys.argv[1], "pipeline/input/", settle_seconds=0.2)
listen(source, lambda batch: handle_landed(batch, config, launch), batch_size=3, batch_seconds=0.2,
       idle_exit_seconds=float(sys.argv[2]), max_runtime_seconds=120)
"""


def start_listener(root: Path, idle_exit_seconds: float):
    """A real listener process (pump over the watch source and the ETL handler) on this test's tables and store."""
    import subprocess
    import sys

    from prefect.settings import PREFECT_API_URL

    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    return subprocess.Popen(
        [sys.executable, "-c", LISTENER, root.as_uri(), str(idle_exit_seconds)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def manifest_files(table: str) -> list[str]:
    """Every file URL listed in any manifest JSON (a file listed twice would be a double claim)."""
    from tasks.core.object_store import open_url

    listed = []
    for record in manifests(table).values():
        store, key = open_url(record["manifest_path"])
        listed += json.loads(store.get_bytes(key))["fileLocations"][0]["URIPrefixes"]
    return listed


@pytest.mark.sweep  # ~35 s: two listener processes and three merges
def test_a_listener_killed_mid_batch_and_started_again_loses_nothing_and_claims_nothing_twice(etl_env):
    import signal

    from flows.etl import ndjson_flush_orphans

    root, table = etl_env["root"], etl_env["table"]
    for i in range(12):
        land(root, DAY, f"k-{i:02d}.ndjson", [i])
    first = start_listener(root, idle_exit_seconds=60)
    deadline = time.monotonic() + 120
    while not statuses(table) and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)  # mid-run: some batches tracked, the rest received or not yet
    first.wait(timeout=30)
    assert 0 < len(statuses(table)) < 12, first.stderr.read()[-2000:]
    again = start_listener(root, idle_exit_seconds=3)
    assert again.wait(timeout=180) == 0, again.stderr.read()[-2000:]

    found = statuses(table)
    assert sorted(found) == [f"k-{i:02d}.ndjson" for i in range(12)]  # 0 lost
    listed = manifest_files(table)
    assert len(listed) == len(set(listed))  # 0 double claims
    in_manifest = {u.rsplit("/", 1)[1] for u in listed}
    assert {k for k, s in found.items() if s.startswith("manifested#")} == in_manifest
    assert {s.split("#")[0] for s in found.values()} <= {"pending", "manifested"}
    ndjson_flush_orphans(today=TODAY, merge_deployment=None, restart_pending_after_seconds=0)
    assert {s.split("#")[0] for s in statuses(table).values()} == {"completed"}
    assert merged_ids(root, DAY) == list(range(12))  # every row exactly once


def test_make_up_starts_each_listener_once_and_replaces_one_whose_process_died():
    import subprocess

    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.states import Cancelled, Running

    from deployments.local_stack import create_work_pools, start_listeners
    from flows.etl import ndjson_listen

    with get_client(sync_client=True) as client:
        create_work_pools(client)
        assert client.read_work_pool("local-process").concurrency_limit is None  # a listener never starves other runs
        deployment_id = client.create_deployment(
            client.create_flow(ndjson_listen),
            "local",
            work_pool_name="local-process",
            entrypoint="flows/etl.py:ndjson_listen",
            concurrency_limit=1,
        )

        def runs():
            return client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            )

        try:
            assert start_listeners(client, worker_restarted=False)["ndjson-listen/local"] == "started"
            assert start_listeners(client, worker_restarted=False)["ndjson-listen/local"] == "running"
            (first,) = runs()
            gone = subprocess.Popen(["true"])
            gone.wait()
            client.update_flow_run(first.id, infrastructure_pid=f"localhost:{gone.pid}")
            client.set_flow_run_state(first.id, Running(), force=True)
            assert start_listeners(client, worker_restarted=False)["ndjson-listen/local"] == "restarted"
            states = sorted(r.state_name for r in runs())
            assert states == ["Crashed", "Scheduled"]
            assert (
                start_listeners(client, worker_restarted=True)["ndjson-listen/local"] == "running"
            )  # scheduled: the worker takes it
        finally:
            for run in runs():
                client.set_flow_run_state(run.id, Cancelled(), force=True)  # no worker of this session may take them


def test_an_unreachable_database_offers_the_batch_again_and_the_next_offer_tracks_it(etl_env, monkeypatch):
    from botocore.config import Config

    from deployments import dynamodb_local
    from tasks.core import state_store
    from tasks.etl import ingest as etl
    from tasks.etl.landing import handle_landed

    root, table = etl_env["root"], etl_env["table"]
    config = etl.settings()
    urls = [land(root, DAY, f"d-{i}.ndjson", [i]) for i in range(2)]
    batch = [arrival_for(u) for u in urls] + [arrival_for((root / "other" / "x.ndjson").as_uri())]
    endpoint = os.environ["AWS_ENDPOINT_URL_DYNAMODB"]
    monkeypatch.setattr(state_store, "BOTO_CONFIG", Config(retries={"max_attempts": 1}, connect_timeout=1))
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{dynamodb_local.free_port()}")  # nothing listens
    state_store.reset_clients()
    down = handle_landed(batch, config, no_launch)
    assert down.done == batch[2:]  # the unknown object needs no database
    assert [(a.url, reason.split(":")[0]) for a, reason in down.retry] == [(u, "EndpointConnectionError") for u in urls]
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", endpoint)
    state_store.reset_clients()
    again = handle_landed([a for a, _ in down.retry], config, no_launch)
    assert [a.url for a in again.done] == urls and again.retry == []
    assert sorted(statuses(table)) == ["d-0.ndjson", "d-1.ndjson"]
