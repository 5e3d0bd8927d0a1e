"""`pipelines aws-stack deploy` end to end from a clean state, against moto's server (a thread of this process), the
Docker API stand-in and the test's Prefect server: a dry run that changes nothing, the create, a second run that
changes nothing, an update with a changed parameter, then `pipelines aws-stack destroy` saying what it keeps.

Bridged here, each named: the stand-in's pushes are put in moto's ECR (a real push lands the image there); moto's
change sets do not refresh a stack's outputs (``Stack.output_map``), done here from the change set's template as
its `update_stack` does.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from deployments import aws
from tests.helpers.docker_standin import docker_standin
from tests.helpers.moto_server import private_network

moto = pytest.importorskip("moto")


@pytest.fixture
def prefect_side():
    """The test server's aws-ecs pool and default blocks put back as they were after the test."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    from blocks.base import clear_cache
    from deployments.local_stack import ECS_WORK_POOL, ecs_base_job_template

    with get_client(sync_client=True) as client:
        before = {slug: _block_id(client, slug) for slug in ("pipeline-dynamodb-tables", "pipeline-object-storage")}
    yield
    with get_client(sync_client=True) as client:
        try:
            client.update_work_pool(ECS_WORK_POOL, WorkPoolUpdate(base_job_template=ecs_base_job_template()))
        except ObjectNotFound:
            pass
        for slug, existed in before.items():
            made = _block_id(client, slug)
            if made and not existed:
                client.delete_block_document(made)
    clear_cache()


def _block_id(client, slug: str):
    """The id of the ``default`` block document of a block type, or None."""
    from prefect.exceptions import ObjectNotFound

    try:
        return client.read_block_document_by_name("default", slug).id
    except ObjectNotFound:
        return None


@pytest.mark.sweep  # three deploys with `prefect deploy --name ecs` and a destroy: `make test-sweep`
@pytest.mark.timeout(900)
def test_one_command_creates_changes_nothing_the_second_time_updates_and_destroys(moto_thread, prefect_side):
    import boto3
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import WorkPoolFilter, WorkPoolFilterName
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    from deployments.local_stack import ECS_WORK_POOL, MAINTENANCE_WORK_POOL, maintenance_base_job_template

    session = boto3.Session(region_name="us-east-1")
    ecr = session.client("ecr")

    def into_ecr(repository: str, tag: str) -> None:
        """A push lands in the registry, as ECR receives it."""
        config = {
            "digest": f"sha256:{hashlib.sha256(tag.encode()).hexdigest()}",
            "size": 1,
            "mediaType": "application/vnd.docker.container.image.v1+json",
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": config,
            "layers": [],
        }
        name = repository.rsplit("/", 1)[-1]
        if tag not in {i.get("imageTag") for i in ecr.list_images(repositoryName=name)["imageIds"]}:
            ecr.put_image(repositoryName=name, imageManifest=json.dumps(manifest), imageTag=tag)  # a re-push: as is

    net = private_network(session.client("ec2"))  # docs/aws.md's prerequisites, checked by the deploy
    subnet = {"SubnetId": net["subnets"][0]}
    env = f"c{uuid.uuid4().hex[:6]}"
    arguments = dict(
        env=env,
        region="us-east-1",
        vpc=net["vpc"],
        subnets=net["subnets"],
        security_groups=net["security_groups"],
        prefect_api_url=PREFECT_API_URL.value(),
        tag="1.0",
    )
    with docker_standin(on_push=into_ecr) as docker:
        import os

        os.environ["DOCKER_HOST"] = docker.host
        try:
            planned = aws.deploy(**arguments, dry_run=True, session=session)
            assert planned["change_set"]["action"] == "CREATE" and len(planned["change_set"]["changes"]) > 40
            assert aws.stack_status(session.client("cloudformation"), f"pipelines-{env}") is None
            assert ecr.describe_repositories()["repositories"] == []  # nothing but the template object

            created = aws.deploy(**arguments, session=session)
            assert created["image"] == "pushed" and created["change_set"]["status"] == "CREATE_COMPLETE"
            assert created["prefect"]["deployments"] == "deployed"
            assert created["prefect"]["DynamoTables"] == created["prefect"]["ObjectStorage"] == "saved"
            assert created["prefect"]["maintenance pool"] in ("created", "updated", "unchanged")  # the server's own
            builds = len(docker.builds)
            assert builds >= 1 and (f"{ecr.describe_repositories()['repositories'][0]['repositoryUri']}", "1.0") in [
                (r, t) for r, t in docker.pushes
            ]
            with get_client(sync_client=True) as client:
                pool = client.read_work_pool(ECS_WORK_POOL).base_job_template["variables"]["properties"]
                assert pool["network_configuration"]["default"]["subnets"] == [subnet["SubnetId"]]
                assert pool["env"]["default"]["TABLE_ENV"] == env
                assert pool["env"]["default"]["TABLE_GRANULES"] == f"granules-{env}"
                assert pool["env"]["default"]["ETL_CATALOG_DATABASE"] == "ndjson_parquet"  # its default
                assert pool["cloudwatch_logs_options"]["default"]["awslogs-group"] == f"/pipelines/{env}/flow-runs"
                maintenance = client.read_work_pool(MAINTENANCE_WORK_POOL)  # the maintenance service's worker polls it
                assert maintenance.type == "process"
                assert maintenance.base_job_template == maintenance_base_job_template()
                frequent = client.read_deployments(
                    work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[MAINTENANCE_WORK_POOL]))
                )
                assert {d.name for d in frequent} == {"ecs"} and len(frequent) == 8

            again = aws.deploy(**arguments, session=session)
            assert again["image"] == "unchanged" and again["change_set"]["action"] == "NONE"
            assert set(again["prefect"].values()) == {"unchanged"}, again["prefect"]
            assert len(docker.builds) == builds  # nothing built, nothing pushed

            lake = {"CatalogDatabase": "lake"}  # a pipeline's own parameter (Pipeline.aws), given by name
            updated = aws.deploy(**arguments, assign_public_ip="ENABLED", pipeline_parameters=lake, session=session)
            assert updated["change_set"]["action"] == "UPDATE" and updated["change_set"]["status"] == "UPDATE_COMPLETE"
            assert updated["image"] == "unchanged" and updated["prefect"]["pool"] == "updated"
            with get_client(sync_client=True) as client:
                pool = client.read_work_pool(ECS_WORK_POOL).base_job_template["variables"]["properties"]
                assert pool["network_configuration"]["default"]["assignPublicIp"] == "ENABLED"
                assert pool["env"]["default"]["ETL_CATALOG_DATABASE"] == "lake"

            removed = aws.destroy(env, "us-east-1", session=session)
            assert f"stack pipelines-{env}" in removed["deleted"] and "ECR repository pipelines" in removed["deleted"]
            kept = sorted(removed["kept"])
            assert len(kept) == 14 and f"AWS::S3::Bucket pipelines-123456789012-{env}" in kept
            assert all("RetainExceptOnCreate" in why for why in removed["kept"].values())
            assert f"the {MAINTENANCE_WORK_POOL} pool" in removed["deleted"]
            with get_client(sync_client=True) as client, pytest.raises(ObjectNotFound):
                client.read_work_pool(MAINTENANCE_WORK_POOL)
            assert aws.stack_status(session.client("cloudformation"), f"pipelines-{env}") is None
        finally:
            os.environ.pop("DOCKER_HOST", None)


def test_a_stack_parameter_no_pipeline_declares_is_refused_before_anything_is_deployed():
    """A typo (``GpuCluster``) would otherwise deploy the default silently; the named ones keep their values."""
    from deployments import cli

    known = aws.pipelines_parameters({"GpuClusterName": "gpu"})
    assert known == {
        "CatalogDatabase": "ndjson_parquet",
        "GpuClusterName": "gpu",
        "GpuTaskRoleArn": "",
        "VideoEndpointPrefix": "",
    }
    with pytest.raises(ValueError, match=r"\['GpuCluster'\]; known: \['CatalogDatabase', 'GpuClusterName'"):
        aws.deploy("dev", "us-east-1", "vpc-1", ["s"], ["g"], "http://api", pipeline_parameters={"GpuCluster": "gpu"})
    with pytest.raises(SystemExit):  # NAME=VALUE or nothing
        command = "aws-stack deploy --env e --vpc v --subnets s --security-groups g --parameter GpuClusterName"
        cli.build_parser().parse_args(command.split())
