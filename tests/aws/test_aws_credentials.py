"""Whose AWS the one command changes: boto3's own credential chain and region (a profile, SSO, an instance role),
never keys or a region the Makefile makes up, and the account and region said before anything changes."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from deployments import cli
from infra import cloudformation as cfn
from tests.helpers.docker_standin import docker_standin
from tests.helpers.moto_server import private_network

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

moto = pytest.importorskip("moto")

AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION")


def test_make_gives_no_recipe_aws_keys_or_a_region_of_its_own(tmp_path):
    """A recipe (deploy-aws's among them) sees the user's AWS settings only: none here, so none at all."""
    probe = tmp_path / "probe.mk"
    probe.write_text("aws-probe:\n\t@env | grep '^AWS_' || true\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run(
        ["make", "--no-print-directory", "-f", "Makefile", "-f", str(probe), "aws-probe"],
        cwd=cfn.REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "", f"the Makefile sets {result.stdout.split()}"


@pytest.fixture
def profile(tmp_path, monkeypatch):
    """An AWS CLI profile ``ops`` (keys and region eu-west-2) as the only AWS configuration; moto's AWS."""
    config, credentials = tmp_path / "config", tmp_path / "credentials"
    config.write_text("[profile ops]\nregion = eu-west-2\n")
    credentials.write_text("[ops]\naws_access_key_id = AKIAOPSPROFILE\naws_secret_access_key = ops-secret\n")
    for name in (*AWS_VARIABLES, "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_DYNAMODB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_PROFILE", "ops")
    with moto.mock_aws():
        yield


def dry_run(region: str, region_args: list[str], capsys, monkeypatch) -> tuple[int, list[str]]:
    """`pipelines aws-stack deploy --dry-run` in ``region`` with every prerequisite there (docs/aws.md's network in
    moto's EC2, a Docker daemon, the test's Prefect server); (exit, stderr lines)."""
    import boto3
    from prefect.settings import PREFECT_API_URL

    net = private_network(boto3.session.Session().client("ec2", region_name=region))
    argv = ["aws-stack", "deploy", "--env", "dev", "--vpc", net["vpc"], "--subnets", ",".join(net["subnets"])]
    argv += ["--security-groups", ",".join(net["security_groups"]), "--prefect-api-url", PREFECT_API_URL.value()]
    argv += ["--image-tag", "1", "--dry-run"]
    with docker_standin() as docker:
        monkeypatch.setenv("DOCKER_HOST", docker.host)
        code = cli.main(argv + region_args)
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    ("setting", "region_args", "expected"),
    [
        ({}, [], "eu-west-2"),  # the profile's region
        ({"AWS_REGION": "ap-southeast-2"}, [], "ap-southeast-2"),  # AWS_REGION over the profile's
        ({"AWS_REGION": "ap-southeast-2"}, ["--region", "ca-central-1"], "ca-central-1"),  # --region over both
    ],
)
def test_the_deploy_changes_the_region_boto3_resolves_and_says_which_account_first(
    profile, capsys, monkeypatch, setting, region_args, expected
):
    import boto3

    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    code, said = dry_run(expected, region_args, capsys, monkeypatch)
    assert code == 0, said
    assert re.fullmatch(rf"==> AWS account 123456789012 \(arn:aws:\S+\), region {expected}: about to plan .*", said[0])
    buckets = {b["Name"] for b in boto3.session.Session().client("s3", region_name=expected).list_buckets()["Buckets"]}
    assert f"pipelines-artifacts-123456789012-{expected}" in buckets
    regions = {r for r in ("us-east-1", "eu-west-2", "ap-southeast-2", "ca-central-1") if r != expected}
    assert not [b for b in buckets if any(b.endswith(r) for r in regions)]


def test_no_region_anywhere_is_refused_before_any_call(tmp_path, monkeypatch, capsys):
    for name in (*AWS_VARIABLES, "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    code = cli.main(["aws-stack", "destroy", "--env", "dev"])
    assert code == 2 and "no AWS region: give --region" in capsys.readouterr().err
