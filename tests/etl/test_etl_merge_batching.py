"""A merge run takes every pending manifest it can (each with its own record, output, metric row and report), two
runs never merge one manifest twice, a failing manifest fails alone, and the launcher announces nothing while a
merge run is queued that will take the manifest."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter

import pytest

import flows.etl
from flows.etl import ndjson_ingest, ndjson_merge
from tasks.core import state_store
from tasks.etl import ingest as etl
from tasks.etl import keys
from tasks.etl import merge as etl_merge
from tasks.etl.ingest import ManifestRef
from tests.helpers.etl import DAY, MISSING_DEPLOYMENT, file_statuses, manifests, merged_rows, write_input

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

LINES = 2


def _pending(root, count: int, prefix: str) -> tuple[list[str], list[str]]:
    """``count`` manifests of 5 files each, left ``pending`` (their launch fails): (file URLs, manifest names)."""
    urls = [
        write_input(root, DAY, f"{prefix}-{i:02d}.ndjson", [{"id": f"{prefix}{i}-{k}", "v": k} for k in range(LINES)])
        for i in range(5 * count)
    ]
    summary = ndjson_ingest(file_urls=urls, merge_deployment=MISSING_DEPLOYMENT)
    assert (len(summary["manifests"]), summary["launched"]) == (count, 0)
    return urls, sorted(summary["manifests"])


def _statuses(table: str) -> dict[str, str]:
    return {keys.manifest_name_from_record_key(k): m["status"] for k, m in manifests(table).items()}


def _merge_metrics(tables) -> list[dict]:
    return [m for m in state_store.scan_all(tables["etl_metrics"]) if m["metric_type"] == "merge"]


def _each_line_once(root, urls: list[str]) -> None:
    ids = Counter(row["id"] for row in merged_rows(root))
    assert sum(ids.values()) == len(urls) * LINES and set(ids.values()) == {1}, ids


def test_one_run_merges_every_pending_manifest_each_with_its_own_record_output_metric_and_report(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    urls, names = _pending(root, 4, "a")

    result = ndjson_merge(date_prefix=DAY, manifest_name=names[2], more_manifests=10, parallel_manifests=2)

    assert (result["manifest"], result["manifest_status"], result["rows"]) == (names[2], "completed", 5 * LINES)
    assert sorted(m["manifest"] for m in result["merged"]) == names and {m["status"] for m in result["merged"]} == {
        "completed"
    }
    assert _statuses(table) == dict.fromkeys(names, "completed")
    records_ = {keys.manifest_name_from_record_key(k): m for k, m in manifests(table).items()}
    assert {m["rows"] for m in records_.values()} == {5 * LINES}
    assert len({m["prefect_flow_run_id"] for m in records_.values()}) == 1  # one run took them all
    assert file_statuses(table) == {"completed": 20}
    _each_line_once(root, urls)
    for name in names:  # each its own published output, holding its own five files
        assert sorted(f["url"] for f in etl_merge.published(DAY, name)["files"]) == sorted(
            etl_merge.manifest_files(records_[name]["manifest_path"])
        )
    metrics = _merge_metrics(etl_env["tables"])
    assert sorted(m["manifest"] for m in metrics) == names and {m["rows"] for m in metrics} == {5 * LINES}
    reports = [json.loads(p.read_text()) for p in (root / "logs/glue").iterdir()]
    assert sorted(r["manifest"] for r in reports) == names and {r["status"] for r in reports} == {"completed"}


def test_a_run_whose_manifest_another_run_took_merges_what_is_pending(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    urls, names = _pending(root, 3, "b")
    assert etl_merge.start_processing(DAY, names[0]) is not None  # another run has it

    result = ndjson_merge(date_prefix=DAY, manifest_name=names[0], more_manifests=10)

    assert result["skipped"] is True and [m["manifest"] for m in result["merged"]] == names[1:]  # oldest first
    assert _statuses(table) == {names[0]: "processing", names[1]: "completed", names[2]: "completed"}
    assert file_statuses(table) == {"completed": 10, "manifested": 5}


def test_a_run_stops_at_its_bound_and_leaves_the_rest_pending(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    _, names = _pending(root, 3, "c")
    result = ndjson_merge(date_prefix=DAY, manifest_name=names[0], more_manifests=1)
    assert [m["manifest"] for m in result["merged"]] == names[:2]
    assert _statuses(table) == {names[0]: "completed", names[1]: "completed", names[2]: "pending"}


def test_a_staying_run_takes_a_manifest_that_comes_while_it_waits_then_ends_at_its_deadline(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    urls, names = _pending(root, 1, "s")
    results: dict[str, dict] = {}
    started = time.monotonic()
    run = threading.Thread(
        target=lambda: results.setdefault(
            "run",
            ndjson_merge(
                date_prefix=DAY, manifest_name=names[0], more_manifests=10, more_seconds=12, stay_for_more=True
            ),
        )
    )
    run.start()
    while _statuses(table).get(names[0]) != "completed":
        assert time.monotonic() - started < 60, _statuses(table)
        time.sleep(0.2)
    later_urls, later = _pending(root, 1, "t")  # written after the run found nothing more pending: it waits
    run.join(timeout=90)

    assert [m["manifest"] for m in results["run"]["merged"]] == names + later
    assert time.monotonic() - started >= 12 - etl.STAY_POLL_S  # it stayed until its last look before its deadline
    assert _statuses(table) == dict.fromkeys(names + later, "completed")
    assert len({m["prefect_flow_run_id"] for m in manifests(table).values()}) == 1  # one run took both
    _each_line_once(root, urls + later_urls)


def test_two_runs_at_once_never_merge_one_manifest_twice(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    urls, names = _pending(root, 6, "d")
    results: dict[int, dict] = {}

    def run(i: int) -> None:
        results[i] = ndjson_merge(date_prefix=DAY, manifest_name=names[i], more_manifests=10, parallel_manifests=2)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert sorted(results) == [0, 1]
    merged = [m["manifest"] for r in results.values() for m in r["merged"]]
    assert sorted(merged) == names  # every manifest merged, by exactly one of the two runs
    assert _statuses(table) == dict.fromkeys(names, "completed") and file_statuses(table) == {"completed": 30}
    assert sorted(m["manifest"] for m in _merge_metrics(etl_env["tables"])) == names  # one metric row each
    _each_line_once(root, urls)


def test_a_failing_manifest_is_failed_with_its_reason_while_its_neighbours_complete(etl_env, caplog, monkeypatch):
    root, table = etl_env["root"], etl_env["table"]
    urls, names = _pending(root, 3, "e")
    (root / keys.manifest_key(DAY, names[1])).unlink()  # its manifest JSON is gone: the merge cannot read it
    # the neighbour's merge ends after the failure is recorded, so no slot frees before it on a loaded machine
    merge_listed = flows.etl.merge_task.fn

    def neighbour_after_the_failure(date_prefix, manifest_name, *args):
        deadline = time.monotonic() + 30
        while manifest_name == names[0] and _statuses(table)[names[1]] != "failed":
            assert time.monotonic() < deadline, "the failing manifest was never marked failed"
            time.sleep(0.05)
        return merge_listed(date_prefix, manifest_name, *args)

    monkeypatch.setattr(flows.etl.merge_task, "fn", neighbour_after_the_failure)

    state = ndjson_merge(
        date_prefix=DAY, manifest_name=names[0], more_manifests=10, parallel_manifests=2, return_state=True
    )

    assert state.is_failed() and names[1] in state.message
    records_ = {keys.manifest_name_from_record_key(k): m for k, m in manifests(table).items()}
    assert records_[names[1]]["status"] == "failed" and "ObjectNotFound" in records_[names[1]]["error_message"]
    assert records_[names[0]]["status"] == "completed"  # merged beside it, in the same run
    # the failure ends the taking (the breaker counts one failed run); what was left pending goes to the next run
    assert records_[names[2]]["status"] == "pending"
    assert ndjson_merge(date_prefix=DAY, manifest_name=names[2], more_manifests=10)["manifest_status"] == "completed"
    assert _statuses(table) == {names[0]: "completed", names[1]: "failed", names[2]: "completed"}
    assert file_statuses(table) == {"completed": 10, "failed": 5}
    assert "MERGE FAILED" in caplog.text
    rows = Counter(row["id"] for row in merged_rows(root))
    assert sum(rows.values()) == 10 * LINES and set(rows.values()) == {1}


def _announced(refs: list[ManifestRef]) -> set[str]:
    """The manifests of ``refs`` a ``manifest.ready`` event was received for: every event sent so far, as a last
    marker event sent after them has arrived."""
    from prefect.client.orchestration import get_client
    from prefect.events import emit_event
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.events.worker import EventsWorker

    marker = f"test.marker.{uuid.uuid4().hex}"
    emit_event(event="test.marker", resource={"prefect.resource.id": marker})
    EventsWorker.drain_all()
    wanted = EventFilter(
        event=EventNameFilter(name=[etl.MANIFEST_READY]),
        resource=EventResourceFilter(id=[f"etl.manifest.{r.date_prefix}.{r.manifest_name}" for r in refs]),
    )
    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 30
        while not client.read_events(filter=EventFilter(resource=EventResourceFilter(id=[marker])), limit=1).events:
            assert time.monotonic() < deadline, "the marker event never arrived"
            time.sleep(0.2)
        events = client.read_events(filter=wanted, limit=50).events
    return {e.resource["prefect.resource.name"] for e in events}


@pytest.mark.sweep  # slow for make test; CI runs it in make test-sweep
def test_the_launcher_announces_one_manifest_per_batch_and_none_while_a_merge_run_waits_to_start(etl_env):
    """On the test server: a queued (Scheduled) run that takes further manifests takes the batch (no event); one that
    does not take further ones, or a run already running, does not count: one event for the batch."""
    from prefect import flow as prefect_flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running

    name = f"batching-{uuid.uuid4().hex[:6]}"
    deployment = f"ndjson-merge/{name}"
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(prefect_flow(name="ndjson-merge")(lambda: None))
        deployment_id = client.create_deployment(flow_id=flow_id, name=name, paused=False)
        client.create_flow_run_from_deployment(deployment_id, parameters={"more_manifests": 0})
    tag = uuid.uuid4().hex[:6]
    batch = [ManifestRef(DAY, f"batch-{tag}-{i}.json", f"file:///m/{tag}-{i}.json", 5) for i in range(3)]

    launched = etl.launch_merges(batch, etl.deployment_launcher(deployment))  # only a run that takes none is queued
    assert [o["launched"] for o in launched] == [True] * 3
    assert _announced(batch) == {batch[0].manifest_name}  # one event for the batch

    with get_client(sync_client=True) as client:
        queued = client.create_flow_run_from_deployment(deployment_id, parameters={"more_manifests": 10})
    later = [ManifestRef(DAY, f"batch-{tag}-later-{i}.json", f"file:///m/{tag}-l{i}.json", 5) for i in range(2)]
    assert [o["launched"] for o in etl.launch_merges(later, etl.deployment_launcher(deployment))] == [True] * 2
    assert _announced(later) == set()  # the queued run takes them when it starts

    with get_client(sync_client=True) as client:  # that run started: its scan may have passed, so announce again
        client.set_flow_run_state(queued.id, Running(), force=True)
    assert [o["launched"] for o in etl.launch_merges(later, etl.deployment_launcher(deployment))] == [True] * 2
    assert _announced(later) == {later[0].manifest_name}

    with get_client(sync_client=True) as client:  # a running run that stays for more looks again after now
        staying = client.create_flow_run_from_deployment(
            deployment_id, parameters={"more_manifests": 10, "more_seconds": 120, "stay_for_more": True}
        )
        client.set_flow_run_state(staying.id, Running(), force=True)
    last = [ManifestRef(DAY, f"batch-{tag}-last-{i}.json", f"file:///m/{tag}-x{i}.json", 5) for i in range(2)]
    assert [o["run"] for o in etl.launch_merges(last, etl.deployment_launcher(deployment))] == [str(staying.id)] * 2
    assert _announced(last) == set()
    with get_client(sync_client=True) as client:  # later launches trust it without a look at the server
        client.set_flow_run_state(staying.id, Completed(), force=True)
    after = [ManifestRef(DAY, f"batch-{tag}-after.json", f"file:///m/{tag}-after.json", 5)]
    assert [o["run"] for o in etl.launch_merges(after, etl.deployment_launcher(deployment))] == [str(staying.id)]
    assert _announced(after) == set()


def test_only_a_recently_queued_draining_run_or_a_staying_one_with_time_left_holds_back_an_announcement():
    from datetime import timedelta
    from types import SimpleNamespace

    from prefect.client.schemas.objects import StateType

    from tasks.core.runtime import utc_now
    from tasks.etl.breaker import TRIAL_TAG
    from tasks.etl.ingest import QUEUED_RUN_TRUSTED_S, STAYING_RUN_MARGIN_S, taking_merge_run

    def run(name, age_s, more=500, tags=(), running_for=None, stay=False):
        return SimpleNamespace(
            id=name,
            parameters={"more_manifests": more, "more_seconds": 120, "stay_for_more": stay},
            tags=list(tags),
            created=utc_now() - timedelta(seconds=age_s),
            state_type=StateType.SCHEDULED if running_for is None else StateType.RUNNING,
            start_time=None if running_for is None else utc_now() - timedelta(seconds=running_for),
        )

    def client(*runs):
        return SimpleNamespace(read_flow_runs=lambda **kwargs: list(runs))

    DEPLOYMENT = uuid.uuid4()

    assert taking_merge_run(client(run("fresh", 5)), DEPLOYMENT) == "fresh"
    assert (
        taking_merge_run(client(run("stuck", QUEUED_RUN_TRUSTED_S + 60)), DEPLOYMENT) is None
    )  # no worker took it: announce
    assert taking_merge_run(client(run("single", 5, more=0)), DEPLOYMENT) is None  # takes only its own manifest
    assert (
        taking_merge_run(client(run("trial", 5, tags=[TRIAL_TAG])), DEPLOYMENT) is None
    )  # the breaker's trial: its own only
    assert taking_merge_run(client(run("stuck", QUEUED_RUN_TRUSTED_S + 60), run("fresh", 5)), DEPLOYMENT) == "fresh"
    # running: only one that stays for more, while over the margin of its 120 s is left (its later looks take it)
    assert taking_merge_run(client(run("staying", 30, running_for=20, stay=True)), DEPLOYMENT) == "staying"
    assert taking_merge_run(client(run("draining", 30, running_for=20)), DEPLOYMENT) is None  # its scan may be past
    ending = 120 - STAYING_RUN_MARGIN_S + 1
    assert taking_merge_run(client(run("ending", 200, running_for=ending, stay=True)), DEPLOYMENT) is None
    assert taking_merge_run(client(run("trial", 30, tags=[TRIAL_TAG], running_for=20, stay=True)), DEPLOYMENT) is None
