"""The template deployed to moto as the one command deploys it: through the artifact bucket and a change set."""

from __future__ import annotations

from typing import Any

from deployments import aws
from infra import cloudformation as cfn

ARTIFACTS = "pipelines-artifacts-test"


def stack_parameters(session: Any, env: str, **overrides: str) -> dict[str, str]:
    """A stack's parameters in moto: its default VPC's first subnet and security group."""
    ec2 = session.client("ec2")
    subnet = ec2.describe_subnets()["Subnets"][0]
    return {
        "Env": env,
        "BucketName": f"pipelines-data-{env}",
        "ImageTag": "1",
        "PrefectApiUrl": "http://prefect/api",
        "VpcId": subnet["VpcId"],
        "Subnets": subnet["SubnetId"],
        "SecurityGroups": ec2.describe_security_groups()["SecurityGroups"][0]["GroupId"],
        **overrides,
    }


def deploy_template(session: Any, env: str, parameters: dict[str, str], dry_run: bool = False) -> dict[str, Any]:
    """The committed template uploaded to the artifact bucket (made if absent) and applied by a change set."""
    s3 = session.client("s3")
    if ARTIFACTS not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=ARTIFACTS)
    template = aws.template_argument(cfn.TEMPLATE_PATH.read_text(), env, s3, ARTIFACTS)
    assert set(template) == {"TemplateURL"}, "the template goes through the artifact bucket"
    return aws.change_set(session.client("cloudformation"), f"pipelines-{env}", template, parameters, dry_run)
