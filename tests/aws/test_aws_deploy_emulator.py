"""infra/pipelines.template.json deployed to moto's CloudFormation (the moto server of tests/helpers/s3.py), then
the ETL run on what it created: a file put in the bucket → S3 notification → the ETL queue → the ETL listener, started
with the command and environment of its ECS service's task definition → Parquet in the bucket.

What moto cannot do is bridged here, each step named:
- moto's CloudFormation creates a bucket with its encryption and tags only; the template's
  NotificationConfiguration and LifecycleConfiguration are applied through the S3 API, translated from the
  template's own properties (`apply_bucket_configuration`);
- it lists AWS::SQS::QueuePolicy and AWS::S3::BucketPolicy as blank entries and applies neither: their policy
  documents are set through the SQS and S3 APIs. moto's S3 evaluates the bucket policy: a put over plain HTTP
  is refused (TLS only), so the policy is checked, then removed, since the stand-ins here speak plain HTTP;
- DynamoDB Local stands in for the tables: each is created there from the template's own properties;
- no container runs: the listener's ecs deployment's flow runs as a process here (in AWS its service runs the
  deployment's own run: deployments/ecs_listener.py), with the task definition's environment plus the endpoints of
  the stand-ins, and the merge runs inline (`merge_deployment=None`) since no ECS worker can
  start the `ndjson-merge/ecs` deployment's task.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError

from infra import cloudformation as cfn
from tasks.core import state_store
from tasks.core.registry import table_specs
from tasks.core.tables import ensure_tables
from tasks.etl import keys
from tasks.landing import sqs
from tests.helpers.crashpoints import REPO_ROOT, child_env

DAY = "2026-02-01"
ACCOUNT = "123456789012"  # moto's account
POLICIES = ("AWS::SQS::QueuePolicy", "AWS::S3::BucketPolicy")  # types moto's CloudFormation leaves out
LEFT_OUT = (*POLICIES, "AWS::CloudWatch::Alarm")  # likewise (tests/aws/test_aws_health_metrics.py reads their metric)


def client(service: str, endpoint: str):
    """A boto3 client of the moto server."""
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1")


def resolve(value, values: dict[str, str]):
    """A template value with ``Ref``/``Fn::Sub``/``Fn::GetAtt … Arn`` filled from ``values`` (logical id or
    parameter -> physical value, ``{id}.Arn`` -> ARN), as CloudFormation fills it."""
    if isinstance(value, list):
        return [resolve(v, values) for v in value]
    if not isinstance(value, dict):
        return value
    if "Ref" in value:
        return values[value["Ref"]]
    if "Fn::Sub" in value:
        text = value["Fn::Sub"]
        for name, physical in sorted(values.items(), key=lambda kv: -len(kv[0])):
            if physical is not None:
                text = text.replace(f"${{{name}}}", physical)
        assert "${" not in text, text
        return text
    if "Fn::GetAtt" in value:
        return values[".".join(value["Fn::GetAtt"])]
    return {k: resolve(v, values) for k, v in value.items()}


def apply_bucket_configuration(s3, bucket: str, properties: dict) -> None:
    """The template's bucket notifications and lifecycle rules through the S3 API (what AWS's CloudFormation
    does with them and moto's does not)."""
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": c["Queue"],
                    "Events": [c["Event"]],
                    "Filter": {
                        "Key": {
                            "FilterRules": [
                                {"Name": r["Name"], "Value": r["Value"]} for r in c["Filter"]["S3Key"]["Rules"]
                            ]
                        }
                    },
                }
                for c in properties["NotificationConfiguration"]["QueueConfigurations"]
            ]
        },
    )
    rules = []
    for rule in properties["LifecycleConfiguration"]["Rules"]:
        api = {"ID": rule["Id"], "Status": rule["Status"], "Filter": {"Prefix": rule["Prefix"]}}
        if "ExpirationInDays" in rule:
            api["Expiration"] = {"Days": rule["ExpirationInDays"]}
        for key in ("AbortIncompleteMultipartUpload", "NoncurrentVersionExpiration"):
            if key in rule:
                api[key] = rule[key]
        rules.append(api)
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rules})


@pytest.fixture
def stack(s3_endpoint, monkeypatch):
    """The template deployed to moto's CloudFormation with a fresh Env and bucket; its physical ids and outputs."""
    from prefect.settings import PREFECT_API_URL

    env, bucket = f"t{uuid.uuid4().hex[:8]}", f"pipelines-{uuid.uuid4().hex[:12]}"
    ec2 = client("ec2", s3_endpoint)
    parameters = {
        "Env": env,
        "BucketName": bucket,
        "ImageTag": "test",
        "PrefectApiUrl": PREFECT_API_URL.value(),
        "VpcId": ec2.describe_subnets()["Subnets"][0]["VpcId"],
        "Subnets": ec2.describe_subnets()["Subnets"][0]["SubnetId"],
        "SecurityGroups": ec2.describe_security_groups()["SecurityGroups"][0]["GroupId"],
    }
    formation = client("cloudformation", s3_endpoint)
    name = f"pipelines-{env}"
    formation.create_stack(
        StackName=name,
        TemplateBody=cfn.TEMPLATE_PATH.read_text(),
        Capabilities=["CAPABILITY_IAM"],
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
    )
    deadline = time.monotonic() + 120
    while (status := formation.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]) == "CREATE_IN_PROGRESS":
        assert time.monotonic() < deadline, "the stack did not finish"
        time.sleep(0.5)
    described = formation.describe_stacks(StackName=name)["Stacks"][0]
    assert status == "CREATE_COMPLETE", described.get("StackStatusReason")
    created = formation.list_stack_resources(StackName=name)["StackResourceSummaries"]
    yield {
        "name": name,
        "env": env,
        "bucket": bucket,
        "parameters": parameters,
        "resources": created,
        "outputs": {o["OutputKey"]: o["OutputValue"] for o in described["Outputs"]},
    }
    formation.delete_stack(StackName=name)


def physical_values(stack: dict, endpoint: str) -> dict[str, str]:
    """Parameters, pseudo parameters, physical ids and the template's ARNs, as CloudFormation resolved them."""
    defaults = {
        k: p["Default"] for k, p in json.loads(cfn.TEMPLATE_PATH.read_text())["Parameters"].items() if "Default" in p
    }
    values = {
        **defaults,
        **stack["parameters"],
        "AWS::Region": "us-east-1",
        "AWS::AccountId": ACCOUNT,
        "AWS::Partition": "aws",
        "AWS::URLSuffix": "amazonaws.com",
        "AWS::NoValue": None,
    }
    sqs_client = client("sqs", endpoint)
    for resource in stack["resources"]:
        logical, physical = resource["LogicalResourceId"], resource["PhysicalResourceId"]
        values[logical] = physical
        if resource.get("ResourceType") == "AWS::SQS::Queue":
            attributes = sqs_client.get_queue_attributes(QueueUrl=physical, AttributeNames=["QueueArn"])["Attributes"]
            values[f"{logical}.Arn"] = attributes["QueueArn"]
        elif resource.get("ResourceType") == "AWS::Events::Rule":
            values[f"{logical}.Arn"] = client("events", endpoint).describe_rule(Name=physical)["Arn"]
    values["Bucket.Arn"] = f"arn:aws:s3:::{stack['bucket']}"
    return values


@pytest.mark.sweep  # a stack, tables and a listener process running the ETL to Parquet: `make test-sweep`
@pytest.mark.timeout(600)
def test_the_template_deploys_and_a_file_put_in_its_bucket_becomes_parquet(stack, s3_endpoint, tmp_path, monkeypatch):
    template = json.loads(cfn.TEMPLATE_PATH.read_text())
    policies = [n for n, r in template["Resources"].items() if r["Type"] in POLICIES]
    left_out = [n for n, r in template["Resources"].items() if r["Type"] in LEFT_OUT]
    made = [r["LogicalResourceId"] for r in stack["resources"]]
    assert sorted(made) == sorted([n for n in template["Resources"] if n not in left_out] + [""] * len(left_out))
    assert {r["ResourceStatus"] for r in stack["resources"]} == {"CREATE_COMPLETE"}
    values = physical_values(stack, s3_endpoint)
    env, bucket = stack["env"], stack["bucket"]

    # what the stack created, as the services' APIs report it
    ecs = client("ecs", s3_endpoint)
    services = ecs.describe_services(
        cluster=stack["outputs"]["EcsCluster"],
        services=[values[n] for n, r in template["Resources"].items() if r["Type"] == "AWS::ECS::Service"],
    )["services"]
    # the ecs pool's worker, the maintenance service's process worker, one listener per landing queue
    assert len(services) == 2 + len(sqs.landing_queues()) and {s["desiredCount"] for s in services} == {1}
    groups = client("logs", s3_endpoint).describe_log_groups(logGroupNamePrefix=f"/pipelines/{env}/")["logGroups"]
    assert len(groups) == 3 + len(sqs.landing_queues()) and {g["retentionInDays"] for g in groups} == {3}
    queue_url = stack["outputs"]["EtlQueueUrl"]
    attributes = client("sqs", s3_endpoint).get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])[
        "Attributes"
    ]
    assert attributes["VisibilityTimeout"] == "360" and json.loads(attributes["RedrivePolicy"])["maxReceiveCount"] == 3
    roles = client("iam", s3_endpoint).list_roles()["Roles"]
    made_roles = {r["RoleName"] for r in roles}
    assert {values[n] for n in ("TaskRole", "ExecutionRole", "WorkerRole", "MaintenanceRole")} <= made_roles

    # the stand-ins: the bucket's configuration moto's CloudFormation leaves out, the tables in DynamoDB Local
    s3 = client("s3", s3_endpoint)
    for name in policies:
        properties = resolve(template["Resources"][name]["Properties"], values)
        if "Queues" in properties:
            for url in properties["Queues"]:
                client("sqs", s3_endpoint).set_queue_attributes(
                    QueueUrl=url, Attributes={"Policy": json.dumps(properties["PolicyDocument"])}
                )
        else:
            s3.put_bucket_policy(Bucket=properties["Bucket"], Policy=json.dumps(properties["PolicyDocument"]))
    with pytest.raises(ClientError, match="Forbidden|AccessDenied"):
        s3.put_object(Bucket=bucket, Key="pipelines/plain-http", Body=b"x")  # the bucket policy: TLS only
    s3.delete_bucket_policy(Bucket=bucket)
    apply_bucket_configuration(s3, bucket, resolve(template["Resources"]["Bucket"]["Properties"], values))
    assert len(s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]) == 4
    names = {}
    for logical in table_specs():
        properties = resolve(template["Resources"][cfn.logical_id("table", logical)]["Properties"], values)
        ttl = properties.pop("TimeToLiveSpecification", None)
        request = {
            k: v
            for k, v in properties.items()
            if k in ("TableName", "KeySchema", "AttributeDefinitions", "BillingMode", "GlobalSecondaryIndexes")
        }
        state_store.client().create_table(**request)
        if ttl:
            state_store.client().get_waiter("table_exists").wait(TableName=request["TableName"])
            state_store.client().update_time_to_live(TableName=request["TableName"], TimeToLiveSpecification=ttl)
        names[logical] = request["TableName"]
    assert set(ensure_tables(table_specs(), names).values()) == {
        "exists"
    }  # the code's own check finds the keys it expects

    # the ETL listener as its service runs it: the task definition's command and environment
    family = next(v for k, v in values.items() if k == "EtlListenerTaskDefinition")
    definition = ecs.describe_task_definition(taskDefinition=family)["taskDefinition"]
    container = definition["containerDefinitions"][0]
    command, environment = container["command"], {e["name"]: e["value"] for e in container["environment"]}
    assert environment["OBJECT_STORE_BASE_URL"] == f"s3://{bucket}/pipelines" and environment["TABLE_ENV"] == env
    assert environment[sqs.queue_url_variable("etl")] == queue_url
    assert command == [*cfn.LISTENER_COMMAND, "ndjson-listen/ecs"]  # in AWS: the ecs deployment's own run
    # here the deployment's flow with its parameters, in a process (no deployment of it on the test server)
    deployment = cfn.listener_deployments()["etl"]
    parameters = deployment["parameters"] | {"merge_deployment": None}  # no ECS worker here: the merge runs inline
    scratch = {k: v.replace(cfn.SCRATCH, str(tmp_path)) for k, v in environment.items() if v.startswith(cfn.SCRATCH)}
    stand_ins = {
        "AWS_ENDPOINT_URL_S3": s3_endpoint,
        "AWS_ENDPOINT_URL_SQS": s3_endpoint,
        "ETL_EXPECTED_FILE_SIZE_MB": "0.001",
        "ETL_SIZE_TOLERANCE_PERCENT": "99",
        "ETL_MAX_FILES_PER_MANIFEST": "2",
        **{f"TABLE_{logical.upper()}": name for logical, name in names.items()},
    }
    base = {k: v for k, v in child_env().items() if not k.startswith(("TABLE_", "OBJECT_STORE", "PIPELINES_"))}
    log = open(tmp_path / "listener.log", "w")
    run_flow = (
        "import json, sys; from prefect.flows import load_flow_from_entrypoint; "
        "load_flow_from_entrypoint(sys.argv[1])(**json.loads(sys.argv[2]))"
    )
    listener = subprocess.Popen(
        [sys.executable, "-c", run_flow, deployment["entrypoint"], json.dumps(parameters)],
        cwd=REPO_ROOT,
        env={**base, **environment, **scratch, **stand_ins},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        rows = {f"{i}-{k}": {"id": f"{i}-{k}", "n": k} for i in range(2) for k in range(3)}
        for i in range(2):
            body = b"".join(json.dumps(r).encode() + b"\n" for r in rows.values() if r["id"].startswith(f"{i}-"))
            s3.put_object(Bucket=bucket, Key=f"pipelines/{keys.input_key(DAY, f'part-{i}.ndjson')}", Body=body)
        prefix = f"pipelines/{keys.merged_output_prefix(DAY)}"
        deadline, parquet = time.monotonic() + 240, []
        while not parquet and time.monotonic() < deadline and listener.poll() is None:
            listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
            parquet = [o["Key"] for o in listed if o["Key"].endswith(".parquet")]
            time.sleep(1)
        assert parquet, (tmp_path / "listener.log").read_text()[-4000:]
        merged = [
            row
            for key in parquet
            for row in pq.read_table(pa.BufferReader(s3.get_object(Bucket=bucket, Key=key)["Body"].read())).to_pylist()
        ]
        assert sorted(r["id"] for r in merged) == sorted(rows)  # each line exactly once
        assert all(r["n"] == str(rows[r["id"]]["n"]) for r in merged), merged  # the seed's Glue job writes strings
        assert all(
            r["_source_file"] == f"s3://{bucket}/pipelines/{keys.input_key(DAY, 'part-' + r['id'][0] + '.ndjson')}"
            for r in merged
        ), merged
        deadline = time.monotonic() + 60  # the listener deletes each message once its files are tracked
        while (
            (
                left := client("sqs", s3_endpoint).get_queue_attributes(
                    QueueUrl=queue_url,
                    AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
                )["Attributes"]
            )
            and any(v != "0" for v in left.values())
            and time.monotonic() < deadline
        ):
            time.sleep(1)
        assert set(left.values()) == {"0"}, left
    finally:
        listener.kill()
        listener.wait(timeout=30)
        log.close()
