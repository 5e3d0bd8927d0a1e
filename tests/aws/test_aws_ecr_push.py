"""`prefect deploy --name ecs` pushes to ECR with the registry's credentials in its own process: the stand-in
registry refuses a push without ECR's login (user AWS, the password of ecr get-authorization-token), as ECR does,
so a push that relied on an earlier process's login (the Docker library keeps it in memory) fails here."""

from __future__ import annotations

import pytest

from tests.helpers.crashpoints import REPO_ROOT
from tests.helpers.docker_standin import ECS_IMAGE, docker_standin, prefect_deploy

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

pytest.importorskip("moto")


@pytest.mark.timeout(600)
def test_the_ecs_push_logs_in_to_ecr_in_the_process_that_pushes(moto_thread):
    import base64

    import boto3
    from prefect.client.orchestration import get_client

    from deployments.local_stack import create_work_pools

    with get_client(sync_client=True) as client:
        create_work_pools(client)  # the aws-ecs pool the ecs deployments name, as `make up` makes it
    ecr = boto3.client("ecr", region_name="us-east-1")

    def ecr_password() -> str:
        token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
        return base64.b64decode(token).decode().split(":", 1)[1]

    with docker_standin(registry_password=ecr_password) as docker:
        no_login = {"DOCKER_CONFIG": str(REPO_ROOT / "tests" / "no-docker-config")}  # no login left by anyone
        prefect_deploy("ndjson-flush-orphans/ecs", {"DOCKER_HOST": docker.host, **no_login, **ECS_IMAGE})
    image = (ECS_IMAGE["PIPELINES_IMAGE_REPOSITORY"], ECS_IMAGE["PIPELINES_IMAGE_TAG"])
    assert docker.refused == [] and docker.pushes == [image]


def test_the_registry_refuses_a_push_without_ecrs_login():
    """The stand-in as ECR: a push with no credentials, or others than ECR's, is refused in the push's stream."""
    import docker as docker_py

    with docker_standin(registry_password=lambda: "token") as standin:
        client = docker_py.DockerClient(base_url=standin.host.replace("tcp://", "http://"))
        events = list(client.api.push("1.dkr.ecr.us-east-1.amazonaws.com/p", tag="t", stream=True, decode=True))
        assert events[-1]["error"] == "no basic auth credentials"
        with pytest.raises(docker_py.errors.APIError, match="401"):
            client.login(username="AWS", password="wrong", registry="1.dkr.ecr.us-east-1.amazonaws.com")
        client.login(username="AWS", password="token", registry="https://1.dkr.ecr.us-east-1.amazonaws.com")
        events = list(client.api.push("1.dkr.ecr.us-east-1.amazonaws.com/p", tag="t", stream=True, decode=True))
        assert "error" not in events[-1] and standin.pushes == [("1.dkr.ecr.us-east-1.amazonaws.com/p", "t")]
