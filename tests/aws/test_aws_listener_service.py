"""One listener per landing place in AWS, and a health check that tells the truth there: a listener's ECS service
task runs its ecs deployment's own run (deployments/ecs_listener.py), so ``landing-listener-not-running`` sees it
live; a run its dead predecessor left live is marked Crashed, so no second listener and no cancelled new one.
(`prefect flow-run execute` itself, which the task then becomes, is Prefect's; no container runs here.)
"""

from __future__ import annotations

import types
import uuid

import pytest

from deployments import ecs_listener

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


@pytest.fixture
def listener_deployment(monkeypatch):
    """A listener flow (a name of its own) with an ecs deployment on the test server; the health check's landing
    places are that flow only."""
    from prefect.client.orchestration import get_client

    from tasks.health import listeners

    flow_name = f"toy-listen-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name(flow_name)
        deployment_id = client.create_deployment(flow_id=flow_id, name="ecs", entrypoint="flows/etl.py:ndjson_listen")
    monkeypatch.setattr(listeners, "places", lambda: {"toy": types.SimpleNamespace(flow=flow_name)})
    return flow_name, deployment_id


def test_the_service_task_runs_the_deployments_own_run_and_takes_over_from_a_dead_one(listener_deployment):
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from blocks.health import HealthThresholds
    from tasks.health.listeners import listeners_not_running

    flow_name, deployment_id = listener_deployment
    limits = HealthThresholds()
    assert listeners_not_running(limits).value == 1  # deployed, nothing listening yet
    with get_client(sync_client=True) as client:  # the previous task's run, left Running when its task died
        stale = client.create_flow_run_from_deployment(deployment_id)
        client.set_flow_run_state(stale.id, Running(), force=True)

    run_id = ecs_listener.start_run(f"{flow_name}/ecs", attempts=1)
    with get_client(sync_client=True) as client:
        run, old = client.read_flow_run(run_id), client.read_flow_run(stale.id)
    assert run.deployment_id == deployment_id and run.state.is_pending()  # Pending: no worker takes it
    assert old.state.is_crashed() and "ECS service task is gone" in old.state.message
    assert listeners_not_running(limits).value == 0  # the service's run is the deployment's: the check sees it

    again = ecs_listener.start_run(f"{flow_name}/ecs", attempts=1)  # the task died and ECS started another
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run_id).state.is_crashed()
        assert client.read_flow_run(again).state.is_pending()


def test_a_task_started_before_its_deployment_exists_waits_for_it(tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from tasks.landing.heartbeat import HEARTBEAT_VARIABLE

    with pytest.raises(ObjectNotFound):
        ecs_listener.start_run(f"no-such-listen-{uuid.uuid4().hex[:6]}/ecs", attempts=1)
    beat = tmp_path / "listener-heartbeat"
    monkeypatch.setenv(HEARTBEAT_VARIABLE, str(beat))
    with get_client(sync_client=True) as client, pytest.raises(ObjectNotFound):
        ecs_listener.read_deployment(client, f"no-such-listen-{uuid.uuid4().hex[:6]}/ecs", wait_s=0, attempts=2)
    assert beat.exists()  # waiting for `prefect deploy` keeps the container healthy
    with pytest.raises(SystemExit, match="usage"):
        ecs_listener.main(["no-slash"])
