"""Seed 001's decoupled route and circuit breaker, Prefect-native: the ingest emits ``manifest.ready``, the merge
deployment's trigger (prefect.yaml) starts the merge; 3 merge failures in 300 s open the breaker (the merge
deployment paused, manifests wait ``pending``), one trial after the cool-down, closed on its success."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import datetime, timedelta

import pytest
import yaml

from tasks.etl import breaker
from tasks.etl import ingest as etl
from tasks.etl.breaker import CLOSED, HALF_OPEN, OPEN, BreakerState
from tasks.etl.ingest import ManifestRef
from tests.helpers.crashpoints import REPO_ROOT
from tests.helpers.etl import DAY, TODAY, records, write_input

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

T0 = "2026-01-05T10:00:00+00:00"


def at(seconds: float) -> str:
    """``T0`` plus ``seconds``, as the breaker's timestamps are written."""
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


def test_the_breaker_needs_a_check_at_its_cool_downs_end_not_on_a_clock():
    """Issue 52: no check every minute. OPEN: one at the cool-down's end; past it with nothing waiting, one within the
    next minute (on the minute, so checks asked at different moments share one); HALF_OPEN: one when its trial
    would count as lost; CLOSED, or a trial past that (its run's end triggers the check): none."""

    def due(state, now):
        found = breaker.next_check_at(state, at(now), 300)
        return found and (datetime.fromisoformat(found) - datetime.fromisoformat(T0)).total_seconds()

    opened = breaker.tripped(BreakerState(), at(0), "3 merge runs failed within 300 s")
    assert due(opened, 1) == due(opened, 299) == 300
    assert due(opened, 301) == due(opened, 359.5) == 360  # 10:05:01 + 60 s, on its minute: 10:06:00
    trial, _ = breaker.decide(opened, at(301), 300, None, REF_A)
    assert due(trial, 302) == 601 and due(trial, 602) is None
    assert due(BreakerState(), 0) is None
    unreadable, _ = breaker.parse("garbage")  # OPEN with its cool-down over: within the next minute
    assert due(unreadable, 0.5) == 60


@pytest.mark.parametrize(
    "saved",
    [
        "OPEN",
        ["OPEN"],
        {"state": "open"},
        {"trips": 2},
        {"state": "OPEN", "opened_at": "yesterday"},
        {"state": "HALF_OPEN", "trial_manifest": 7},
        {"state": "CLOSED", "trips": "2"},
    ],
)
def test_a_breaker_variable_edited_into_something_unreadable_reads_open_with_its_cool_down_over(saved):
    state, problem = breaker.parse(saved)
    assert problem and (state.state, state.opened_at) == (OPEN, None) and "unreadable" in state.reason
    assert breaker.decide(state, at(0), 300, None, REF_A)[0].state == HALF_OPEN  # the next check: one trial


def test_a_missing_breaker_variable_reads_closed_and_fields_it_does_not_know_are_ignored():
    assert breaker.parse(None) == (BreakerState(), "")
    state, problem = breaker.parse({"state": OPEN, "opened_at": at(0), "trips": 1, "note": "by hand"})
    assert (state, problem) == (BreakerState(OPEN, opened_at=at(0), trips=1), "")


def _merge_deployment(prefix: str) -> str:
    """A deployment of a flow named ndjson-merge on the test server (no worker, no trigger): its ``flow/name``."""
    from prefect import flow as prefect_flow
    from prefect.client.orchestration import get_client

    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(prefect_flow(name="ndjson-merge")(lambda: None))
        client.create_deployment(flow_id=flow_id, name=name, paused=False)
    return f"ndjson-merge/{name}"


def _set_paused_by_hand(deployment: str, paused: bool) -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        found = client.read_deployment_by_name(deployment)
        (client.pause_deployment if paused else client.resume_deployment)(found.id)


def test_every_check_makes_the_pause_follow_the_breaker_whatever_was_done_to_its_variable(etl_env):
    """Issue 42 item 9: the variable deleted while OPEN reads CLOSED: the check resumes the deployment and announces
    the manifest held meanwhile; edited into garbage it reads OPEN (saved readable, paused, one trial); a deployment
    resumed by hand while the breaker is not CLOSED is paused again; a long pause is a CRITICAL alarm."""
    from prefect.variables import Variable

    from blocks.health import HealthThresholds
    from flows.etl import ndjson_ingest
    from tasks.etl import alarms

    root = etl_env["root"]
    merge = _merge_deployment("reconcile")
    assert breaker.step(merge, "trip", reason="3 merge runs failed")["state"] == OPEN and _paused(merge)
    urls = [write_input(root, DAY, f"rc-{i}.ndjson", [{"id": i, "pad": "x" * 40}]) for i in range(5)]
    held = ndjson_ingest(file_urls=urls, merge_deployment=merge)
    assert (held["launched"], held["held"]) == (0, 1)
    (manifest,) = held["manifests"]

    Variable.unset(breaker.variable_name(merge))  # deleted by hand while OPEN
    check = breaker.step(merge, "check", announce_after_s=0)
    assert not _paused(merge)  # read CLOSED: resumed
    assert (check["before"], check["state"], check["resumed"], check["announced"]) == (CLOSED, CLOSED, True, [manifest])
    assert merge not in alarms.paused_merge_deployments()

    Variable.set(breaker.variable_name(merge), "garbage", overwrite=True)  # edited into something unreadable
    assert breaker.admits(breaker.load(merge), DAY, manifest) is False  # read OPEN: merges held at once
    check = breaker.step(merge, "check")  # OPEN with its cool-down over and a manifest waiting: the trial
    assert (check["before"], check["state"], check["trial_manifest"]) == (OPEN, HALF_OPEN, manifest)
    assert _paused(merge) and breaker.read(merge)[1] == ""  # saved readable

    _set_paused_by_hand(merge, False)  # resumed by hand while HALF_OPEN
    assert breaker.step(merge, "check")["state"] == HALF_OPEN and _paused(merge)

    # a long pause alarms (threshold 0 here), naming the deployment and its breaker
    time.sleep(1.1)
    alarm = alarms.etl_merge_paused(HealthThresholds(merge_paused_minutes=0))
    assert alarm.firing and alarm.severity == "CRITICAL" and alarm.value >= 1
    assert f"{merge} paused" in alarm.detail and "breaker HALF_OPEN" in alarm.detail
    assert not alarms.etl_merge_paused(HealthThresholds(merge_paused_minutes=60)).firing or (
        alarms.paused_merge_deployments()[merge] < 60  # other tests' deployments on the shared server may be old
    )


def _breaker_deployment(merge_deployment: str) -> str:
    """A deployment of a flow named ndjson-merge-breaker beside ``merge_deployment`` (no worker): its ``flow/name``."""
    from prefect import flow as prefect_flow
    from prefect.client.orchestration import get_client

    name = merge_deployment.split("/")[1]
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(prefect_flow(name="ndjson-merge-breaker")(lambda: None))
        client.create_deployment(flow_id=flow_id, name=name, paused=False)
    return f"ndjson-merge-breaker/{name}"


def test_a_trip_schedules_one_check_at_its_cool_downs_end_on_the_breakers_own_deployment(etl_env):
    """Issue 52: the breaker's deployment runs no check every minute; the trip schedules the one check that starts
    the trial, at the cool-down's end. Asked again (a check during the cool-down, the trip's run retried) it is the
    same run; a second trip restarts the cool-down and its own check, and the first one, due first, adds none."""
    from tasks.core.runtime import now_iso

    merge = _merge_deployment("scheduled")
    guard = _breaker_deployment(merge)
    trip = breaker.step(merge, "trip", reason="3 merge runs failed", check_deployment=guard)
    due = now_iso(datetime.fromisoformat(trip["opened_at"]) + timedelta(seconds=breaker.COOL_DOWN_S))
    assert (trip["state"], trip["next_check"]) == (OPEN, due)
    (run,) = _runs(guard)
    assert str(run.id) == trip["next_check_run"] and run.state.is_scheduled()
    assert run.state.state_details.scheduled_time.timestamp() == datetime.fromisoformat(due).timestamp()
    assert run.parameters == {
        "merge_deployment": merge,
        "action": "check",
        "cool_down_seconds": breaker.COOL_DOWN_S,
        "check_at": due,
    }
    assert breaker.schedule_check(guard, merge, breaker.COOL_DOWN_S, due) == str(run.id)  # the trip's run retried
    check = breaker.step(merge, "check", check_deployment=guard)  # e.g. a merge run cancelled meanwhile
    assert (check["state"], check["next_check_run"]) == (OPEN, str(run.id)) and len(_runs(guard)) == 1

    again = breaker.step(merge, "trip", reason="more failures", check_deployment=guard)
    assert again["next_check"] > due and len(_runs(guard)) == 2
    first_due = breaker.step(merge, "check", check_deployment=guard, check_at=due)  # run early: waits, adds none
    assert first_due["next_check_run"] == again["next_check_run"] and len(_runs(guard)) == 2
    assert breaker.step(merge, "check", cool_down_s=0, check_deployment=guard)["state"] == OPEN  # nothing waits
    assert len(_runs(guard)) == 3  # past the cool-down with nothing waiting: one check within the next minute


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
    trip, trial, announce = guard["triggers"]
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
    # a merge run that ended Cancelled/Crashed (maybe queued, with manifests left to it): a check announces them
    assert set(announce["expect"]) == {"prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"}
    assert announce["match_related"] == trip["match_related"]
    assert (announce["threshold"], announce["parameters"]["action"]) == (1, "check")
    assert announce["parameters"]["announce_after_seconds"] == 0  # the run they were left to is gone
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


def _trips(deployment: str) -> list:
    return [r for r in _runs(deployment) if r.parameters.get("action") == "trip"]


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
            lambda: (r := _trips(guard)) and all(x.state.is_final() for x in r) and r,
            worker=worker,
        )
        assert trip.state_name == "Completed", worker.tail()
        (scheduled,) = [r for r in _runs(guard) if r.parameters.get("check_at")]  # the trip's check, 300 s on
        assert scheduled.parameters["check_at"] == breaker.next_check_at(opened, opened.opened_at, breaker.COOL_DOWN_S)

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
        assert sorted((r.parameters["action"], r.state_name) for r in _runs(guard) if r.id != scheduled.id) == [
            ("check", "Completed"),
            ("trip", "Completed"),
        ]
    finally:
        worker.stop()


def _left_to_a_queued_run(etl_env, merge: str, prefix: str) -> tuple[str, list[str]]:
    """Two batches for ``merge``: the first announced, its run (queued: no worker takes it) made, the second left to
    that run without an event. The queued run's id and both manifests."""
    from prefect.client.orchestration import get_client

    from flows.etl import ndjson_ingest

    root = etl_env["root"]
    manifests = []
    run_id = None
    for batch in range(2):
        urls = [
            write_input(root, DAY, f"{prefix}{batch}-{i}.ndjson", [{"id": f"{batch}{i}", "pad": "x" * 40}])
            for i in range(5)
        ]
        summary = ndjson_ingest(file_urls=urls, merge_deployment=merge)
        assert summary["launched"] == 1
        manifests += summary["manifests"]
        if run_id is None:
            run_id = _wait("the announced merge's run", lambda: _runs(merge) and str(_runs(merge)[0].id), timeout=60)
    with get_client(sync_client=True) as client:
        assert etl.taking_merge_run(client, client.read_deployment_by_name(merge).id) == run_id
    return run_id, manifests


def _cancel(run_id: str) -> None:
    """Cancel a flow run that has not started (as the UI's Cancel does: straight to Cancelled)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Cancelled(message="cancelled by hand"), force=True)


def test_a_check_announces_the_manifests_a_cancelled_queued_run_was_left(etl_env):
    """Issue 42 item 10, the check itself: the queued run the ingest left a manifest to is cancelled; the next check
    (prefect.yaml: at once on the cancel, and every minute) announces what is pending, and never while a queued run
    will take it."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.events.worker import EventsWorker

    merge = _merge_deployment("cancelled")
    with get_client(sync_client=True) as client:  # what the trigger makes of manifest.ready: a queued run
        deployment_id = client.read_deployment_by_name(merge).id
        run = client.create_flow_run_from_deployment(deployment_id, parameters={"more_manifests": 500})
    urls = [write_input(etl_env["root"], DAY, f"q-{i}.ndjson", [{"id": i, "pad": "x" * 40}]) for i in range(5)]
    from flows.etl import ndjson_ingest

    (manifest,) = ndjson_ingest(file_urls=urls, merge_deployment=merge)["manifests"]  # left to the queued run
    assert breaker.step(merge, "check", announce_after_s=0)["announced"] == []  # the queued run will take it
    _cancel(str(run.id))
    assert breaker.step(merge, "check")["announced"] == []  # the schedule's check: not pending 30 s yet
    check = breaker.step(merge, "check", announce_after_s=0)  # the check the cancel triggers
    assert (check["state"], check["announced"]) == (CLOSED, [manifest])
    EventsWorker.drain_all()
    wanted = EventFilter(
        event=EventNameFilter(name=[etl.MANIFEST_READY]),
        resource=EventResourceFilter(id=[f"etl.manifest.{DAY}.{manifest}"]),
    )
    with get_client(sync_client=True) as client:
        assert _wait("its manifest.ready", lambda: client.read_events(filter=wanted, limit=10).events, timeout=30)


@pytest.mark.sweep  # a worker, the triggers and three flow-run processes: `make test-sweep`
@pytest.mark.timeout(600)
def test_manifests_left_to_a_queued_run_that_is_cancelled_are_merged_within_a_minute_without_the_flush(
    etl_env, tmp_path
):
    """Issue 42 item 10, as deployed: the queued merge run two batches were left to is cancelled; the cancel's
    trigger runs the breaker's check, which announces them; a merge run takes both, within a minute, and no flush
    runs (its deployment is not even deployed)."""
    from tests.helpers.etl import file_statuses, merged_rows
    from tests.helpers.prefect_runs import Worker, deploy_from_prefect_yaml

    name = f"cancel-{uuid.uuid4().hex[:6]}"
    pool = f"pool-{name}"
    deployed = deploy_from_prefect_yaml(tmp_path, {"ndjson-merge", "ndjson-merge-breaker"}, pool, name)
    merge = deployed["ndjson-merge"]
    queued, manifests = _left_to_a_queued_run(etl_env, merge, "c")
    _cancel(queued)
    cancelled_at = time.monotonic()
    worker = Worker(pool, tmp_path / "worker.log")
    try:
        _wait("both manifests merged", lambda: file_statuses(etl_env["table"]) == {"completed": 10}, 120, worker)
        took = time.monotonic() - cancelled_at
        statuses = {k[1]: v["status"] for k, v in records(etl_env["table"]).items() if k[1].startswith("MANIFEST#")}
        assert sorted(statuses.values()) == ["completed", "completed"] and len(manifests) == 2
        ids = Counter(row["id"] for row in merged_rows(etl_env["root"]))
        assert sum(ids.values()) == 10 and set(ids.values()) == {1}  # each line merged once
        print(f"merged {took:.0f} s after the cancel")
        assert took < 60, f"merged {took:.0f} s after the cancel\n{worker.tail()}"
        checks = _runs(deployed["ndjson-merge-breaker"])
        assert [(r.parameters["action"], r.state_name) for r in checks] == [("check", "Completed")], worker.tail()
    finally:
        worker.stop()


@pytest.mark.sweep  # a worker, the breaker's runs and a trial merge run: `make test-sweep`
@pytest.mark.timeout(600)
def test_the_trips_own_check_starts_the_trial_seconds_after_the_cool_downs_end(etl_env, tmp_path):
    """Issue 52, as deployed and with no schedule at all: a trip (its cool-down 20 s here) schedules its check; the
    worker runs it when due (never early: a worker prefetches due runs) and it starts the trial within seconds of
    the cool-down's end; the trial's end closes the breaker."""
    from prefect.deployments import run_deployment

    from flows.etl import ndjson_ingest
    from tests.helpers.etl import file_statuses
    from tests.helpers.prefect_runs import Worker, deploy_from_prefect_yaml

    name = f"due-{uuid.uuid4().hex[:6]}"
    pool = f"pool-{name}"
    deployed = deploy_from_prefect_yaml(tmp_path, {"ndjson-merge", "ndjson-merge-breaker"}, pool, name)
    merge, guard = deployed["ndjson-merge"], deployed["ndjson-merge-breaker"]
    _set_paused_by_hand(merge, True)  # held from the start, so the trial's manifest waits before the trip
    urls = [write_input(etl_env["root"], DAY, f"d-{i}.ndjson", [{"id": i, "pad": "x" * 40}]) for i in range(5)]
    assert ndjson_ingest(file_urls=urls, merge_deployment=merge)["held"] == 1
    worker = Worker(pool, tmp_path / "worker.log")
    try:
        parameters = {"merge_deployment": merge, "action": "trip", "cool_down_seconds": 20, "reason": "by hand"}
        run_deployment(guard, parameters=parameters, timeout=0)
        opened = _wait("the breaker open", lambda: (s := breaker.load(merge)).state == OPEN and s, worker=worker)
        (trial,) = _wait("the trial run", lambda: _runs(merge, breaker.TRIAL_TAG), timeout=120, worker=worker)
        late = (trial.created - datetime.fromisoformat(opened.opened_at)).total_seconds() - 20
        print(f"trial run created {late:.1f} s after the cool-down's end")
        assert 0 <= late < 30, worker.tail()
        _wait("the breaker closed", lambda: breaker.load(merge).state == CLOSED, timeout=240, worker=worker)
        _wait("the manifest merged", lambda: file_statuses(etl_env["table"]) == {"completed": 5}, worker=worker)
        # the checks: the one due at the cool-down's end, the trial's end's, and the HALF_OPEN step's own (due when
        # a trial would count as lost: it finds the breaker CLOSED)
        runs = _wait(
            "every breaker run ended", lambda: (r := _runs(guard)) and all(x.state.is_final() for x in r) and r
        )
        assert {r.state_name for r in runs} == {"Completed"}, worker.tail()
        due = breaker.next_check_at(opened, opened.opened_at, 20)
        assert [r.parameters.get("check_at") == due for r in runs].count(True) == 1
    finally:
        worker.stop()
