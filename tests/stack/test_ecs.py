"""ECS: every ``*-ecs`` deployment rendered through the aws-ecs pool's template and submitted as the ECS worker
would (register the task definition, run_task) to moto's ECS; the GPU backend's tasks on the same cluster.

moto stands in for the ECS API only (it cannot run here); the work pool, its template and the rendering are
Prefect's and prefect-aws's own code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

moto = pytest.importorskip("moto")

REPO_ROOT = Path(__file__).resolve().parents[2]
AWS_DEPLOYMENTS = [
    d for d in yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())["deployments"] if d["name"] == "ecs"
]
ECS_DEPLOYMENTS = [d for d in AWS_DEPLOYMENTS if d["work_pool"]["name"] == "aws-ecs"]
# the frequent maintenance flows: processes of the maintenance service's worker (infra/cloudformation.py)
MAINTENANCE_DEPLOYMENTS = [d for d in AWS_DEPLOYMENTS if d["work_pool"]["name"] == "aws-maintenance"]
ACCOUNT = "123456789012"
AWS_ENV = {  # what README's "Pointing it at AWS" sets before `prefect deploy --name ecs`
    "PIPELINES_IMAGE_REPOSITORY": f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/pipelines",
    "PIPELINES_IMAGE_TAG": "1.0",
    "PIPELINES_IMAGE": f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/pipelines:1.0",  # what the build step outputs
    "ECS_CLUSTER": "pipelines",
    "ECS_TASK_ROLE_ARN": f"arn:aws:iam::{ACCOUNT}:role/pipelines-task",
    "ECS_EXECUTION_ROLE_ARN": f"arn:aws:iam::{ACCOUNT}:role/pipelines-execution",
    "PIPELINES_BUCKET_URL": "s3://pipelines-data/prod",
}


@pytest.fixture(scope="module")
def ecs_pool():
    """The aws-ecs work pool as `make up` creates it, on the test server."""
    from prefect.client.orchestration import get_client

    from deployments.local_stack import ECS_WORK_POOL, create_work_pools

    with get_client(sync_client=True) as client:
        create_work_pools(client)
        return client.read_work_pool(ECS_WORK_POOL)


@pytest.fixture
def aws(monkeypatch):
    """moto's AWS in this process, with the cluster the deployments name and the README's variables."""
    for name, value in {
        **AWS_ENV,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_ECS", "AWS_ENDPOINT_URL_EC2"):
        monkeypatch.delenv(name, raising=False)
    import boto3
    from moto.ecs.models import EC2ContainerServiceBackend

    # moto sums container-level memory only; a Fargate task definition (prefect-aws's) sets it per task, as AWS allows.
    # (The shim writes memoryReservation=0 into moto's copy of such containers; nothing below reads it.)
    sizes = EC2ContainerServiceBackend._calculate_task_resource_requirements

    def task_level_memory(task_definition):
        """moto's requirement sum, with containers that leave memory to the task counted as 0."""
        for container in task_definition.container_definitions:
            if not any(k in container for k in ("memory", "memoryReservation", "Memory", "MemoryReservation")):
                container.setdefault("memoryReservation", 0)
        return sizes(task_definition)

    monkeypatch.setattr(
        EC2ContainerServiceBackend, "_calculate_task_resource_requirements", staticmethod(task_level_memory)
    )
    with moto.mock_aws():
        session = boto3.Session(region_name="us-east-1")
        session.client("ecs").create_cluster(clusterName=AWS_ENV["ECS_CLUSTER"])
        yield session


def job_variables(deployment: dict) -> dict:
    """The deployment's job variables with `{{ $VAR }}` and step outputs filled, as `prefect deploy` does."""
    import os

    from prefect.utilities.templating import apply_values

    built = {"build-image": {"image": os.environ["PIPELINES_IMAGE"]}}  # the output of prefect.yaml's build step
    return apply_values(
        deployment["work_pool"].get("job_variables") or {}, {**os.environ, **built}, remove_notset=False
    )


def submit(pool, deployment: dict, session) -> dict:
    """Render the pool's template with the deployment's job variables and submit it as the ECS worker does."""
    from prefect.client.schemas.objects import FlowRun
    from prefect_aws.workers.ecs_worker import ECSJobConfiguration, ECSWorker

    variables = job_variables(deployment)
    configuration = asyncio.run(ECSJobConfiguration.from_template_and_values(pool.base_job_template, variables))
    flow_run = FlowRun(id=uuid.uuid4(), name="ecs-test", flow_id=uuid.uuid4(), deployment_id=uuid.uuid4())
    configuration.prepare_for_flow_run(flow_run)
    ecs = session.client("ecs")
    worker = ECSWorker(work_pool_name=pool.name)
    worker._work_pool = pool
    task_arn, cluster_arn = worker._prepare_and_create_task(logging.getLogger("ecs-test"), ecs, configuration, flow_run)
    task = ecs.describe_tasks(cluster=cluster_arn, tasks=[task_arn])["tasks"][0]
    definition = ecs.describe_task_definition(taskDefinition=task["taskDefinitionArn"])["taskDefinition"]
    return {"variables": variables, "task": task, "definition": definition, "cluster_arn": cluster_arn}


def test_the_ecs_pool_has_the_ecs_workers_template(ecs_pool):
    from prefect_aws.workers.ecs_worker import ECSWorker

    assert ecs_pool.type == "ecs"
    assert ecs_pool.base_job_template == ECSWorker.get_default_base_job_template()
    assert {"image", "cluster", "task_role_arn", "cpu", "memory", "env"} <= set(
        ecs_pool.base_job_template["variables"]["properties"]
    )


def _old_pool_gets_the_template(kind: str, setting: str, prefix: str) -> dict:
    """A pool of ``kind`` as an older `make up` made it (no template), named by ``local_stack.<setting>``: `make up`
    sets the template once, then finds it there. Returns the pool's template."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from deployments import local_stack

    name = f"{prefix}-old-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=name, type=kind))
        original = getattr(local_stack, setting)
        setattr(local_stack, setting, name)
        try:
            assert local_stack.create_work_pools(client)[name] == "template set"
            assert local_stack.create_work_pools(client)[name] == "exists"
        finally:
            setattr(local_stack, setting, original)
        return client.read_work_pool(name).base_job_template


def test_an_old_empty_ecs_pool_gets_the_template(ecs_pool):
    assert _old_pool_gets_the_template("ecs", "ECS_WORK_POOL", "aws-ecs") == ecs_pool.base_job_template


def test_the_local_pool_starts_the_engine_through_the_fork_server():
    """Issue 25: `make up`'s process pool names the engine fork server's run command, so a flow run is a fork of a
    process that has imported Prefect (Prefect 3.8 with no command starts a workspace supervisor that execs a second
    interpreter); an older pool is updated."""
    import shlex
    import sys

    from deployments import local_stack

    template = _old_pool_gets_the_template("process", "WORK_POOL", "local-process")
    command = template["variables"]["properties"]["command"]["default"]
    assert shlex.split(command) == [sys.executable, str(local_stack.FORKSERVER), "run", local_stack.engine_socket()]


def test_the_maintenance_pool_is_a_process_pool_whose_runs_use_the_images_interpreter():
    """`make up` and the deploy make aws-maintenance with the process worker's own template: no local fork server
    command (the maintenance service's worker starts each run with the image's Python), and each maintenance
    deployment's job variables are ones that template takes."""
    import jsonschema
    from prefect.client.orchestration import get_client
    from prefect.workers.process import ProcessWorker

    from deployments.local_stack import MAINTENANCE_WORK_POOL, create_work_pools

    with get_client(sync_client=True) as client:
        create_work_pools(client)
        pool = client.read_work_pool(MAINTENANCE_WORK_POOL)
    assert pool.type == "process" and pool.base_job_template == ProcessWorker.get_default_base_job_template()
    assert pool.base_job_template["variables"]["properties"]["command"].get("default") is None
    assert len(MAINTENANCE_DEPLOYMENTS) == 8
    schema = {**pool.base_job_template["variables"], "additionalProperties": False}
    for deployment in MAINTENANCE_DEPLOYMENTS:  # none of the ECS pool's (image, cpu, roles): the service has them
        jsonschema.validate(deployment["work_pool"].get("job_variables") or {}, schema)


@pytest.mark.parametrize("deployment", ECS_DEPLOYMENTS, ids=lambda d: d["entrypoint"].split(":")[1])
def test_each_ecs_deployment_registers_and_runs_on_ecs(ecs_pool, aws, deployment):
    variables = job_variables(deployment)
    import jsonschema

    # what the server checks at `prefect deploy`, and no variable the template would silently ignore
    jsonschema.validate(variables, {**ecs_pool.base_job_template["variables"], "additionalProperties": False})
    submitted = submit(ecs_pool, deployment, aws)
    task, definition = submitted["task"], submitted["definition"]
    container = definition["containerDefinitions"][0]
    assert container["image"] == AWS_ENV["PIPELINES_IMAGE"]
    assert definition["executionRoleArn"] == AWS_ENV["ECS_EXECUTION_ROLE_ARN"]
    assert (definition["cpu"], definition["memory"]) == (str(variables["cpu"]), str(variables["memory"]))
    assert definition["requiresCompatibilities"] == ["FARGATE"] and definition["networkMode"] == "awsvpc"
    assert submitted["cluster_arn"].endswith(f":cluster/{AWS_ENV['ECS_CLUSTER']}")
    assert task["launchType"] == "FARGATE" and task["overrides"]["taskRoleArn"] == AWS_ENV["ECS_TASK_ROLE_ARN"]
    override = task["overrides"]["containerOverrides"][0]
    env = {e["name"]: e["value"] for e in override["environment"]}
    assert not {"TABLE_ENV", "OBJECT_STORE_BASE_URL"} & set(env)  # the stack's pool defaults carry them
    assert "PREFECT__FLOW_RUN_ID" in env and override["name"] == container["name"]


def test_a_flow_run_on_the_stacks_pool_gets_its_network_logs_api_key_secret_and_env(ecs_pool, aws):
    """`pipelines aws-stack deploy` sets the pool's defaults from the stack: the flow run's task runs in the stack's
    subnets without a public IP, logs to its flow-run log group, reads the API key from Secrets Manager (no
    plaintext override) and gets the stack's env and renamed tables."""
    from deployments.aws import pool_job_template

    outputs = {
        "EcsCluster": AWS_ENV["ECS_CLUSTER"],
        "EcsTaskRoleArn": AWS_ENV["ECS_TASK_ROLE_ARN"],
        "EcsExecutionRoleArn": AWS_ENV["ECS_EXECUTION_ROLE_ARN"],
        "BucketUrl": "s3://pipelines-data-dev/pipelines",
        "FlowRunLogGroup": "/pipelines/dev/flow-runs",
        "LaunchKeySecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:launch-AbCdEf",
    }
    secret = f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:prefect-api-key-AbCdEf"
    subnets = aws.client("ec2").describe_subnets()["Subnets"][:2]
    parameters = {
        "Env": "dev",
        "VpcId": subnets[0]["VpcId"],
        "Subnets": ",".join(s["SubnetId"] for s in subnets),
        "SecurityGroups": "sg-1",
        "PrefectApiKeySecretArn": secret,
    }
    template = pool_job_template(ecs_pool.base_job_template, outputs, parameters, "us-east-1")
    deployment = json.loads(json.dumps(ECS_DEPLOYMENTS[0]))
    for name in ("cluster", "task_role_arn", "execution_role_arn"):  # what the pool holds is enough
        deployment["work_pool"]["job_variables"].pop(name)
    from prefect.settings import PREFECT_API_KEY, temporary_settings

    with temporary_settings({PREFECT_API_KEY: "pnu_the_workers_own"}):  # the worker's, from its definition's secret
        submitted = submit(ecs_pool.model_copy(update={"base_job_template": template}), deployment, aws)
    task, container = submitted["task"], submitted["definition"]["containerDefinitions"][0]
    network = task["attachments"][0]["details"]  # moto records the awsvpc configuration the worker sent
    assert {d["value"] for d in network if d["name"] == "subnetId"} == {subnets[0]["SubnetId"]}
    logs = container["logConfiguration"]
    assert logs["logDriver"] == "awslogs" and logs["options"]["awslogs-group"] == "/pipelines/dev/flow-runs"
    assert {"name": "PREFECT_API_KEY", "valueFrom": secret} in container["secrets"]
    assert {"name": "PIPELINES_LAUNCH_KEY", "valueFrom": outputs["LaunchKeySecretArn"]} in container["secrets"]
    override = task["overrides"]["containerOverrides"][0]
    env = {e["name"]: e["value"] for e in override["environment"]}
    assert "PREFECT_API_KEY" not in env and "PIPELINES_LAUNCH_KEY" not in env
    assert env["TABLE_ENV"] == "dev" and env["TABLE_GRANULES"] == "granules-dev" and env["ETL_CATALOG_DATABASE"]
    assert env["OBJECT_STORE_BASE_URL"] == "s3://pipelines-data-dev/pipelines"
    assert submitted["cluster_arn"].endswith(f":cluster/{AWS_ENV['ECS_CLUSTER']}")


@pytest.mark.sweep  # slow for make test; CI runs it in make test-sweep
def test_a_typo_in_a_job_variable_is_caught(ecs_pool, aws):
    import jsonschema
    from botocore.exceptions import ClientError

    schema = {**ecs_pool.base_job_template["variables"], "additionalProperties": False}
    jsonschema.validate(job_variables(ECS_DEPLOYMENTS[0]), schema)
    bad = json.loads(json.dumps(ECS_DEPLOYMENTS[0]))
    bad["work_pool"]["job_variables"]["task_role"] = bad["work_pool"]["job_variables"].pop("task_role_arn")
    with pytest.raises(jsonschema.ValidationError, match="'task_role' was unexpected"):
        jsonschema.validate(job_variables(bad), schema)
    bad = json.loads(json.dumps(ECS_DEPLOYMENTS[0]))
    bad["work_pool"]["job_variables"]["launch_type"] = "FARGATE_SPOTT"
    with pytest.raises(jsonschema.ValidationError, match="FARGATE_SPOTT"):
        jsonschema.validate(job_variables(bad), schema)
    with pytest.raises(ClientError, match="launch type should be one of"):
        submit(ecs_pool, bad, aws)


def test_the_gpu_backend_starts_describes_stops_and_health_checks_on_the_same_cluster(aws):
    from moto.ec2 import utils as ec2_utils

    from blocks.gpu import GpuCompute
    from tasks.gpu.backends import EcsBackend, TaskSpec

    cluster = AWS_ENV["ECS_CLUSTER"]
    ecs, ec2 = aws.client("ecs"), aws.client("ec2")
    for family, command in (("gpu-train", ["python", "train.py"]), ("gpu-dcgm", ["dcgmi", "diag", "-r", "1"])):
        ecs.register_task_definition(
            family=family,
            requiresCompatibilities=["EC2"],
            containerDefinitions=[
                {
                    "name": "main",
                    "image": AWS_ENV["PIPELINES_IMAGE"],
                    "memory": 1024,
                    "cpu": 512,
                    "command": command,
                    "resourceRequirements": [{"type": "GPU", "value": "1"}],
                }
            ],
        )
    image = ec2.describe_images()["Images"][0]["ImageId"]
    instance = aws.resource("ec2").create_instances(ImageId=image, MinCount=1, MaxCount=1)[0]
    ecs.register_container_instance(
        cluster=cluster, instanceIdentityDocument=json.dumps(ec2_utils.generate_instance_identity_document(instance))
    )
    config = GpuCompute(
        backend="ecs",
        cluster_name=cluster,
        task_definition="gpu-train",
        health_task_definition="gpu-dcgm",
        container_name="main",
        health_timeout_s=5,
        poll_interval_s=0.1,
        region_name="us-east-1",
    )
    backend = EcsBackend(config, session=aws)
    (node,) = backend.discover_nodes()
    started = backend.start_task(TaskSpec("job-1", 0, node, 0, 1, "python train.py --epochs 1"))
    described = ecs.describe_tasks(cluster=cluster, tasks=[started.task_id])["tasks"][0]
    assert described["containerInstanceArn"] == node["container_instance_arn"]
    assert described["overrides"]["containerOverrides"][0]["command"] == ["python", "train.py", "--epochs", "1"]
    assert backend.poll(started.task_id) is None
    backend.stop(started.task_id, "stopped by the test")
    assert backend.poll(started.task_id) is not None
    health = backend.health_check(node)
    assert health.method == "dcgmi" and health.readings["task_id"]
    dcgm = ecs.describe_tasks(cluster=cluster, tasks=[health.readings["task_id"]])["tasks"][0]
    assert dcgm["taskDefinitionArn"].endswith("task-definition/gpu-dcgm:1") and dcgm["lastStatus"] == "STOPPED"
