"""Seed 001's decoupled route and circuit breaker, Prefect-native: the ingest emits ``manifest.ready``, the merge
deployment's trigger (prefect.yaml) starts the merge; 3 merge failures in 300 s open the breaker (the merge
deployment paused, manifests wait ``pending``), one trial after the cool-down, closed on its success."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest
import yaml

from tasks.etl import breaker
from tasks.etl import ingest as etl
from tasks.etl.breaker import CLOSED, HALF_OPEN, OPEN, BreakerState
from tasks.etl.ingest import ManifestRef
from tests.helpers.crashpoints import REPO_ROOT
from tests.helpers.etl import DAY, TODAY, records, write_input

T0 = "2026-01-05T10:00:00+00:00"


def at(seconds: float) -> str:
    """``T0`` plus ``seconds``, as the breaker's timestamps are written."""
    from datetime import datetime, timedelta

    return (datetime.fromisoformat(T0) + timedelta(seconds=seconds)).isoformat()


REF_A = ManifestRef(DAY, "batch-0001-a.json", "file:///m/a.json", 5)


def test_the_breaker_opens_holds_tries_once_after_the_cool_down_and_closes_on_success():
    closed = BreakerState()
    assert breaker.admits(closed, DAY, "any.json")
    opened = breaker.tripped(closed, at(0), "3 merge runs failed within 300 s")
    assert (opened.state, opened.opened_at, opened.trips) == (OPEN, at(0), 1)
    assert not breaker.admits(opened, DAY, REF_A.manifest_name)  # OPEN: every merge held

    # before the cool-down nothing moves, with or without a waiting manifest
    assert breaker.decide(opened, at(299), 300, None, REF_A) == (opened, None)
    # after it, with nothing waiting: stays OPEN (the next manifest to arrive is the trial)
    assert breaker.decide(opened, at(301), 300, None, None) == (opened, None)
    trial, action = breaker.decide(opened, at(301), 300, None, REF_A)
    assert (trial.state, action, trial.trial_date, trial.trial_manifest) == (
        HALF_OPEN,
        "start_trial",
        DAY,
        REF_A.manifest_name,
    )
    assert breaker.admits(trial, DAY, REF_A.manifest_name) and not breaker.admits(trial, DAY, "other.json")  # one trial

    # the trial still running or waiting its run: nothing; its run lost (pending a whole cool-down): started again
    assert breaker.decide(trial, at(320), 300, etl.PROCESSING, None) == (trial, None)
    assert breaker.decide(trial, at(320), 300, etl.PENDING, None) == (trial, None)
    again, action = breaker.decide(trial, at(602), 300, etl.PENDING, None)
    assert (again.state, action, again.trial_started_at) == (HALF_OPEN, "start_trial", at(602))

    # success closes; failure (or a trial manifest gone) opens again, the cool-down from now
    done, action = breaker.decide(trial, at(330), 300, etl.COMPLETED, None)
    assert (done.state, action, done.trips) == (CLOSED, "close", 1) and breaker.admits(done, DAY, "any.json")
    for status in (etl.FAILED, None):
        reopened, action = breaker.decide(trial, at(330), 300, status, REF_A)
        assert (reopened.state, reopened.opened_at, reopened.trips, action) == (OPEN, at(330), 2, None)
        assert breaker.decide(reopened, at(600), 300, None, REF_A)[0].state == OPEN  # 270 s: still cooling down

    # a trip while HALF_OPEN (failures elsewhere) opens it again too; a CLOSED check changes nothing
    assert breaker.tripped(trial, at(340), "again").state == OPEN
    assert breaker.decide(closed, at(999), 300, None, REF_A) == (closed, None)
    assert breaker.variable_name("ndjson-merge/local") == "etl-merge-breaker-ndjson-merge-local"


def _deployments(name: str) -> dict[str, dict]:
    config = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    return {d["entrypoint"].split(":")[1]: d for d in config["deployments"] if d["name"] == name}


@pytest.mark.parametrize("name", ["local", "ecs"])
def test_prefect_yaml_starts_merges_from_manifest_ready_and_trips_the_breaker_at_the_seeds_numbers(name):
    deployments = _deployments(name)
    (ready,) = deployments["ndjson_merge"]["triggers"]
    assert ready["expect"] == [etl.MANIFEST_READY]
    assert ready["match"] == {"prefect.resource.id": "etl.manifest.*", "etl.merge-deployment": f"ndjson-merge/{name}"}
    assert ready["parameters"] == {
        "date_prefix": "{{ event.payload.date_prefix }}",
        "manifest_name": "{{ event.payload.manifest_name }}",
    }
    event = etl.manifest_ready(REF_A, f"ndjson-merge/{name}")  # what the ingest emits matches that trigger
    assert event["resource"]["etl.merge-deployment"] == ready["match"]["etl.merge-deployment"]
    assert (
        event["resource"]["prefect.resource.id"].startswith("etl.manifest.")
        and event["payload"]["manifest_name"] == REF_A.manifest_name
    )

    guard = deployments["ndjson_merge_breaker"]
    assert guard["concurrency_limit"] == {"limit": 1, "collision_strategy": "ENQUEUE"} and guard["schedules"]
    trip, trial = guard["triggers"]
    assert (trip["threshold"], trip["within"], trip["parameters"]["action"]) == (
        3,
        300,
        "trip",
    )  # seed: 3 failures, 300 s
    assert set(trip["expect"]) == {"prefect.flow-run.Failed", "prefect.flow-run.Crashed", "prefect.flow-run.TimedOut"}
    assert {"prefect.resource.role": "deployment", "prefect.resource.name": name} in trip["match_related"]
    assert {"prefect.resource.role": "flow", "prefect.resource.name": "ndjson-merge"} in trip["match_related"]
    assert {"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{breaker.TRIAL_TAG}"} in trial[
        "match_related"
    ]
    assert (trial["threshold"], trial["parameters"]["action"]) == (1, "check")
    assert {t["parameters"]["merge_deployment"] for t in guard["triggers"]} == {f"ndjson-merge/{name}"}


def test_the_ecs_set_has_the_seeds_capacity_and_every_fan_out_flow_a_cap():
    ecs, local = _deployments("ecs"), _deployments("local")
    assert (
        ecs["ndjson_ingest"]["concurrency_limit"]["limit"] == 50
    )  # seed 001 prod: manifest builder reserved concurrency
    assert ecs["ndjson_merge"]["concurrency_limit"]["limit"] == 30  # seed 001 prod: Glue max concurrent runs
    fan_out = ("phspectra_survey", "video_process", "video_reassemble", "gpu_job", "gpu_healthcheck", "records_ingest")
    for flow in fan_out:
        for deployments in (ecs, local):
            assert deployments[flow]["concurrency_limit"]["collision_strategy"] == "ENQUEUE", (
                flow
            )  # waits, never dropped
            assert deployments[flow]["concurrency_limit"]["limit"] >= 1, flow


def test_the_ingest_announces_manifests_and_holds_them_while_the_merge_deployment_is_paused(etl_env):
    """The launcher on the test server: ``manifest.ready`` emitted (as the trigger reads it) for a deployment that
    exists; none, and the manifest left pending, while it is paused; a missing deployment is a launch failure."""
    from prefect import flow as prefect_flow
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.events.worker import EventsWorker

    from flows.etl import ndjson_ingest

    root, table = etl_env["root"], etl_env["table"]
    name = f"announce-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(prefect_flow(name="ndjson-merge")(lambda: None))
        deployment_id = client.create_deployment(flow_id=flow_id, name=name, paused=False)
    deployment = f"ndjson-merge/{name}"

    urls = [write_input(root, DAY, f"ann-{i}.ndjson", [{"id": i, "pad": "x" * 40}]) for i in range(5)]
    summary = ndjson_ingest(file_urls=urls, merge_deployment=deployment)
    assert (summary["launched"], summary["held"], summary["launch_failures"]) == (1, 0, 0)
    (manifest,) = summary["manifests"]
    EventsWorker.drain_all()
    wanted = EventFilter(
        event=EventNameFilter(name=[etl.MANIFEST_READY]),
        resource=EventResourceFilter(id=[f"etl.manifest.{DAY}.{manifest}"]),
    )
    with get_client(sync_client=True) as client:
        for _ in range(100):
            if events := client.read_events(filter=wanted, limit=10).events:
                break
            time.sleep(0.2)
    (event,) = events
    assert event.resource["etl.merge-deployment"] == deployment
    assert (event.payload["date_prefix"], event.payload["manifest_name"], event.payload["file_count"]) == (
        DAY,
        manifest,
        5,
    )

    with get_client(sync_client=True) as client:
        client.pause_deployment(deployment_id)  # what the open breaker does
    more = [write_input(root, DAY, f"held-{i}.ndjson", [{"id": 10 + i, "pad": "x" * 40}]) for i in range(5)]
    held = ndjson_ingest(file_urls=more, merge_deployment=deployment)
    assert (held["launched"], held["held"], held["launch_failures"]) == (0, 1, 0)
    statuses = {k[1]: v["status"] for k, v in records(table).items() if k[1].startswith("MANIFEST#")}
    assert Counter(statuses.values()) == {"pending": 2}  # nothing merged here (no worker): both wait, none lost
    missing = ndjson_ingest(
        file_urls=[write_input(root, DAY, f"x-{i}.ndjson", [{"id": 20 + i, "pad": "x" * 40}]) for i in range(5)],
        merge_deployment="ndjson-merge/not-deployed",
    )
    assert (missing["launched"], missing["held"], missing["launch_failures"]) == (0, 0, 1)


# --------------------------------------------------------------------------- on a real server, with a worker


def _wait(what, predicate, timeout: float = 180, worker=None):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s\n{worker.tail() if worker else ''}")
        time.sleep(1)
    return value


def _runs(deployment: str, tag: str | None = None) -> list:
    """The flow runs of ``deployment`` (with ``tag`` when given)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter, FlowRunFilterTags

    with get_client(sync_client=True) as client:
        found = client.read_deployment_by_name(deployment)
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[found.id])),
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag])) if tag else None,
        )


def _paused(deployment: str) -> bool:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return bool(client.read_deployment_by_name(deployment).paused)


@pytest.mark.sweep  # a worker, two triggers and about ten flow-run processes: `make test-sweep`
@pytest.mark.timeout(900)
def test_three_failed_merges_open_the_breaker_manifests_wait_and_a_trial_after_the_cool_down_closes_it(
    etl_env, tmp_path
):
    from deployments.cli import main as cli
    from flows.etl import ndjson_flush_orphans, ndjson_ingest, ndjson_merge_breaker
    from tests.helpers.etl import file_statuses, merged_rows
    from tests.helpers.prefect_runs import Worker, deploy_from_prefect_yaml

    root, table = etl_env["root"], etl_env["table"]
    name = f"breaker-{uuid.uuid4().hex[:6]}"
    pool = f"pool-{name}"
    deployed = deploy_from_prefect_yaml(tmp_path, {"ndjson-merge", "ndjson-merge-breaker"}, pool, name)
    merge = deployed["ndjson-merge"]
    # every merge fails at its second write (a part of the merge): the crash-point injector in raise mode
    worker = Worker(pool, tmp_path / "worker-faulty.log", {"PIPELINES_FAULT": "2:raise:before"})
    try:
        failing = [
            write_input(root, DAY, f"f-{i:02d}.ndjson", [{"id": f"f{i}-{k}"} for k in range(3)]) for i in range(15)
        ]
        first = ndjson_ingest(file_urls=failing, merge_deployment=merge)
        # one manifest.ready for the batch; a failing manifest ends its run, which announces the next: three failed runs
        assert (len(first["manifests"]), first["launched"]) == (3, 3)
        runs = _wait(
            "three failed merges",
            lambda: (r := _runs(merge)) and len(r) == 3 and all(x.state.is_final() for x in r) and r,
            worker=worker,
        )
        assert [r.state_name for r in runs] == ["Failed"] * 3, worker.tail()
        opened = _wait("the breaker open", lambda: (s := breaker.load(merge)).state == OPEN and s, worker=worker)
        assert "3 merge runs failed within 300 s" in opened.reason and _wait(
            "merge deployment paused", lambda: _paused(merge)
        )
        guard = deployed["ndjson-merge-breaker"]
        (trip,) = _wait(
            "the trip run ended",
            lambda: (r := _runs(guard)) and all(x.state.is_final() for x in r) and r,
            worker=worker,
        )
        assert trip.parameters["action"] == "trip" and trip.state_name == "Completed", worker.tail()

        # while OPEN: new manifests wait pending; a merge run queued before the open leaves its manifest pending
        waiting = [
            write_input(root, DAY, f"w-{i:02d}.ndjson", [{"id": f"w{i}-{k}"} for k in range(3)]) for i in range(10)
        ]
        second = ndjson_ingest(file_urls=waiting, merge_deployment=merge)
        assert (len(second["manifests"]), second["launched"], second["held"]) == (2, 0, 2)
        worker.stop()
        worker = Worker(pool, tmp_path / "worker.log")  # the cause is fixed
        from prefect.deployments import run_deployment

        late = run_deployment(
            merge, parameters={"date_prefix": DAY, "manifest_name": second["manifests"][1]}, timeout=180
        )
        assert late.state.is_completed(), worker.tail()  # held by the breaker: completed without taking it
        pending = {k[1] for k, v in records(table).items() if k[1].startswith("MANIFEST#") and v["status"] == "pending"}
        assert len(pending) == 2 and file_statuses(table) == {"failed": 15, "manifested": 10}
        assert len(_runs(merge)) == 4

        # the cool-down over (the schedule's check; here called at once with no cool-down left): one trial
        check = ndjson_merge_breaker(merge_deployment=merge, action="check", cool_down_seconds=0)
        assert (check["before"], check["state"], check["trial_manifest"]) == (
            OPEN,
            HALF_OPEN,
            sorted(second["manifests"])[0],
        )
        # the trial's end triggers the check that closes the breaker, resumes the deployment, starts what waited
        closed = _wait(
            "the breaker closed", lambda: (s := breaker.load(merge)).state == CLOSED and s, timeout=240, worker=worker
        )
        assert "completed" in closed.reason and not _paused(merge)
        (trial,) = _runs(merge, breaker.TRIAL_TAG)
        assert trial.state_name == "Completed"
        _wait(
            "the waiting manifests merged",
            lambda: file_statuses(table) == {"failed": 15, "completed": 10},
            worker=worker,
        )

        # nothing lost: the failed files reprocessed and flushed through the same route, each line exactly once
        assert cli(["etl", "reprocess", "--date", DAY]) == 0
        assert ndjson_flush_orphans(today=TODAY, merge_deployment=merge)["launched"] == 3
        _wait("every file completed", lambda: file_statuses(table) == {"completed": 25}, worker=worker)
        ids = Counter(row["id"] for row in merged_rows(root))
        assert sum(ids.values()) == 25 * 3 and set(ids.values()) == {1}
        assert sorted((r.parameters["action"], r.state_name) for r in _runs(guard)) == [
            ("check", "Completed"),
            ("trip", "Completed"),
        ]
    finally:
        worker.stop()
