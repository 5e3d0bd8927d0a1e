"""moto's server as a fixture: a thread of the test's process on a free loopback port, every AWS client but
DynamoDB's sent to it (``AWS_ENDPOINT_URL``).

Bridged here, each named: moto's change sets do not refresh a stack's outputs (``Stack.output_map``), done here from
the change set's template as its `update_stack` does; moto's CloudFormation has no ``AWS::SecretsManager::Secret``,
so a model here makes one in moto's Secrets Manager (a generated value of 64 hex digits, as the template asks) and
answers its Ref with the ARN, as CloudFormation does."""

from __future__ import annotations

import functools
import secrets
from typing import Any

import pytest


@functools.cache
def teach_cloudformation() -> None:
    """Teach moto's CloudFormation ``AWS::SecretsManager::Secret`` (once per process)."""
    from moto.cloudformation import parsing
    from moto.core.common_models import CloudFormationModel
    from moto.secretsmanager.models import secretsmanager_backends

    class StackSecret(CloudFormationModel):
        def __init__(self, arn: str, name: str) -> None:
            self.arn, self.name = arn, name

        @property
        def physical_resource_id(self) -> str:
            return self.arn

        @staticmethod
        def cloudformation_name_type() -> str:
            return "Name"

        @staticmethod
        def cloudformation_type() -> str:
            return "AWS::SecretsManager::Secret"

        @classmethod
        def has_cfn_attr(cls, attr: str) -> bool:
            return attr == "Id"

        @classmethod
        def create_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name, **kw):
            backend = secretsmanager_backends[account_id][region_name]
            properties: dict[str, Any] = cloudformation_json.get("Properties", {})
            backend.create_secret(
                name=resource_name,
                secret_string=secrets.token_hex(32),
                secret_binary=None,
                description=properties.get("Description"),
                tags=None,
                kms_key_id=None,
                client_request_token=None,
                replica_regions=[],
                force_overwrite=False,
            )
            return cls(backend.describe_secret(resource_name).arn, resource_name)

        @classmethod
        def update_from_cloudformation_json(cls, original_resource, new_resource_name, cloudformation_json, *args):
            return original_resource  # its value is made once, as CloudFormation keeps a generated secret

        @classmethod
        def delete_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name):
            secretsmanager_backends[account_id][region_name].delete_secret(resource_name, None, True)

    for cached in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cached.cache_clear()
    assert parsing.get_model_map()["AWS::SecretsManager::Secret"] is StackSecret


@pytest.fixture
def moto_thread(monkeypatch):
    """moto's server on a free loopback port in this process; every AWS client but DynamoDB's goes to it."""
    from moto.cloudformation.models import ChangeSet
    from moto.cloudformation.parsing import OutputMap
    from moto.server import ThreadedMotoServer

    from deployments.dynamodb_local import free_port

    apply = ChangeSet.apply

    def apply_and_refresh_outputs(self) -> None:
        """moto's apply, then the stack's outputs recomputed as moto's own update does."""
        apply(self)
        self.stack.output_map = OutputMap(self.stack.resource_map, self.template_dict, self.stack.stack_id)

    monkeypatch.setattr(ChangeSet, "apply", apply_and_refresh_outputs)
    teach_cloudformation()
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def private_network(ec2: Any, cidr: str = "10.20.0.0/16") -> dict[str, Any]:
    """What docs/aws.md asks a newcomer for, made in moto's EC2: a VPC, a private subnet whose route table sends
    0.0.0.0/0 to a NAT gateway (in a public subnet beside it) and a security group that lets 443 out; as the
    deploy's ``vpc``, ``subnets`` and ``security_groups``."""
    prefix = cidr.rsplit(".", 2)[0]
    vpc = ec2.create_vpc(CidrBlock=cidr)["Vpc"]["VpcId"]
    public = ec2.create_subnet(VpcId=vpc, CidrBlock=f"{prefix}.1.0/24")["Subnet"]["SubnetId"]
    private = ec2.create_subnet(VpcId=vpc, CidrBlock=f"{prefix}.2.0/24")["Subnet"]["SubnetId"]
    gateway = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=gateway, VpcId=vpc)
    outside = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    ec2.create_route(RouteTableId=outside, DestinationCidrBlock="0.0.0.0/0", GatewayId=gateway)
    ec2.associate_route_table(RouteTableId=outside, SubnetId=public)
    address = ec2.allocate_address(Domain="vpc")["AllocationId"]
    nat = ec2.create_nat_gateway(SubnetId=public, AllocationId=address)["NatGateway"]["NatGatewayId"]
    inside = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    ec2.create_route(RouteTableId=inside, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=nat)
    ec2.associate_route_table(RouteTableId=inside, SubnetId=private)
    group = ec2.create_security_group(GroupName=f"pipelines-{vpc}", Description="pipelines", VpcId=vpc)["GroupId"]
    # a new group lets everything out; the stack's tasks need only 443
    ec2.revoke_security_group_egress(
        GroupId=group, IpPermissions=[{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]
    )
    ec2.authorize_security_group_egress(
        GroupId=group,
        IpPermissions=[{"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}],
    )
    return {"vpc": vpc, "subnets": [private], "security_groups": [group], "public_subnet": public, "nat": nat}
