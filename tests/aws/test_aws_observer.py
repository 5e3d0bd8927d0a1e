"""Crash detection in AWS: a flow-run task that stops with a failed container has its run marked Crashed by
prefect-aws's ECS observer, fed by the template's EventBridge rule and queue.

On moto's server: the stack is deployed as the one command deploys it; a flow run is Running on the test's Prefect
server; its ECS task, tagged as prefect-aws tags it, runs on the stack's cluster and is stopped. moto's ECS emits no
events, so the test puts on EventBridge the "ECS Task State Change" event ECS sends for it (its fields as AWS
documents them, the container's exit code 137 of a killed process); from there it is the real path: the template's
rule matches it (moto's EventBridge evaluates the rule's pattern, the cluster ARN included) and sends it to the
template's queue, and prefect-aws's observer, configured by the worker task definition's own environment, reads it,
reads the task's tags (DescribeTasks) and proposes Crashed to the Prefect server. The run is one of the merge
deployment, and the Crashed state's event fires prefect.yaml's trigger on it (the breaker's announce trigger, the
ecs breaker's own but for the deployment's name), deployed with `prefect deploy`: the test server's trigger and
action services create the breaker's run with the trigger's parameters. Not shown here: the queue policy (moto's
CloudFormation does not apply it; tests/aws/test_aws_policies.py covers the worker's side) and ECS's own event.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import yaml

from infra import cloudformation as cfn
from tests.helpers.aws_stack import deploy_template, stack_parameters
from tests.helpers.prefect_runs import _to_copies, deploy_from_prefect_yaml, wait_for

FLOW_RUN_TAG = "prefect.io/flow-run-id"  # prefect-aws's tag on every task it runs (ECSWorker)


@pytest.fixture
def cloud(s3_endpoint, monkeypatch):
    """boto3 and aiobotocore pointed at moto's server for every service but DynamoDB (DynamoDB Local)."""
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return boto3.Session(region_name="us-east-1")


def running_flow_run(deployment: str | None = None, parameters: dict | None = None):
    """A flow run in Running on the test's Prefect server: of ``deployment`` (``flow/name``) when given."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    @flow(name="ecs-observed")
    def observed() -> None:
        """A flow whose run an ECS task runs."""

    with get_client(sync_client=True) as client:
        if deployment:
            deployment_id = client.read_deployment_by_name(deployment).id
            run = client.create_flow_run_from_deployment(deployment_id, parameters=parameters)
        else:
            run = client.create_flow_run(observed)
        client.set_flow_run_state(run.id, Running(), force=True)
        return run.id


def breaker_triggers(name: str) -> list[dict]:
    """prefect.yaml's triggers of the merge breaker's deployment ``name``."""
    config = yaml.safe_load((cfn.REPO_ROOT / "prefect.yaml").read_text())
    (deployment,) = [
        d for d in config["deployments"] if d["entrypoint"].endswith(":ndjson_merge_breaker") and d["name"] == name
    ]
    return deployment["triggers"]


def runs_of(deployment: str) -> list:
    """The flow runs of ``deployment``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        deployment_id = client.read_deployment_by_name(deployment).id
        return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


def flow_run_state(run_id: uuid.UUID):
    """The flow run's current state."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state


def task_state_change(task: dict, exit_code: int) -> dict:
    """The EventBridge entry ECS sends when ``task`` stops with its container exited ``exit_code``."""
    detail = {
        "taskArn": task["taskArn"],
        "clusterArn": task["clusterArn"],
        "taskDefinitionArn": task["taskDefinitionArn"],
        "lastStatus": "STOPPED",
        "desiredStatus": "STOPPED",
        "stopCode": "EssentialContainerExited",
        "stoppedReason": "Essential container in task exited",
        "launchType": "FARGATE",
        "containers": [
            {
                "name": "prefect",
                "exitCode": exit_code,
                "lastStatus": "STOPPED",
                "containerArn": f"{task['taskArn']}/prefect",
                "taskArn": task["taskArn"],
            }
        ],
    }
    return {
        "Source": "aws.ecs",
        "DetailType": "ECS Task State Change",
        "Resources": [task["taskArn"]],
        "Detail": json.dumps(detail),
    }


async def observe_until(settings, done, timeout_s: float = 30) -> None:
    """prefect-aws's observer with its own handlers, configured by ``settings``, until ``done()`` or the timeout."""
    from prefect_aws.observers.ecs import EcsObserver, ecs_observer

    observer = EcsObserver(settings=settings)
    observer.event_handlers = ecs_observer.event_handlers  # mark_runs_as_crashed among them
    running = asyncio.create_task(observer.run())
    try:
        for _ in range(int(timeout_s / 0.5)):
            if await asyncio.to_thread(done) or running.done():
                break
            await asyncio.sleep(0.5)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


@pytest.mark.sweep  # a stack on moto's server and the observer's long polls: `make test-sweep`
@pytest.mark.timeout(480)
def test_a_stopped_flow_run_task_has_its_run_marked_crashed_by_the_observer(cloud, monkeypatch, tmp_path):
    from prefect.client.orchestration import get_client

    env = f"o{uuid.uuid4().hex[:6]}"
    # the merge deployment and its breaker, prefect.yaml's (the ecs set's triggers are the local ones renamed),
    # deployed as `{flow}/{env}` with `prefect deploy`: no worker runs what the trigger starts
    assert _to_copies(breaker_triggers("local"), "ecs") == breaker_triggers("ecs")
    deployed = deploy_from_prefect_yaml(tmp_path, {"ndjson-merge", "ndjson-merge-breaker"}, f"pool-{env}", env)
    merge, breaker = deployed["ndjson-merge"], deployed["ndjson-merge-breaker"]
    assert runs_of(breaker) == []
    deployed = deploy_template(cloud, env, stack_parameters(cloud, env))
    assert deployed["status"] == "CREATE_COMPLETE"
    formation, ecs = cloud.client("cloudformation"), cloud.client("ecs")
    listed = formation.list_stack_resources(StackName=f"pipelines-{env}")["StackResourceSummaries"]
    resources = {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in listed}
    rule = cloud.client("events").describe_rule(Name=resources["FlowRunEventsRule"])
    assert json.loads(rule["EventPattern"])["detail-type"] == ["ECS Task State Change"]

    # the worker's container environment names the observer's queue, as the worker service runs it
    worker = ecs.describe_task_definition(taskDefinition=resources["WorkerTaskDefinition"])["taskDefinition"]
    environment = {e["name"]: e["value"] for e in worker["containerDefinitions"][0]["environment"]}
    for name, value in environment.items():
        if name.startswith(cfn.OBSERVER_SETTINGS):
            monkeypatch.setenv(name, value)
    from prefect_aws.settings import EcsObserverSettings

    settings = EcsObserverSettings()
    assert settings.sqs.queue_name == f"prefect-ecs-tasks-events-{env}"

    run_id = running_flow_run(merge, {"date_prefix": "2026-04-01", "manifest_name": "observed"})
    cluster = resources["Cluster"]
    container = {"name": "prefect", "image": "pipelines:1", "memory": 512}
    family, network = f"prefect_observed-{env}", stack_parameters(cloud, env)
    ecs.register_task_definition(
        family=family,
        requiresCompatibilities=["FARGATE"],
        networkMode="awsvpc",
        cpu="256",
        memory="512",
        containerDefinitions=[container],
    )
    awsvpc = {"subnets": [network["Subnets"]], "securityGroups": [network["SecurityGroups"]]}
    (task,) = ecs.run_task(
        cluster=cluster,
        taskDefinition=family,
        launchType="FARGATE",
        tags=[{"key": FLOW_RUN_TAG, "value": str(run_id)}, {"key": "prefect.io/flow-run-name", "value": "observed"}],
        networkConfiguration={"awsvpcConfiguration": awsvpc},
    )["tasks"]
    ecs.stop_task(cluster=cluster, task=task["taskArn"], reason="the container was killed")
    other = running_flow_run()  # a run whose task exits 0 is left alone
    sent = cloud.client("events").put_events(Entries=[task_state_change(task, 137)])
    assert sent["FailedEntryCount"] == 0
    assert flow_run_state(run_id).type.value == "RUNNING"

    asyncio.run(observe_until(settings, lambda: flow_run_state(run_id).is_crashed()))
    state = flow_run_state(run_id)
    assert state.is_crashed(), state
    assert "non-zero exit code" in state.message and "prefect" in state.message
    assert flow_run_state(other).type.value == "RUNNING"
    queue = cloud.client("sqs").get_queue_url(QueueName=settings.sqs.queue_name)["QueueUrl"]
    left = cloud.client("sqs").get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages"])
    assert left["Attributes"]["ApproximateNumberOfMessages"] == "0"  # the observer acknowledged the event

    # the run's Crashed event fires the breaker's announce trigger: the server's action creates the breaker's run
    try:
        (fired,) = wait_for(lambda: runs_of(breaker), timeout=120, what="the breaker run the Crashed trigger creates")
        assert fired.parameters == {"merge_deployment": merge, "action": "check", "announce_after_seconds": 0}
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(run_id).state.is_crashed()  # the same run, still Crashed
    finally:
        with get_client(sync_client=True) as client:  # and their triggers: later crashes in the session start nothing
            for name in (breaker, merge):
                client.delete_deployment(client.read_deployment_by_name(name).id)
