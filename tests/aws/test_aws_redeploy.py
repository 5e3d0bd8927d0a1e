"""A deploy after a destroy, and the moment after a change set is executed: the data a destroy kept is named with
the commands that delete it before a create would fail on it ("already exists"), and a stack that still reads
REVIEW_IN_PROGRESS right after ExecuteChangeSet is waited for, not reported failed."""

from __future__ import annotations

import datetime
import re
import shlex

import pytest

from deployments import aws
from infra import cloudformation as cfn
from tests.helpers.docker_standin import docker_standin
from tests.helpers.moto_server import private_network

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

moto = pytest.importorskip("moto")

ACCOUNT = "123456789012"  # moto's


@pytest.fixture
def cloud(monkeypatch):
    """moto's AWS in this process, and a session on it."""
    import boto3

    for name in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    with moto.mock_aws():
        yield boto3.Session(region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")


def dry_run(session, env: str, net: dict) -> dict:
    """A dry run with every prerequisite there (docs/aws.md's network, a Docker daemon, the test's Prefect server)."""
    import os

    from prefect.settings import PREFECT_API_URL

    arguments = {k: net[k] for k in ("vpc", "subnets", "security_groups")}
    with docker_standin() as docker:
        os.environ["DOCKER_HOST"] = docker.host
        try:
            return aws.deploy(
                env,
                "us-east-1",
                prefect_api_url=PREFECT_API_URL.value(),
                tag="1",
                dry_run=True,
                session=session,
                **arguments,
            )
        finally:
            os.environ.pop("DOCKER_HOST", None)


def test_a_create_over_the_data_a_destroy_kept_is_refused_with_the_commands_that_delete_it(cloud):
    session, env = cloud, "dev"
    net = private_network(session.client("ec2"))
    dynamodb, s3 = session.client("dynamodb"), session.client("s3")
    kept_tables = sorted(name.replace(cfn.ENV, env) for name in cfn.stack_table_names().values())[:2]
    for name in kept_tables:  # what destroy leaves (RetainExceptOnCreate)
        dynamodb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    bucket = f"pipelines-{ACCOUNT}-{env}"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for body in (b"one", b"two"):
        s3.put_object(Bucket=bucket, Key="pipelines/x.parquet", Body=body)

    with pytest.raises(RuntimeError, match="already exists") as refused:
        dry_run(session, env, net)
    message = str(refused.value)
    for name in kept_tables:
        assert f"table {name}: aws dynamodb delete-table --region us-east-1 --table-name {name}" in message
    assert f"bucket {bucket}: python -c" in message
    assert "pipelines-artifacts" not in {b["Name"][:19] for b in s3.list_buckets()["Buckets"]}  # nothing changed

    for command in re.findall(r"aws dynamodb delete-table [^;]+", message):  # the AWS CLI's call, by boto3
        words = shlex.split(command)
        dynamodb.delete_table(TableName=words[words.index("--table-name") + 1])
    bucket_command = shlex.split(re.search(r"python -c \"[^\"]+\"", message).group(0))
    exec(bucket_command[2], {})  # the printed line as python runs it, on moto
    assert bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}
    assert dry_run(session, env, net)["change_set"]["action"] == "CREATE"


def test_a_stack_still_in_review_right_after_execute_is_waited_for(monkeypatch):
    """CloudFormation may answer REVIEW_IN_PROGRESS to the first DescribeStacks after ExecuteChangeSet (the
    create has not started yet); the deploy keeps waiting and sees CREATE_COMPLETE."""
    import boto3
    from botocore.stub import Stubber

    monkeypatch.setattr("time.sleep", lambda s: None)
    client = boto3.client("cloudformation", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")
    stack, name, now = "pipelines-dev", "cs-1", datetime.datetime(2026, 1, 1)

    def described(status: str) -> dict:
        return {"Stacks": [{"StackName": stack, "CreationTime": now, "StackStatus": status}]}

    with Stubber(client) as stub:
        stub.add_client_error("describe_stacks", "ValidationError", f"Stack with id {stack} does not exist")
        stub.add_response("create_change_set", {"Id": "arn:cs", "StackId": "arn:stack"})
        stub.add_response("describe_change_set", {"Status": "CREATE_COMPLETE", "Changes": []})
        stub.add_response("execute_change_set", {})
        for status in ("REVIEW_IN_PROGRESS", "CREATE_IN_PROGRESS", "CREATE_COMPLETE"):
            stub.add_response("describe_stacks", described(status))
        result = aws.change_set(client, stack, {"TemplateBody": "{}"}, {"Env": "dev"}, name=name)
        stub.assert_no_pending_responses()
    assert result == {"action": "CREATE", "changes": [], "status": "CREATE_COMPLETE"}
