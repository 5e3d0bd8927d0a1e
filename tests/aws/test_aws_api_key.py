"""The workers' Prefect API key for a Prefect Cloud workspace: required, kept in Secrets Manager as the plain string
ECS puts in PREFECT_API_KEY, named by its full ARN, and decryptable by the execution role where a customer managed
key encrypts it (the template's DecryptPrefectApiKey, evaluated by infra/policy_eval.py); checked in a dry run."""

from __future__ import annotations

import json

import pytest

from deployments import aws
from infra import cloudformation as cfn
from infra import policy_eval

moto = pytest.importorskip("moto")

CLOUD = "https://api.prefect.cloud/api/accounts/a/workspaces/w"
REGION = "us-east-1"


@pytest.fixture
def cloud(monkeypatch):
    import boto3

    for name in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "PREFECT_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with moto.mock_aws():
        yield boto3.Session(region_name=REGION, aws_access_key_id="t", aws_secret_access_key="t")


def test_a_cloud_url_without_a_key_is_refused_before_anything_changes(cloud, monkeypatch):
    monkeypatch.setattr(aws, "local_api_key", lambda: "")
    with pytest.raises(ValueError, match="prefect cloud login"):
        aws.prefect_api_key_secret(cloud, REGION, "dev", CLOUD)
    assert cloud.client("secretsmanager").list_secrets()["SecretList"] == []
    assert aws.prefect_api_key_secret(cloud, REGION, "dev", "http://prefect.internal/api")["arn"] == ""


def test_the_shells_key_is_kept_as_a_plain_string_secret_named_by_its_full_arn(cloud, monkeypatch):
    monkeypatch.setenv("PREFECT_API_KEY", "pnu_first")
    secrets = cloud.client("secretsmanager")
    planned = aws.prefect_api_key_secret(cloud, REGION, "dev", CLOUD, dry_run=True)
    assert (
        planned["secret"] == "would create pipelines/dev/prefect-api-key" and secrets.list_secrets()["SecretList"] == []
    )
    made = aws.prefect_api_key_secret(cloud, REGION, "dev", CLOUD)
    assert made["secret"] == "created" and made["arn"] == secrets.describe_secret(SecretId=made["arn"])["ARN"]
    assert made["arn"].startswith("arn:aws:secretsmanager:") and made["kms_key_arn"] == ""
    assert secrets.get_secret_value(SecretId=made["arn"])["SecretString"] == "pnu_first"
    assert aws.prefect_api_key_secret(cloud, REGION, "dev", CLOUD)["secret"] == "unchanged"
    monkeypatch.setenv("PREFECT_API_KEY", "pnu_second")
    assert aws.prefect_api_key_secret(cloud, REGION, "dev", CLOUD, dry_run=True)["secret"] == "would update"
    assert aws.prefect_api_key_secret(cloud, REGION, "dev", CLOUD)["secret"] == "updated"
    assert secrets.get_secret_value(SecretId=made["arn"])["SecretString"] == "pnu_second"


def test_a_given_secret_is_checked_its_full_arn_used_and_its_customer_key_decryptable(cloud):
    secrets, kms = cloud.client("secretsmanager"), cloud.client("kms")
    secrets.create_secret(Name="team/json-key", SecretString=json.dumps({"PREFECT_API_KEY": "pnu_x"}))
    with pytest.raises(ValueError, match="plain string"):
        aws.prefect_api_key_secret(cloud, REGION, "dev", CLOUD, given="team/json-key")
    key = kms.create_key(Description="team secrets")["KeyMetadata"]["Arn"]
    made = secrets.create_secret(Name="team/prefect", SecretString="pnu_x", KmsKeyId=key)
    checked = aws.prefect_api_key_secret(cloud, REGION, "dev", CLOUD, given="team/prefect")
    assert checked == {"arn": made["ARN"], "kms_key_arn": key, "secret": "checked"}  # a name in, the full ARN out

    template = json.loads(cfn.TEMPLATE_PATH.read_text())
    parameters = {
        "Env": "dev",
        "BucketName": "b",
        "PrefectApiKeySecretArn": checked["arn"],
        "PrefectApiKeySecretKmsKeyArn": checked["kms_key_arn"],
    }
    values = policy_eval.stack_values(template, parameters, "pipelines-dev", "123456789012", REGION)
    statements = policy_eval.role_statements(template, "ExecutionRole", values)
    read = policy_eval.Request("secretsmanager:GetSecretValue", checked["arn"])
    via = {"kms:ViaService": (f"secretsmanager.{REGION}.amazonaws.com",)}
    assert policy_eval.decide(statements, read)[0]
    assert policy_eval.decide(statements, policy_eval.Request("kms:Decrypt", key, via))[0]
    assert not policy_eval.decide(statements, policy_eval.Request("kms:Decrypt", key))[
        0
    ]  # only through Secrets Manager
