"""A newcomer's prerequisites, checked by `pipelines aws-stack deploy` before it changes anything (its dry run too):
each missing one named with what to do, against moto's EC2 (VPCs, subnets, route tables, NAT gateways, VPC
endpoints, security groups), a Docker address nothing answers and the test's Prefect server; the setup docs/aws.md
asks for passes."""

from __future__ import annotations

import pytest

from deployments import aws
from deployments.aws_prerequisites import ENDPOINT_SERVICES, network_problems
from deployments.dynamodb_local import free_port
from tests.helpers.docker_standin import docker_standin
from tests.helpers.moto_server import private_network

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

moto = pytest.importorskip("moto")
REGION = "us-east-1"


@pytest.fixture
def cloud(monkeypatch):
    """moto's AWS in this process, a session on it and the network docs/aws.md asks for."""
    import boto3

    for name in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    with moto.mock_aws():
        session = boto3.Session(region_name=REGION, aws_access_key_id="t", aws_secret_access_key="t")
        yield session, private_network(session.client("ec2"))


def test_the_network_docs_aws_asks_for_passes_and_each_gap_is_named(cloud):
    session, net = cloud
    ec2 = session.client("ec2")
    vpc, [subnet], [group] = net["vpc"], net["subnets"], net["security_groups"]
    assert network_problems(ec2, vpc, [subnet], [group], REGION) == []

    other = private_network(ec2, "10.30.0.0/16")
    [outside] = network_problems(ec2, vpc, other["subnets"], [group], REGION)
    assert outside == f"subnet {other['subnets'][0]} is in {other['vpc']}, not in --vpc {vpc}"
    [absent] = network_problems(ec2, vpc, [subnet], ["sg-0123456789abcdef0"], REGION)
    assert absent == "security group sg-0123456789abcdef0 does not exist in this account and region"
    assert (
        "VPC vpc-0123456789abcdef0 does not exist" in network_problems(ec2, "vpc-0123456789abcdef0", [], [], REGION)[0]
    )

    # the public subnet: its default route is the internet gateway, no way out for a task without a public IP
    [public] = network_problems(ec2, vpc, [net["public_subnet"]], [group], REGION)
    assert (
        "routes 0.0.0.0/0 to an internet gateway" in public and "ecr.api, ecr.dkr, s3, logs, secretsmanager" in public
    )
    assert network_problems(ec2, vpc, [net["public_subnet"]], [group], REGION, public_ip=True) == []

    # a subnet with no route out at all (the VPC's main table has only the local route), then VPC endpoints instead
    bare = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.3.0/24")["Subnet"]["SubnetId"]
    [no_route] = network_problems(ec2, vpc, [bare], [group], REGION)
    assert f"subnet {bare}'s route table has no 0.0.0.0/0 route" in no_route and "NAT gateway" in no_route
    for service in ENDPOINT_SERVICES[:-1]:
        ec2.create_vpc_endpoint(VpcId=vpc, ServiceName=f"com.amazonaws.{REGION}.{service}")
    [one_short] = network_problems(ec2, vpc, [bare], [group], REGION)
    assert "for secretsmanager (missing)" in one_short
    ec2.create_vpc_endpoint(VpcId=vpc, ServiceName=f"com.amazonaws.{REGION}.secretsmanager")
    assert network_problems(ec2, vpc, [bare], [group], REGION) == []

    # a group that lets only 80 out
    closed = ec2.create_security_group(GroupName="closed", Description="closed", VpcId=vpc)["GroupId"]
    everything = [{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]
    ec2.revoke_security_group_egress(GroupId=closed, IpPermissions=everything)
    web = [{"IpProtocol": "tcp", "FromPort": 80, "ToPort": 80, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]
    ec2.authorize_security_group_egress(GroupId=closed, IpPermissions=web)
    [no_443] = network_problems(ec2, vpc, [subnet], [closed], REGION)
    assert f"security group {closed} lets no TCP 443 out" in no_443 and "authorize-security-group-egress" in no_443


def test_the_deploy_and_its_dry_run_name_every_missing_prerequisite_before_changing_anything(cloud, monkeypatch):
    from prefect.settings import PREFECT_API_URL

    session, net = cloud
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")  # nothing answers there
    public = dict(net, subnets=[net["public_subnet"]])
    arguments = {k: public[k] for k in ("vpc", "subnets", "security_groups")}
    for dry_run in (True, False):
        with pytest.raises(ValueError, match="3 prerequisite") as refused:
            aws.deploy("dev", REGION, **arguments, prefect_api_url="", tag="1", dry_run=dry_run, session=session)
        message = str(refused.value)
        assert f"subnet {net['public_subnet']}'s route table routes 0.0.0.0/0 to an internet gateway" in message
        assert "no Docker daemon answers at tcp://127.0.0.1:" in message and "docker info" in message
        assert "no Prefect API URL: give --prefect-api-url" in message
    dead = f"http://127.0.0.1:{free_port()}/api"
    with pytest.raises(ValueError, match=f"the Prefect API at {dead} does not answer"):
        aws.deploy("dev", REGION, **arguments, prefect_api_url=dead, tag="1", dry_run=True, session=session)
    assert session.client("s3").list_buckets()["Buckets"] == []  # not even the artifact bucket
    assert session.client("ecr").describe_repositories()["repositories"] == []
    assert session.client("cloudformation").describe_stacks()["Stacks"] == []

    with docker_standin() as docker:
        monkeypatch.setenv("DOCKER_HOST", docker.host)
        arguments = {k: net[k] for k in ("vpc", "subnets", "security_groups")}
        planned = aws.deploy(
            "dev", REGION, **arguments, prefect_api_url=PREFECT_API_URL.value(), tag="1", dry_run=True, session=session
        )
    assert planned["change_set"]["action"] == "CREATE"
