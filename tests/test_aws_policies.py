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
from infra.policy_eval import Request, condition_holds, decide, role_statements, stack_values
from tasks.gpu.backends import GPU_CLUSTER_TAG
from tests.helpers import aws_calls

TOOLS = cfn.REPO_ROOT / ".venv-tools" / "bin"
RECORDED_MODULES = (  # the emulator tests whose calls are evaluated: the worker, flow-run tasks, listeners
    "tests/test_ecs.py",
    "tests/test_etl_catalog.py",
    "tests/test_health_service_alarms.py",
    "tests/test_landing_sqs.py",
    "tests/test_aws_s3.py",
    "tests/test_aws_health_metrics.py",
    "tests/test_aws_listener_service.py",
    "tests/test_gpu_backends.py::test_ecs_backend_api_shapes_against_moto",  # the GPU cluster's ECS and EC2 calls
    "tests/test_video_model.py::test_video_process_through_the_async_endpoint",  # SageMaker's runtime, stand-in
    "tests/test_video_model.py::test_an_endpoint_failure_fails_the_segment_with_its_reason",
)
RECORDED_SWEEP = (  # sweep tests themselves
    "tests/test_aws_observer.py",  # the worker's observer reading its queue
    "tests/test_aws_trigger.py",  # the trigger's records-prefect-state run, on a process worker
    "tests/test_aws_dask.py",  # flow runs and their Dask workers (run them with the task role) on S3
)
# parliament's community auditors flag these on purpose; each is needed and scoped
JUSTIFIED = {
    ("ExecutionRole", "CREDENTIALS_EXPOSURE"): "ecr:GetAuthorizationToken is how ECS pulls the image from ECR",
    ("WorkerRole", "PERMISSIONS_MANAGEMENT_ACTIONS"): "iam:PassRole of the flow runs' two roles, only to ECS tasks",
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


def evaluate(world: aws_calls.StackWorld, calls: list[dict]) -> tuple[list[tuple], int]:
    """Each call's authorizations decided under its role's policy: (denied ones, how many were decided)."""
    requests = [(call, request) for call in calls for request in aws_calls.authorizations(world, call)]
    supported = aws_calls.supported_condition_keys({r.action for _, r in requests})
    policies = {role: statements_of(world, role) for role in set(aws_calls.TEMPLATE_ROLES.values())}
    denied = []
    for call, request in requests:
        seen = aws_calls.with_supported_keys(request, supported)
        allowed, why = decide(policies[aws_calls.TEMPLATE_ROLES[call["role"]]], seen)
        if not allowed:
            denied.append((call["role"], seen.action, seen.resource, why, call["where"]))
    return sorted(set(denied)), len(requests)


def run_task_as_prefect_aws(world: aws_calls.StackWorld) -> list[dict]:
    """The worker's calls launching one flow run, as prefect-aws makes them (tests/test_ecs.py records the real
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
        for role in ("ExecutionRole", "TaskRole", "WorkerRole")
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
    world.resource_tags = aws_calls.read_resource_tags(log)
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
    world.resource_tags = aws_calls.read_resource_tags(log)  # the GPU test's instance carries the cluster's tag
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
    assert denied == [], "\n".join(map(str, denied))
    assert decided >= len(calls)
