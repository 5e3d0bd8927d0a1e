"""The stack as AWS takes it: the template within CloudFormation's quotas and passed the way the AWS CLI passes it
(inline up to 51,200 bytes, else through an S3 bucket), deletion policies chosen per resource, and an update that
keeps the data. moto stands in for CloudFormation, S3 and DynamoDB (in this process); it enforces none of the size
limits, so ``deployments.aws.template_argument`` and the CLI's rule below enforce them here.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter

import pytest

from deployments import aws
from deployments.generated_part import MarkersMissing
from infra import aws_docs, cost
from infra import cloudformation as cfn
from tests.helpers.aws_stack import deploy_template, stack_parameters

moto = pytest.importorskip("moto")

DOCS = cfn.REPO_ROOT / "docs" / "aws.md"
ENV = "dev"


def cli_deploy_refusal(command: str) -> str | None:
    """What ``aws cloudformation deploy`` says before it calls AWS (None: it goes on): a missing template file, or
    a template over 51,200 bytes without ``--s3-bucket`` (awscli's deploy command checks the file's size)."""
    words = shlex.split(command.replace("\\\n", " "))
    if words[:3] != ["aws", "cloudformation", "deploy"]:
        raise ValueError(f"not a deploy command: {command[:60]}")
    options = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    template = cfn.REPO_ROOT / options["--template-file"]
    if not template.is_file():
        return f"Invalid template path {template}"
    if template.stat().st_size > aws.INLINE_TEMPLATE_BYTES and "--s3-bucket" not in options:
        return aws.INLINE_REFUSAL
    return None


def docs_deploy_commands() -> list[str]:
    """Every ``aws cloudformation deploy`` command in docs/aws.md, continuation lines joined."""
    text = DOCS.read_text()
    return [m.group(0) for m in re.finditer(r"aws cloudformation deploy(?:[^\n]*\\\n)*[^\n]*", text)]


def test_the_cli_would_refuse_the_template_inline_and_the_docs_command_passes_a_bucket():
    size = cfn.TEMPLATE_PATH.stat().st_size
    bare = f"aws cloudformation deploy --stack-name s --template-file {cfn.TEMPLATE_PATH.relative_to(cfn.REPO_ROOT)}"
    assert cli_deploy_refusal(bare) == (aws.INLINE_REFUSAL if size > aws.INLINE_TEMPLATE_BYTES else None)
    commands = docs_deploy_commands()
    assert commands, "docs/aws.md gives no `aws cloudformation deploy` command"
    assert [cli_deploy_refusal(c) for c in commands] == [None] * len(commands), commands
    assert aws.quota_violations(cfn.TEMPLATE_PATH.read_text()) == []


def test_a_template_cloudformation_would_refuse_is_refused_before_any_call():
    big = {"Resources": {f"R{i}": {"Type": "AWS::SQS::Queue"} for i in range(501)}}
    assert aws.quota_violations(json.dumps(big)) == ["501 resources; CloudFormation takes at most 500"]
    many = {"Parameters": {f"P{i}": {"Type": "String"} for i in range(201)}, "Resources": {"Q": {"Type": "X"}}}
    assert aws.quota_violations(json.dumps(many)) == ["201 parameters; CloudFormation takes at most 200"]
    padded = {"Description": "x", "Resources": {"Q": {"Type": "AWS::SQS::Queue", "Metadata": {"pad": "x" * 10**6}}}}
    assert aws.quota_violations(json.dumps(padded))[0].startswith("the template is 1,000,")
    with pytest.raises(ValueError, match="at most 500"):
        aws.template_argument(json.dumps(big), ENV)
    with pytest.raises(ValueError, match="must be deployed via an S3 Bucket"):  # big, no bucket: as the CLI
        aws.template_argument(cfn.render() + " " * aws.INLINE_TEMPLATE_BYTES, ENV)
    small = json.dumps({"Resources": {"Q": {"Type": "AWS::SQS::Queue"}}})
    assert aws.template_argument(small, ENV) == {"TemplateBody": small}


@pytest.fixture
def cloud(monkeypatch):
    """moto's AWS in this process; the parameters of a ``dev`` stack."""
    import boto3

    for name in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    with moto.mock_aws():
        session = boto3.Session(region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")
        yield session, stack_parameters(session, ENV, BucketName="pipelines-data-dev")


def deploy(session, parameters: dict[str, str], dry_run: bool = False) -> dict:
    """The committed template through the artifact bucket and a change set, as the one command deploys it."""
    return deploy_template(session, ENV, parameters, dry_run)


def test_the_template_deploys_through_the_artifact_bucket_and_an_update_keeps_the_data(cloud):
    session, parameters = cloud
    planned = deploy(session, parameters, dry_run=True)
    assert planned["action"] == "CREATE" and len(planned["changes"]) == len(cfn.template()["Resources"])
    created = deploy(session, parameters)
    assert created["action"] == "CREATE" and created["status"] == "CREATE_COMPLETE"
    dynamodb, s3 = session.client("dynamodb"), session.client("s3")
    tables = sorted(dynamodb.list_tables()["TableNames"])
    assert len(tables) == len(cfn.table_specs()) and all(t.endswith(f"-{ENV}") for t in tables), tables
    born = {t: dynamodb.describe_table(TableName=t)["Table"]["CreationDateTime"] for t in tables}
    dynamodb.put_item(TableName="granules-dev", Item={"granuleId": {"S": "g1"}, "status": {"S": "completed"}})
    s3.put_object(Bucket="pipelines-data-dev", Key="pipelines/pipeline/output/a.parquet", Body=b"kept")

    assert deploy(session, parameters) == {"action": "NONE", "changes": [], "status": "CREATE_COMPLETE"}
    updated = deploy(session, {**parameters, "ImageTag": "2"})
    assert updated["action"] == "UPDATE" and updated["status"] == "UPDATE_COMPLETE"
    assert {t: dynamodb.describe_table(TableName=t)["Table"]["CreationDateTime"] for t in tables} == born
    assert dynamodb.get_item(TableName="granules-dev", Key={"granuleId": {"S": "g1"}})["Item"]["status"]["S"] == (
        "completed"
    )
    assert s3.get_object(Bucket="pipelines-data-dev", Key="pipelines/pipeline/output/a.parquet")["Body"].read() == (
        b"kept"
    )
    stack = session.client("cloudformation").describe_stacks(StackName=f"pipelines-{ENV}")["Stacks"][0]
    assert {p["ParameterKey"]: p["ParameterValue"] for p in stack["Parameters"]}["ImageTag"] == "2"


def test_every_resource_has_the_deletion_policy_of_its_kind():
    """Data outlives the stack and a replacement, but a rolled-back first create removes it, so a retry does not
    meet "already exists"; everything else is rebuilt from the template."""
    for name, resource in cfn.template()["Resources"].items():
        policies = {k: resource.get(k) for k in ("DeletionPolicy", "UpdateReplacePolicy")}
        if resource["Type"] in ("AWS::DynamoDB::Table", "AWS::S3::Bucket"):
            assert policies == {"DeletionPolicy": "RetainExceptOnCreate", "UpdateReplacePolicy": "Retain"}, name
        else:
            assert policies == {"DeletionPolicy": "Delete", "UpdateReplacePolicy": "Delete"}, name


def test_every_named_resource_carries_the_env_so_two_environments_share_an_account():
    names = {
        "AWS::DynamoDB::Table": "TableName",
        "AWS::SQS::Queue": "QueueName",
        "AWS::ECS::Cluster": "ClusterName",
        "AWS::Logs::LogGroup": "LogGroupName",
        "AWS::ECS::TaskDefinition": "Family",
    }
    seen = 0
    for name, resource in cfn.template()["Resources"].items():
        if resource["Type"] in names:
            assert "${Env}" in json.dumps(resource["Properties"][names[resource["Type"]]]), name
            seen += 1
    assert seen > len(cfn.table_specs())
    for definition in (r for r in cfn.template()["Resources"].values() if r["Type"] == "AWS::ECS::TaskDefinition"):
        container = definition["Properties"]["ContainerDefinitions"][0]
        environment = {e["Name"]: e["Value"] for e in container["Environment"]}
        assert environment["TABLE_GRANULES"] == {"Fn::Sub": "granules-${Env}"}  # the code finds the renamed tables
        assert environment["TABLE_ENV"] == {"Ref": "Env"}


def test_env_is_as_long_as_its_longest_name_lets_it_be_and_no_longer():
    """Env's MaxLength is what the tightest name built from it leaves (an EventBridge rule name, 64): an Env one
    longer would fail CloudFormation's create halfway, at that resource, and is refused as a parameter instead."""
    template = json.loads(cfn.TEMPLATE_PATH.read_text())
    declared = template["Parameters"]["Env"]
    longest = declared["MaxLength"]
    names = cfn.env_names(template["Resources"])
    assert {kind for kind, _, _ in names} >= {"AWS::SQS::Queue", "AWS::Events::Rule", "AWS::CloudWatch::Alarm"}
    over = [
        (kind, text)
        for kind, prop, text in names
        if len(text.replace("${Env}", "e" * longest)) > cfn.NAME_LIMITS[kind, prop]
    ]
    assert over == []
    one_more = [
        text
        for kind, prop, text in names
        if len(text.replace("${Env}", "e" * (longest + 1))) > cfn.NAME_LIMITS[kind, prop]
    ]
    assert one_more, "MaxLength is below what the names allow"
    assert longest == 39 and one_more == ["pipelines-${Env}-ecs-task-state"]  # the 39: the rule's 64
    assert re.fullmatch(declared["AllowedPattern"], "dev-2") and not re.fullmatch(declared["AllowedPattern"], "dev-")
    assert aws.env_refusal("e" * longest) is None
    assert "1 to 39" in aws.env_refusal("e" * (longest + 1)) and aws.env_refusal("Dev") is not None
    with pytest.raises(ValueError, match="40 characters"):  # before any call to AWS
        aws.deploy("e" * 40, "us-east-1", "vpc-1", ["s"], ["g"], "http://api", tag="1")


def test_the_docs_counts_are_the_templates():
    """docs/aws.md's "What it creates" counts, each read from the template (they drifted once: 75/24 for 76/25;
    `pipelines generate` writes them now, and a new pipeline changes them)."""
    text = DOCS.read_text()
    resources = json.loads(cfn.TEMPLATE_PATH.read_text())["Resources"]
    kinds = Counter(r["Type"] for r in resources.values())
    alarms = {n: r for n, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    expected = {
        "resources": len(resources),
        "DynamoDB tables": kinds["AWS::DynamoDB::Table"],
        "landing queues (each with its dead-letter queue)": len(cfn.sqs.landing_queues()),
        "IAM roles": kinds["AWS::IAM::Role"],
        "log groups": kinds["AWS::Logs::LogGroup"],
        "Fargate services": kinds["AWS::ECS::Service"],
        "of them listeners": len(cfn.listener_deployments()),
        "CloudWatch alarms": len(alarms),
        # all but the maintenance worker's, which reads Container Insights
        "of them pipeline-health's": len(alarms) - 1,
        # the cost section's figures are infra/cost.py's (tests/aws/test_aws_cost.py)
    }
    section = text[text.index(aws_docs.STACK_BEGIN) : text.index(aws_docs.STACK_END)]
    found = dict(re.findall(r"^\| ([^|]+?) \| (\d+) \|$", section, re.MULTILINE))
    assert {kind: int(number) for kind, number in found.items()} == expected
    assert section.count("\n| ") == len(expected) + 1  # the header, then a row for each count and no other
    assert aws_docs.stack_table(resources) in text  # as `pipelines generate` writes it


def test_a_doc_without_the_markers_is_refused_naming_them(monkeypatch, tmp_path):
    bare = tmp_path / "aws.md"
    bare.write_text("# AWS\n" + cost.DOCS_BEGIN + "\n" + cost.DOCS_END + "\n")
    monkeypatch.setattr(aws_docs, "DOC", bare)
    with pytest.raises(MarkersMissing, match="aws.md has no '<!-- stack: generated"):
        aws_docs.render_doc()


def test_the_docs_deploy_command_gives_every_parameter_without_a_default():
    parameters = json.loads(cfn.TEMPLATE_PATH.read_text())["Parameters"]
    required = {name for name, declared in parameters.items() if "Default" not in declared}
    for command in docs_deploy_commands():
        words = shlex.split(command.replace("\\\n", " "))
        overrides = words[words.index("--parameter-overrides") + 1 :]
        given = {word.split("=", 1)[0] for word in overrides if "=" in word and not word.startswith("--")}
        assert required <= given, f"missing {sorted(required - given)}"
