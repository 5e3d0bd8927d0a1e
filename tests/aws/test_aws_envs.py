"""Two envs and one Prefect workspace: the ECS pool, the ``default`` blocks and the ``*/ecs`` deployments carry one
env's cluster, roles and tables, so a second env's deploy is refused (naming the env that holds the workspace and
what to do) before it changes anything, and its destroy leaves the other env's pool, deployments and ECR repository
as they are; the holder's destroy frees the workspace.

The holder's Prefect side is what its deploy writes (the pool's template from ``pool_job_template``, a deployment in
the pool), made here directly: a `prefect deploy --name ecs` of the whole set is test_aws_deploy_command's (sweep)."""

from __future__ import annotations

import pytest

from deployments import aws
from tests.helpers.docker_standin import docker_standin
from tests.helpers.moto_server import private_network

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

moto = pytest.importorskip("moto")
REGION = "us-east-1"


@pytest.fixture
def prod_holds_the_workspace(monkeypatch):
    """moto's AWS with prod's stack and ECR repository; the test server's ECS pool set by prod's deploy and one
    deployment in it; everything put back bare after the test."""
    import boto3
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolUpdate

    from deployments.local_stack import ECS_WORK_POOL, create_work_pools, ecs_base_job_template

    for name in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    outputs = {
        "EcsCluster": "pipelines-prod",
        "EcsTaskRoleArn": "arn:aws:iam::123456789012:role/prod-task",
        "EcsExecutionRoleArn": "arn:aws:iam::123456789012:role/prod-execution",
        "FlowRunLogGroup": "/pipelines/prod/flow-runs",
        "BucketUrl": "s3://pipelines-123456789012-prod",
        "LaunchKeySecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:prod-launch",
    }
    with moto.mock_aws(), get_client(sync_client=True) as client:
        session = boto3.Session(region_name=REGION, aws_access_key_id="t", aws_secret_access_key="t")
        net = private_network(session.client("ec2"))
        parameters = {"Env": "prod", "VpcId": net["vpc"], "Subnets": net["subnets"][0]}
        parameters["SecurityGroups"] = net["security_groups"][0]
        session.client("ecr").create_repository(repositoryName="pipelines")
        template = '{"Parameters": {"Env": {"Type": "String"}}, "Resources": {"Q": {"Type": "AWS::SQS::Queue"}}}'
        session.client("cloudformation").create_stack(
            StackName="pipelines-prod",
            TemplateBody=template,
            Parameters=[{"ParameterKey": "Env", "ParameterValue": "prod"}],
        )
        create_work_pools(client)
        prods = aws.pool_job_template(ecs_base_job_template(), outputs, parameters, REGION)
        client.update_work_pool(ECS_WORK_POOL, WorkPoolUpdate(base_job_template=prods))
        flow = client.create_flow_from_name("phspectra-survey")
        deployment = client.create_deployment(flow, "ecs", work_pool_name=ECS_WORK_POOL)
        try:
            yield session, net, deployment, prods
        finally:
            try:
                client.delete_deployment(deployment)
            except Exception:  # noqa: BLE001 (the holder's destroy in the test deleted it already)
                pass
            client.update_work_pool(ECS_WORK_POOL, WorkPoolUpdate(base_job_template=ecs_base_job_template()))


def test_a_second_env_is_refused_and_its_destroy_leaves_the_first_envs_side(prod_holds_the_workspace, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    from deployments.local_stack import ECS_WORK_POOL

    session, net, deployment, prods = prod_holds_the_workspace
    ecr, cloudformation = session.client("ecr"), session.client("cloudformation")
    arguments = {k: net[k] for k in ("vpc", "subnets", "security_groups")}
    with docker_standin() as docker:
        monkeypatch.setenv("DOCKER_HOST", docker.host)
        for dry_run in (True, False):
            with pytest.raises(ValueError, match="holds env prod's aws-ecs pool") as refused:
                aws.deploy(
                    "dev",
                    REGION,
                    **arguments,
                    prefect_api_url=PREFECT_API_URL.value(),
                    tag="1",
                    dry_run=dry_run,
                    session=session,
                )
            assert "pipelines aws-stack destroy --env prod" in str(refused.value)
            assert "another workspace's --prefect-api-url" in str(refused.value)
        assert docker.builds == [] and aws.stack_status(cloudformation, "pipelines-dev") is None

    removed = aws.destroy("dev", REGION, session=session)
    assert removed["kept"]["prefect"] == "the Prefect workspace's aws-ecs pool, blocks and deployments are env prod's"
    assert "the stacks pipelines-prod run images from it" == removed["kept"]["ECR repository pipelines"]
    assert [r["repositoryName"] for r in ecr.describe_repositories()["repositories"]] == ["pipelines"]
    with get_client(sync_client=True) as client:
        assert client.read_deployment(deployment).work_pool_name == ECS_WORK_POOL  # prod's, still there
        assert client.read_work_pool(ECS_WORK_POOL).base_job_template == prods

    cloudformation.delete_stack(StackName="pipelines-prod")
    freed = aws.destroy("prod", REGION, session=session)  # the holder: its Prefect side goes, the workspace is free
    # every deployment of the pool goes (other tests of this session's server may have left theirs there too)
    [pool_deployments] = [line for line in freed["deleted"] if line.endswith("deployments of the aws-ecs pool")]
    assert int(pool_deployments.split()[0]) >= 1 and "ECR repository pipelines" in freed["deleted"]
    with get_client(sync_client=True) as client, pytest.raises(ObjectNotFound):
        client.read_deployment(deployment)
    with docker_standin() as docker:
        monkeypatch.setenv("DOCKER_HOST", docker.host)
        planned = aws.deploy(
            "dev", REGION, **arguments, prefect_api_url=PREFECT_API_URL.value(), tag="1", dry_run=True, session=session
        )
    assert planned["change_set"]["action"] == "CREATE"
