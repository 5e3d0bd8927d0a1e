"""What IAM would decide, checked here: each role's policy from the template, resolved for a stack, evaluated
(conditions included, ``infra/policy_eval.py``) on the AWS calls the code makes, and linted by parliament.

The sweep test runs the emulator tests with every AWS call recorded (tests/helpers/aws_calls.py: botocore's
``before-parameter-build`` hook in the test process and its children, the role read from the calling code) and
evaluates each call against its role; the fast tests pin the cases an AWS deployment met first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from infra import cloudformation as cfn
from infra.policy_eval import (
    Principal,
    Request,
    ResourcePolicy,
    condition_holds,
    decide,
    resource_policies,
    role_statements,
    stack_values,
)
from tasks.gpu.backends import GPU_CLUSTER_TAG
from tests.helpers import aws_calls

TOOLS = cfn.REPO_ROOT / ".venv-tools" / "bin"
RECORDED_MODULES = (  # the emulator tests whose calls are evaluated: the worker, flow-run tasks, listeners
    "tests/stack/test_ecs.py",
    "tests/etl/test_etl_catalog.py",
    "tests/health/test_health_service_alarms.py",
    "tests/landing/test_landing_sqs.py",
    "tests/aws/test_aws_s3.py",
    "tests/aws/test_aws_health_metrics.py",
    "tests/aws/test_aws_listener_service.py",
    "tests/gpu/test_gpu_backends.py::test_ecs_backend_api_shapes_against_moto",  # the GPU cluster's ECS and EC2 calls
    "tests/video/test_video_model.py::test_video_process_through_the_async_endpoint",  # SageMaker's runtime, stand-in
    "tests/video/test_video_model.py::test_an_endpoint_failure_fails_the_segment_with_its_reason",
)
RECORDED_SWEEP = (  # sweep tests themselves
    "tests/aws/test_aws_observer.py",  # the worker's observer reading its queue
    "tests/aws/test_aws_trigger.py",  # the trigger's records-prefect-state run, on a process worker
    "tests/aws/test_aws_dask.py",  # flow runs and their Dask workers (run them with the task role) on S3
)
# calls a test makes on purpose against what is not the stack's, whose failure it asserts; AWS denies them
# (AccessDenied), which the code meets on the same path: (action, the resource)
DENIED_ON_PURPOSE = {
    # test_gpu_backends: a poll on a cluster that is not the GPU one fails as a BackendError
    ("ecs:DescribeTasks", f"arn:aws:ecs:{aws_calls.REGION}:{aws_calls.ACCOUNT}:task/nope/abc"),
}
# parliament's community auditors flag these on purpose; each is needed and scoped
JUSTIFIED = {
    ("ExecutionRole", "CREDENTIALS_EXPOSURE"): "ecr:GetAuthorizationToken is how ECS pulls the image from ECR",
    ("WorkerRole", "PERMISSIONS_MANAGEMENT_ACTIONS"): "iam:PassRole of the flow runs' two roles, only to ECS tasks",
    ("TaskRole", "PERMISSIONS_MANAGEMENT_ACTIONS"): "iam:PassRole of the GPU task definitions' one role, to ECS tasks",
    ("MaintenanceRole", "PERMISSIONS_MANAGEMENT_ACTIONS"): "gpu-sweep's restarts pass that same role, to ECS tasks",
}
PARLIAMENT = """
import json, sys
from parliament import analyze_policy_string
for role, policy in json.load(sys.stdin).items():
    for community in (False, True):
        found = analyze_policy_string(json.dumps(policy), include_community_auditors=community).findings
        for f in found:
            print(json.dumps([role, f.issue, str(f.detail), community]))
"""


@pytest.fixture(scope="module")
def world() -> aws_calls.StackWorld:
    """The template bound to a ``test`` stack."""
    return aws_calls.StackWorld()


def statements_of(world: aws_calls.StackWorld, role: str) -> list[dict]:
    """The role's resolved statements."""
    return role_statements(world.template, role, world.values)


def principal_of(world: aws_calls.StackWorld, role: str) -> Principal:
    """The role as IAM decides for it: its statements, its ARN, and the stack's resource policies."""
    on_resources = resource_policies(world.template, world.values)
    return Principal(statements_of(world, role), world.values[f"{role}.Arn"], on_resources)


def evaluate(world: aws_calls.StackWorld, calls: list[dict]) -> tuple[list[tuple], int]:
    """Each call's authorizations decided under its role's policies and the resources' own: (denied ones, how many
    were decided)."""
    requests = [(call, request) for call in calls for request in aws_calls.authorizations(world, call)]
    supported = aws_calls.supported_condition_keys({r.action for _, r in requests})
    policies = {role: principal_of(world, role) for role in set(aws_calls.TEMPLATE_ROLES.values())}
    denied = []
    for call, request in requests:
        seen = aws_calls.with_supported_keys(request, supported)
        allowed, why = decide(policies[aws_calls.TEMPLATE_ROLES[call["role"]]], seen)
        if not allowed:
            denied.append((call["role"], seen.action, seen.resource, why, call["where"]))
    return sorted(set(denied)), len(requests)


def run_task_as_prefect_aws(world: aws_calls.StackWorld) -> list[dict]:
    """The worker's calls launching one flow run, as prefect-aws makes them (tests/stack/test_ecs.py records the real
    ones): register the task definition, run it on the cluster with the flow run's tags, passing the two roles."""
    roles = {"taskRoleArn": world.values["TaskRole.Arn"], "executionRoleArn": world.values["ExecutionRole.Arn"]}
    register = {"family": "prefect_ndjson-merge", "containerDefinitions": [], **roles}
    run = {
        "cluster": world.values["Cluster"],
        "taskDefinition": "prefect_ndjson-merge:1",
        "launchType": "FARGATE",
        "tags": [{"key": "prefect.io/flow-run-id", "value": "0f"}],
        "overrides": {"taskRoleArn": roles["taskRoleArn"]},
    }
    worker = {"service": "ecs", "role": "worker", "where": "prefect_aws:0"}
    return [
        {**worker, "operation": "RegisterTaskDefinition", "params": register},
        {**worker, "operation": "RunTask", "params": run},
    ]


def test_the_worker_may_launch_a_tagged_flow_run_on_its_cluster(world):
    assert evaluate(world, run_task_as_prefect_aws(world)) == ([], 5)  # register, run, tag on create, 2 PassRoles


def test_tag_resource_under_an_ecs_cluster_condition_is_denied_as_aws_denies_it(world):
    """The worker role's earlier statement: TagResource requests carry no ``ecs:cluster`` key, so it never held."""
    keys = aws_calls.supported_condition_keys({"ecs:TagResource", "ecs:RunTask"})
    assert "ecs:cluster" not in keys["ecs:TagResource"] and "ecs:cluster" in keys["ecs:RunTask"]
    earlier = [
        {
            "Sid": "RunFlowRuns",
            "Effect": "Allow",
            "Action": ["ecs:RunTask", "ecs:TagResource"],
            "Resource": [
                "arn:aws:ecs:us-east-1:123456789012:task-definition/*",
                "arn:aws:ecs:us-east-1:123456789012:task/pipelines-test/*",
            ],
            "Condition": {"ArnEquals": {"ecs:cluster": world.values["Cluster.Arn"]}},
        }
    ]
    tag = Request(
        "ecs:TagResource",
        "arn:aws:ecs:us-east-1:123456789012:task/pipelines-test/1",
        {"ecs:cluster": (world.values["Cluster.Arn"],), "ecs:CreateAction": ("RunTask",)},
    )
    assert decide(earlier, aws_calls.with_supported_keys(tag, keys)) == (
        False,
        "no statement allows it (implicit deny)",
    )
    assert decide(earlier, tag)[0]  # only the key's absence denies it
    assert decide(statements_of(world, "WorkerRole"), aws_calls.with_supported_keys(tag, keys))[0]
    elsewhere = Request("ecs:TagResource", world.values["Cluster.Arn"], {"ecs:CreateAction": ("RunTask",)})
    assert not decide(statements_of(world, "WorkerRole"), aws_calls.with_supported_keys(elsewhere, keys))[0]


def test_the_task_role_reads_metrics_and_registers_glue_partitions(world):
    calls = [
        {
            "service": "cloudwatch",
            "operation": "GetMetricStatistics",
            "role": "task",
            "where": "tasks/etl/alarms.py",
            "params": {"Namespace": "AWS/DynamoDB", "MetricName": "ReadThrottleEvents"},
        },
        *(
            {
                "service": "glue",
                "operation": operation,
                "role": "task",
                "where": "tasks/etl/catalog.py",
                "params": {"DatabaseName": "ndjson_parquet", "TableName": "merged_parquet", "Name": "merged_parquet"},
            }
            for operation in ("GetTable", "CreatePartition", "GetPartition", "UpdatePartition")
        ),
        {
            "service": "glue",
            "operation": "CreateDatabase",
            "role": "task",
            "where": "tasks/etl/catalog.py",
            "params": {"DatabaseInput": {"Name": "ndjson_parquet"}},
        },
    ]
    assert evaluate(world, calls) == ([], 1 + 4 * 3 + 2)
    other = Request("glue:CreatePartition", "arn:aws:glue:us-east-1:123456789012:table/other_db/t")
    assert not decide(statements_of(world, "TaskRole"), other)[0]  # the catalog grant names its database
    put = {"service": "cloudwatch", "operation": "PutMetricData", "role": "task", "where": "tasks/health/cloudwatch.py"}
    assert evaluate(world, [{**put, "params": {"Namespace": "Pipelines", "MetricData": []}}]) == ([], 1)
    denied, _ = evaluate(world, [{**put, "params": {"Namespace": "AWS/DynamoDB", "MetricData": []}}])
    assert [d[1] for d in denied] == ["cloudwatch:PutMetricData"]  # only pipeline-health's own namespace


def maintenance_calls(world: aws_calls.StackWorld) -> list[dict]:
    """What the maintenance service's flows call in AWS (read from their code): the sweeps' and cleanup's records
    and objects, pipeline-health's queue depths and metrics, gpu-sweep's and gpu-node-healthcheck's cluster."""
    world.own("bucket", "data")
    world.own("cluster", "gpu")
    world.resource_tags = {"i-1": {GPU_CLUSTER_TAG: "gpu"}}
    prefix = world.values["StorePrefix"]
    on = {"role": "maintenance", "where": "flows/"}
    gpu = {**on, "service": "ecs", "where": "tasks/gpu/backends.py:0"}
    instance = f"{world.gpu_cluster().replace(':cluster/', ':container-instance/')}/c1"
    update = {"Update": {"TableName": "phspectra-runs"}}
    check = {"ConditionCheck": {"TableName": "ecs_node"}}
    lock = "video-reassembly-locks-test"
    return [
        {**on, "service": "dynamodb", "operation": "Query", "params": {"TableName": "video-jobs-test"}},
        {**on, "service": "dynamodb", "operation": "TransactWriteItems", "params": {"TransactItems": [update, check]}},
        {**on, "service": "dynamodb", "operation": "DeleteItem", "params": {"TableName": lock}},
        {**on, "service": "s3", "operation": "ListObjectsV2", "params": {"Bucket": "data", "Prefix": f"{prefix}/"}},
        {**on, "service": "s3", "operation": "PutObject", "params": {"Bucket": "data", "Key": f"{prefix}/runs/r"}},
        {**on, "service": "s3", "operation": "DeleteObject", "params": {"Bucket": "data", "Key": f"{prefix}/output/j"}},
        {**on, "service": "sqs", "operation": "GetQueueUrl", "params": {"QueueName": "video-chunking-dlq-test"}},
        {
            **on,
            "service": "sqs",
            "operation": "GetQueueAttributes",
            "params": {"QueueUrl": "http://q/1/video-chunking-test"},
        },
        {**on, "service": "cloudwatch", "operation": "GetMetricStatistics", "params": {"Namespace": "AWS/SQS"}},
        {**on, "service": "cloudwatch", "operation": "PutMetricData", "params": {"Namespace": "Pipelines"}},
        {**gpu, "operation": "ListContainerInstances", "params": {"cluster": "gpu"}},
        {**gpu, "operation": "ListTasks", "params": {"cluster": "gpu", "containerInstance": instance}},
        {**gpu, "operation": "StartTask", "params": {"cluster": "gpu", "taskDefinition": "dcgm"}},
        {**gpu, "operation": "StopTask", "params": {"cluster": "gpu", "task": "t1"}},
        {**gpu, "service": "ec2", "operation": "RebootInstances", "params": {"InstanceIds": ["i-1"]}},
    ]


def test_the_maintenance_role_allows_what_its_flows_do_and_nothing_of_the_pipelines_heavy_work(world):
    """Issue 51: the maintenance service's role is its flows' share of the task role: their records, objects, queue
    depths, metrics and the GPU cluster; not a landing message (the listeners' own), the Glue catalog (the merge's),
    a SageMaker endpoint (video-process's inference), nor a flow-run task on the stack's cluster (the worker's)."""
    calls = maintenance_calls(world)
    assert evaluate(world, calls) == ([], len(calls) + 1)  # a transaction's two items
    sqs = {"service": "sqs", "role": "maintenance", "where": "flows/"}
    queue = {"QueueUrl": "http://q/1/ndjson-parquet-file-events-test"}
    denied_calls = [
        *({**sqs, "operation": op, "params": queue} for op in ("ReceiveMessage", "DeleteMessage")),
        {**sqs, "operation": "ChangeMessageVisibility", "params": queue},
        {
            "service": "glue",
            "operation": "CreatePartition",
            "role": "maintenance",
            "where": "tasks/etl/catalog.py",
            "params": {"DatabaseName": "ndjson_parquet", "TableName": "merged_parquet"},
        },
        {
            "service": "sagemaker-runtime",
            "operation": "InvokeEndpointAsync",
            "role": "maintenance",
            "where": "tasks/video/inference.py:0",
            "params": {"EndpointName": "text-redact"},
        },
        *({**call, "role": "maintenance"} for call in run_task_as_prefect_aws(world)),
    ]
    denied, decided = evaluate(world, denied_calls)
    assert {d[1] for d in denied} == {
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "glue:CreatePartition",
        "sagemaker:InvokeEndpointAsync",
        "ecs:RegisterTaskDefinition",
        "ecs:RunTask",
        "ecs:TagResource",
        "iam:PassRole",
    }
    assert len(denied) == decided  # every authorization of them
    # the same calls as the task role: it may (what the pipelines' heavy runs do), so only the role differs
    as_task = [{**call, "role": "task"} for call in denied_calls[:5]]
    assert evaluate(world, as_task)[0] == []


def test_conditions_hold_as_iam_evaluates_them():
    context = {"aws:SecureTransport": ("true",), "ecs:cluster": ("arn:aws:ecs:r:1:cluster/c",)}
    assert condition_holds({"Bool": {"aws:SecureTransport": "true"}}, context)
    assert condition_holds({"ArnLike": {"ecs:cluster": "arn:aws:ecs:*:1:cluster/*"}}, context)
    assert not condition_holds({"ArnEquals": {"ecs:cluster": "arn:aws:ecs:r:1:cluster/d"}}, context)
    assert not condition_holds({"StringEquals": {"ecs:CreateAction": "RunTask"}}, context)  # absent key
    assert condition_holds({"StringEqualsIfExists": {"ecs:CreateAction": "RunTask"}}, context)
    with pytest.raises(ValueError, match="outside what this evaluator knows"):
        condition_holds({"NumericLessThan": {"s3:max-keys": "10"}}, context)


def test_parliament_finds_nothing_in_any_role_but_what_is_justified(world):
    roles = {
        role: {"Version": "2012-10-17", "Statement": statements_of(world, role)}
        for role in ("ExecutionRole", "TaskRole", "WorkerRole", "MaintenanceRole")
    }
    result = subprocess.run(
        [str(TOOLS / "python"), "-c", PARLIAMENT],
        input=json.dumps(roles),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    findings = [json.loads(line) for line in result.stdout.splitlines()]
    assert [f for f in findings if not f[3]] == []  # parliament's own auditors: nothing
    assert {(role, issue) for role, issue, _, _ in findings} <= set(JUSTIFIED), findings


def test_the_task_role_drives_the_gpu_cluster_and_invokes_the_endpoints_its_parameters_name(world):
    gpu = {"service": "ecs", "role": "task", "where": "tasks/gpu/backends.py:0"}
    world.own("cluster", "gpu")  # the GPU cluster, as the test world names it
    world.resource_tags = {"i-1": {GPU_CLUSTER_TAG: "gpu"}}  # the instance of the cluster the calls name
    instance = f"{world.gpu_cluster().replace(':cluster/', ':container-instance/')}/c1"
    calls = [
        {**gpu, "operation": "ListContainerInstances", "params": {"cluster": "gpu"}},
        {**gpu, "operation": "ListTasks", "params": {"cluster": "gpu", "containerInstance": instance}},
        {
            **gpu,
            "operation": "StartTask",
            "params": {"cluster": "gpu", "taskDefinition": "train", "tags": [{"key": "gpu-task", "value": "a"}]},
        },
        {**gpu, "operation": "StopTask", "params": {"cluster": "gpu", "task": "t1"}},
        {**gpu, "service": "ec2", "operation": "RebootInstances", "params": {"InstanceIds": ["i-1"]}},
        {
            "service": "sagemaker-runtime",
            "operation": "InvokeEndpointAsync",
            "role": "task",
            "where": "tasks/video/inference.py:0",
            "params": {"EndpointName": "text-redact"},
        },
    ]
    assert evaluate(world, calls) == ([], 7)  # StartTask with its tag-on-create TagResource
    task_role = statements_of(world, "TaskRole")
    pipelines_cluster = Request(
        "ecs:StopTask",
        f"{world.values['Cluster.Arn'].replace(':cluster/', ':task/')}/t1",
        {"ecs:cluster": (world.values["Cluster.Arn"],)},
    )
    other_endpoint = Request("sagemaker:InvokeEndpointAsync", world.endpoint("x").replace("pipelines-video-", "a-"))
    assert not decide(task_role, pipelines_cluster)[0] and not decide(task_role, other_endpoint)[0]
    unset = {**world.parameters, "GpuClusterName": "", "VideoEndpointPrefix": ""}  # the defaults: none granted
    values = stack_values(world.template, unset, "pipelines-test", aws_calls.ACCOUNT, aws_calls.REGION)
    sids = {statement["Sid"] for statement in role_statements(world.template, "TaskRole", values)}
    assert not {sid for sid in sids if sid.startswith("Gpu") or "Endpoint" in sid}
    assert {sid for sid in (s["Sid"] for s in task_role) if sid.startswith("Gpu") or "Endpoint" in sid} == {
        "GpuClusterNodes",
        "GpuClusterInstances",
        "GpuStartTasks",
        "GpuTagTasksAtLaunch",
        "GpuWatchTasks",
        "GpuInstances",
        "GpuRebootInstances",
        "InvokeVideoEndpoints",
    }


def test_a_reboot_is_allowed_only_on_an_instance_tagged_as_the_gpu_clusters(world, tmp_path, monkeypatch):
    """IAM reads the instance's own tags: the tag the test's launch gave it reaches the request's context."""
    import boto3
    import botocore.session
    import moto

    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv(aws_calls.LOG_VARIABLE, str(log))
    monkeypatch.setattr(aws_calls, "_installed", False)
    monkeypatch.setattr(botocore.session.Session, "__init__", botocore.session.Session.__init__)  # restored after
    aws_calls.install()
    with moto.mock_aws():
        ec2 = boto3.client("ec2", region_name=aws_calls.REGION)
        image = ec2.describe_images()["Images"][0]["ImageId"]

        def launch(tags: dict[str, str]) -> str:
            spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
            kwargs = {"TagSpecifications": spec} if tags else {}
            return ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, **kwargs)["Instances"][0]["InstanceId"]

        tagged, untagged, other = launch({GPU_CLUSTER_TAG: "gpu"}), launch({}), launch({GPU_CLUSTER_TAG: "etl"})
        ec2.create_tags(Resources=[untagged], Tags=[{"Key": "team", "Value": "gpu"}])
    world.learn(log)  # the test created no cluster: "gpu" is the GPU cluster's name in this world
    world.own("cluster", "gpu")
    assert world.resource_tags[tagged] == {GPU_CLUSTER_TAG: "gpu"} and world.resource_tags[untagged] == {"team": "gpu"}
    gpu = {"service": "ecs", "role": "task", "where": "tasks/gpu/backends.py:0"}
    calls = [{**gpu, "operation": "ListContainerInstances", "params": {"cluster": "gpu"}}] + [
        {**gpu, "service": "ec2", "operation": "RebootInstances", "params": {"InstanceIds": [i]}}
        for i in (tagged, untagged, other)
    ]
    denied, decided = evaluate(world, calls)
    arn = f"arn:aws:ec2:{aws_calls.REGION}:{aws_calls.ACCOUNT}:instance/"
    assert decided == 4 and [(d[1], d[2], d[3]) for d in denied] == sorted(
        ("ec2:RebootInstances", arn + i, "no statement allows it (implicit deny)") for i in (untagged, other)
    )
    reboot = Request("ec2:RebootInstances", arn + tagged, world.instance_tags(tagged))
    assert reboot.context == {f"aws:ResourceTag/{GPU_CLUSTER_TAG}": (aws_calls.GPU_CLUSTER,)}
    assert decide(statements_of(world, "TaskRole"), reboot) == (True, "allowed by GpuRebootInstances")


@pytest.mark.sweep  # runs the emulator tests above with their AWS calls recorded: `make test-sweep`
@pytest.mark.timeout(1800)
def test_every_aws_call_the_emulator_tests_make_is_allowed_by_its_role(world, tmp_path):
    log = tmp_path / "aws-calls.jsonl"
    env = {**os.environ, aws_calls.LOG_VARIABLE: str(log)}
    pytest_run = [sys.executable, "-m", "pytest", "-p", "tests.helpers.aws_calls", "-q", "-p", "no:cacheprovider", "-x"]
    for selection in ([*RECORDED_MODULES, "-m", "not sweep"], list(RECORDED_SWEEP)):
        result = subprocess.run(
            [*pytest_run, *selection], cwd=cfn.REPO_ROOT, env=env, capture_output=True, text=True, timeout=1700
        )
        assert result.returncode == 0, result.stdout[-3000:]
    calls = [c for c in aws_calls.read(log) if c["role"] in aws_calls.TEMPLATE_ROLES]
    world.learn(log)  # what the tests created and configured; the GPU test's instance carries the cluster's tag
    made = {(c["role"], f"{c['service']}:{c['operation']}") for c in calls}
    assert {
        ("worker", "ecs:RunTask"),
        ("task", "cloudwatch:GetMetricStatistics"),
        ("task", "glue:CreatePartition"),
        ("listener", "sqs:ReceiveMessage"),
        ("task", "dynamodb:TransactWriteItems"),
        ("task", "s3:PutObject"),
        ("task", "cloudwatch:PutMetricData"),  # pipeline-health's readings
        ("worker", "sqs:ReceiveMessage"),  # the observer
        ("worker", "ecs:DescribeTasks"),
        ("task", "ecs:StartTask"),  # the GPU backend on its cluster
        ("task", "ec2:RebootInstances"),
        ("task", "sagemaker-runtime:InvokeEndpointAsync"),  # the video pipeline's endpoint
    } <= made
    denied, decided = evaluate(world, calls)
    unexpected = [d for d in denied if (d[1], d[2]) not in DENIED_ON_PURPOSE]
    assert unexpected == [], "\n".join(map(str, unexpected))
    assert decided >= len(calls)


IAM = "https://docs.aws.amazon.com/IAM/latest/UserGuide/"
RESOURCE_ROWS = [  # (Resource pattern, request resource, matches): reference_policies_elements_resource.html
    # "Using wildcards in resource ARNs": * in the resource segment matches / (the page's S3 list, all matching)
    ("arn:aws:s3:::amzn-s3-demo-bucket/*/test/*", "arn:aws:s3:::amzn-s3-demo-bucket/1/test/object.jpg", True),
    ("arn:aws:s3:::amzn-s3-demo-bucket/*/test/*", "arn:aws:s3:::amzn-s3-demo-bucket/1/2/test/3/object.jpg", True),
    ("arn:aws:s3:::amzn-s3-demo-bucket/*/test/*", "arn:aws:s3:::amzn-s3-demo-bucket//test/object.jpg", True),
    ("arn:aws:s3:::amzn-s3-demo-bucket/*/test/*", "arn:aws:s3:::amzn-s3-demo-bucket/1/test/", True),
    # same page: the ARN does not match these objects
    ("arn:aws:s3:::amzn-s3-demo-bucket/*/test/*", "arn:aws:s3:::amzn-s3-demo-bucket/1-test/object.jpg", False),
    ("arn:aws:s3:::amzn-s3-demo-bucket/*/test/*", "arn:aws:s3:::amzn-s3-demo-bucket/test/object.jpg", False),
    # same page: all IAM users whose path is /accounting
    ("arn:aws:iam::123456789012:user/accounting/*", "arn:aws:iam::123456789012:user/accounting/bob", True),
    ("arn:aws:iam::123456789012:user/accounting/*", "arn:aws:iam::123456789012:user/bob", False),
    # same page: wildcards within the individual segments; a * not last in its segment stops at the colon
    ("arn:aws:sqs:us-*-1:123456789012:queue1", "arn:aws:sqs:us-east-1:123456789012:queue1", True),
    ("arn:aws:sqs:us-*-1:123456789012:queue1", "arn:aws:sqs:us-x:y-1:123456789012:queue1", False),
    ("arn:aws:sqs:us-east-?:123456789012:queue1", "arn:aws:sqs:us-east-:1:123456789012:queue1", False),
    # same page: a * that is a segment's last character may expand beyond the colon boundaries
    ("arn:aws:sqs:us-*:123456789012:queue1", "arn:aws:sqs:us-x:y-1:123456789012:queue1", True),
]
CONDITION_ROWS = [  # (condition, request context, holds)
    # reference_policies_elements_condition_operators.html#Conditions_ARN: each of the six colon-delimited parts is
    # checked separately, each with * and ?
    (
        {"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::*:role/*"}},
        {"aws:PrincipalArn": ("arn:aws:iam::1:role/A",)},
        True,
    ),
    (
        {"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::*:role/*"}},
        {"aws:PrincipalArn": ("arn:aws:iam::1:user/A",)},
        False,
    ),
    ({"ArnEquals": {"aws:SourceArn": "arn:aws:s3:::bucket*"}}, {"aws:SourceArn": ("arn:aws:s3:::bucket-1",)}, True),
    # same page: a policy value of fewer than six parts names no ARN (a * does not span parts)
    ({"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::*"}}, {"aws:PrincipalArn": ("arn:aws:iam::1:role/A",)}, False),
    (  # same page: the region's * cannot swallow the account part of another account's ARN
        {"ArnLike": {"ecs:cluster": "arn:aws:ecs:*:123456789012:cluster/*"}},
        {"ecs:cluster": ("arn:aws:ecs:us-east-1:999999999999:cluster/a:123456789012:cluster/b",)},
        False,
    ),
    # reference_policies_condition-single-vs-multi-valued-context-keys.html: ForAllValues holds when every value in
    # the request matches, and when the key is absent; ForAnyValue when one matches, never when absent
    ({"ForAllValues:StringLike": {"aws:TagKeys": "key1*"}}, {"aws:TagKeys": ("key1a", "key1b")}, True),
    ({"ForAllValues:StringLike": {"aws:TagKeys": "key1*"}}, {"aws:TagKeys": ("key1a", "key2")}, False),
    ({"ForAllValues:StringLike": {"aws:TagKeys": "key1*"}}, {}, True),
    (
        {"ForAnyValue:StringEquals": {"aws:TagKeys": ["environment", "cost-center"]}},
        {"aws:TagKeys": ("environment", "x")},
        True,
    ),
    ({"ForAnyValue:StringEquals": {"aws:TagKeys": ["environment", "cost-center"]}}, {}, False),
]


@pytest.mark.parametrize(("pattern", "resource", "expected"), RESOURCE_ROWS)
def test_resource_patterns_match_as_the_iam_guide_documents(pattern, resource, expected):
    statement = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": pattern}
    assert decide([statement], Request("s3:GetObject", resource))[0] is expected


@pytest.mark.parametrize(("condition", "context", "expected"), CONDITION_ROWS)
def test_conditions_hold_as_the_iam_guide_documents(condition, context, expected):
    assert condition_holds(condition, context) is expected


def test_a_single_valued_operator_on_a_multivalued_key_is_refused():
    """reference_policies_condition-single-vs-multi-valued-context-keys.html: multivalued keys require a set
    operator; AWS documents no meaning without one, so the evaluator refuses rather than guess."""
    with pytest.raises(ValueError, match="requires ForAllValues or ForAnyValue"):
        condition_holds({"StringEquals": {"aws:TagKeys": "a"}}, {"aws:TagKeys": ("a", "b")})
    many = frozenset({"ecs:tags"})  # an ArrayOf… key of the Service Authorization Reference
    with pytest.raises(ValueError, match="requires ForAllValues or ForAnyValue"):
        condition_holds({"StringLike": {"ecs:tags": "a"}}, {"ecs:tags": ("a",)}, many)


ROLE = "arn:aws:iam::123456789012:role/app"
OBJECT = "arn:aws:s3:::amzn-s3-demo-bucket/key"
ALLOW_GET = {"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::amzn-s3-demo-bucket/*"}
KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd"
EVALUATION_ROWS = [  # (who decides, request, allowed)
    # reference_policies_evaluation-logic.html: an explicit Deny in any policy (here the bucket's) overrides an Allow
    (
        Principal(
            [ALLOW_GET],
            ROLE,
            (
                ResourcePolicy(
                    ("arn:aws:s3:::amzn-s3-demo-bucket",),
                    [
                        {
                            "Effect": "Deny",
                            "Principal": "*",
                            "Action": "s3:*",
                            "Resource": "arn:aws:s3:::amzn-s3-demo-bucket/*",
                            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                        }
                    ],
                ),
            ),
        ),
        Request("s3:GetObject", OBJECT, {"aws:SecureTransport": ("false",)}),
        False,
    ),
    # reference_policies_evaluation-logic_policies_resource.html: within one account a resource-based policy that
    # names the role allows it with no identity policy
    (
        Principal(
            [],
            ROLE,
            (
                ResourcePolicy(
                    ("arn:aws:s3:::amzn-s3-demo-bucket",),
                    [{**ALLOW_GET, "Principal": {"AWS": ROLE}}],
                ),
            ),
        ),
        Request("s3:GetObject", OBJECT),
        True,
    ),
    # same page: a policy granting a service principal grants the role nothing
    (
        Principal(
            [],
            ROLE,
            (
                ResourcePolicy(
                    ("arn:aws:s3:::amzn-s3-demo-bucket",), [{**ALLOW_GET, "Principal": {"Service": "s3.amazonaws.com"}}]
                ),
            ),
        ),
        Request("s3:GetObject", OBJECT),
        False,
    ),
    # kms key-policy-default.html: without a key policy statement for the account, IAM policies grant no access
    (
        Principal(
            [{"Effect": "Allow", "Action": "kms:Decrypt", "Resource": KEY}],
            ROLE,
            (ResourcePolicy((KEY,), []),),
        ),
        Request("kms:Decrypt", KEY),
        False,
    ),
    (  # same page: the default key policy's statement for the account root lets IAM policies allow it
        Principal(
            [{"Effect": "Allow", "Action": "kms:Decrypt", "Resource": KEY}],
            ROLE,
            (
                ResourcePolicy(
                    (KEY,),
                    [
                        {
                            "Effect": "Allow",
                            "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
                            "Action": "kms:*",
                            "Resource": "*",
                        }
                    ],
                ),
            ),
        ),
        Request("kms:Decrypt", KEY),
        True,
    ),
    # access_policies_boundaries.html: the effective permissions are the intersection of the identity policy and
    # the permissions boundary
    (
        Principal([ALLOW_GET], ROLE, boundary=[{**ALLOW_GET, "Action": "s3:GetObject"}]),
        Request("s3:PutObject", OBJECT),
        False,
    ),
    (
        Principal([ALLOW_GET], ROLE, boundary=[{**ALLOW_GET, "Action": "s3:GetObject"}]),
        Request("s3:GetObject", OBJECT),
        True,
    ),
    # reference_policies_evaluation-logic.html (SCPs): an action no SCP allows is denied whatever the role allows
    (
        Principal([ALLOW_GET], ROLE, scps=[{"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}]),
        Request("s3:GetObject", OBJECT),
        False,
    ),
]


@pytest.mark.parametrize(("who", "request_", "expected"), EVALUATION_ROWS)
def test_policies_decide_together_as_the_iam_guide_documents(who, request_, expected):
    assert decide(who, request_)[0] is expected


def test_the_stacks_bucket_policy_denies_plain_http_and_foreign_resources_are_themselves(world):
    """The template's bucket policy joins the decision; a bucket, queue, cluster or role the test world did not
    create or configure is evaluated as itself (and denied), not as the stack's."""
    task = principal_of(world, "TaskRole")
    own = f"{world.values['Bucket.Arn']}/{world.values['StorePrefix']}/k"
    assert decide(task, Request("s3:GetObject", own, {"aws:SecureTransport": ("true",)}))[0]
    assert decide(task, Request("s3:GetObject", own, {"aws:SecureTransport": ("false",)})) == (
        False,
        "explicitly denied by the resource policy's TlsOnly",
    )
    s3 = {"service": "s3", "role": "task", "where": "tasks/core/storage.py:0"}
    sqs = {"service": "sqs", "role": "listener", "where": "tasks/landing/sqs.py:0"}
    world.own("bucket", "made-by-the-harness")
    prefix = world.values["StorePrefix"]
    assert evaluate(
        world, [{**s3, "operation": "GetObject", "params": {"Bucket": "made-by-the-harness", "Key": f"{prefix}/k"}}]
    ) == ([], 1)
    denied, _ = evaluate(
        world, [{**s3, "operation": "GetObject", "params": {"Bucket": "someone-else", "Key": f"{prefix}/k"}}]
    )
    assert [d[2] for d in denied] == [f"arn:aws:s3:::someone-else/{prefix}/k"]
    denied, _ = evaluate(
        world, [{**sqs, "operation": "ReceiveMessage", "params": {"QueueUrl": "http://q/123/etl-file-uploads-test"}}]
    )
    assert [d[2] for d in denied] == [f"arn:aws:sqs:{aws_calls.REGION}:{aws_calls.ACCOUNT}:etl-file-uploads-test"]
    worker = run_task_as_prefect_aws(world)
    worker[1]["params"] = {
        **worker[1]["params"],
        "cluster": "someone-else",
        "overrides": {"taskRoleArn": "arn:aws:iam::123456789012:role/admin"},
    }
    denied, _ = evaluate(world, worker)
    assert {(d[1], d[2].rsplit("/", 1)[-1] if d[1] == "iam:PassRole" else d[2].split(":", 5)[5]) for d in denied} == {
        ("ecs:RunTask", "task-definition/prefect_ndjson-merge:1"),  # its ecs:cluster is the other cluster
        ("ecs:TagResource", "task/someone-else/0123456789abcdef"),
        ("iam:PassRole", "admin"),
    }


def test_a_gpu_start_task_passes_its_task_definitions_roles(world):
    """ECS's StartTask passes the roles of its task definition: iam:PassRole of each is evaluated too."""
    world.own("cluster", "gpu")
    world.task_definitions["train"] = {"taskRoleArn": "arn:aws:iam::123456789012:role/gpu-training"}
    gpu = {"service": "ecs", "role": "task", "where": "tasks/gpu/backends.py:0"}
    start = {**gpu, "operation": "StartTask", "params": {"cluster": "gpu", "taskDefinition": "train"}}
    denied, decided = evaluate(world, [start])
    assert decided == 2 and [(d[1], d[2]) for d in denied] == [
        ("iam:PassRole", "arn:aws:iam::123456789012:role/gpu-training")
    ]
    del world.task_definitions["train"]
    assert evaluate(world, [start]) == ([], 1)  # a definition with no role passes none


def test_the_gpu_task_role_the_stack_names_may_be_passed_to_ecs_tasks_only(world):
    """`--parameter GpuTaskRoleArn=...`: StartTask of a definition running as that role is allowed, as is no other
    role, and the role is passed to ECS tasks only."""
    role = f"arn:aws:iam::{aws_calls.ACCOUNT}:role/gpu-training"
    world.parameters["GpuTaskRoleArn"] = role
    stack = f"pipelines-{aws_calls.ENV}"
    world.values = stack_values(world.template, world.parameters, stack, aws_calls.ACCOUNT, aws_calls.REGION)
    world.own("cluster", "gpu")
    gpu = {"service": "ecs", "role": "task", "where": "tasks/gpu/backends.py:0"}
    start = {**gpu, "operation": "StartTask", "params": {"cluster": "gpu", "taskDefinition": "train"}}
    world.task_definitions["train"] = {"taskRoleArn": role}
    assert evaluate(world, [start]) == ([], 2)
    world.task_definitions["train"] = {"taskRoleArn": f"arn:aws:iam::{aws_calls.ACCOUNT}:role/admin"}
    denied, _ = evaluate(world, [start])
    assert [d[1] for d in denied] == ["iam:PassRole"]
    passing = Request("iam:PassRole", role, {"iam:PassedToService": ("ec2.amazonaws.com",)})
    assert decide(statements_of(world, "TaskRole"), passing)[0] is False
