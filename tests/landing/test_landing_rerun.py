"""A listener that failed or crashed is rerun by its deployment's trigger (prefect.yaml), the new run scheduled
``schedule_after`` later, so a listener that fails at startup is rerun a few times a minute, not in a tight loop;
one that ended after its ``max_runtime_seconds`` (so the server's retention can delete its runs) is rerun at once."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from tests.helpers.crashpoints import REPO_ROOT

LISTENERS = ("ndjson_listen", "video_listen", "phspectra_listen", "records_listen")


def listener_deployments() -> list[dict]:
    """Every listener deployment of prefect.yaml (both sets), anchors resolved."""
    spec = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    return [d for d in spec["deployments"] if d["entrypoint"].split(":")[1] in LISTENERS]


def test_every_listener_is_rerun_on_crashed_or_failed_after_a_delay_under_a_minute():
    deployments = listener_deployments()
    assert sorted({d["entrypoint"].split(":")[1] for d in deployments}) == sorted(LISTENERS)
    for deployment in deployments:
        if deployment["name"] == "ecs":  # in AWS the listener's ECS service keeps one run going (ecs_listener.py)
            assert deployment["triggers"] == [], "a trigger would start a second listener beside the service's"
            continue
        trigger, ended = deployment["triggers"]
        assert ended["expect"] == ["prefect.flow-run.Completed"] and ended.get("schedule_after", 0) == 0
        assert ended["match_related"] == trigger["match_related"]
        assert 0 < deployment["parameters"]["max_runtime_seconds"] <= 86400  # ends, so retention can delete it
        assert trigger["expect"] == ["prefect.flow-run.Crashed", "prefect.flow-run.Failed"]
        assert trigger["match_related"]["prefect.resource.name"] == deployment["entrypoint"].split(":")[1].replace(
            "_", "-"
        )
        assert (trigger["threshold"], trigger.get("within", 0)) == (1, 0)  # every failure, none dropped
        assert 10 <= trigger["schedule_after"] <= 30, deployment["name"]  # no tight loop, back within a minute


@pytest.mark.sweep  # slow for make test; CI runs it in make test-sweep
def test_each_failure_of_a_listener_schedules_one_rerun_after_the_delay():
    """The records listener's trigger from prefect.yaml on the test server, for a flow of its own name (so other
    tests' listener runs leave it alone): each Failed run is followed by exactly one run, scheduled later."""
    from prefect.cli.deploy._triggers import _initialize_deployment_triggers
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.states import Completed, Failed, Running

    (specs,) = [
        d["triggers"] for d in listener_deployments() if d["name"] == "local" and "records_listen" in d["entrypoint"]
    ]
    delay = timedelta(seconds=specs[0]["schedule_after"])
    assert delay >= timedelta(seconds=10)
    flow_name = f"records-listen-{uuid.uuid4().hex[:8]}"
    specs = [{**spec, "match_related": {**spec["match_related"], "prefect.resource.name": flow_name}} for spec in specs]
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name(flow_name)
        deployment_id = client.create_deployment(flow_id, "local", entrypoint="flows/records.py:records_listen")
        for trigger in _initialize_deployment_triggers(f"{flow_name}/local", specs):
            trigger.set_deployment_id(deployment_id)
            client.create_automation(trigger.as_automation())
        only = DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        run = client.create_flow_run_from_deployment(deployment_id)
        for failure in range(2):  # it fails at startup, and its rerun fails too
            failed_at = datetime.now(UTC)
            client.set_flow_run_state(run.id, Failed(message="bad configuration"), force=True)
            deadline = time.monotonic() + 60
            while len(runs := client.read_flow_runs(deployment_filter=only)) < failure + 2:
                assert time.monotonic() < deadline, "no rerun within a minute of the failure"
                time.sleep(0.5)
            time.sleep(2)  # a second rerun for the same failure would have come by now
            runs = client.read_flow_runs(deployment_filter=only)
            assert len(runs) == failure + 2  # one rerun per failure, never two
            (rerun,) = [r for r in runs if r.state_type.value == "SCHEDULED"]
            assert (
                failed_at + delay - timedelta(seconds=1)
                <= rerun.next_scheduled_start_time
                <= failed_at + delay + timedelta(seconds=30)
            )
            run = rerun
        ended_at = datetime.now(UTC)  # the rerun listened for its max_runtime_seconds and ended
        client.set_flow_run_state(run.id, Running(), force=True)
        client.set_flow_run_state(run.id, Completed(), force=True)
        deadline = time.monotonic() + 60
        while len(runs := client.read_flow_runs(deployment_filter=only)) < 4:
            assert time.monotonic() < deadline, "no new run after the listener ended"
            time.sleep(0.5)
        (after_end,) = [r for r in runs if r.state_type.value == "SCHEDULED"]
        assert after_end.next_scheduled_start_time <= ended_at + timedelta(seconds=10)  # at once, not after the delay
