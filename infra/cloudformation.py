"""One environment's AWS resources as a CloudFormation template, generated from the specs the code runs on.

    pipelines generate                        # rewrite it with prefect.yaml's deployments (deployments/ops/generate.py)
    python -m infra.cloudformation            # rewrite infra/pipelines.template.json alone
    python -m infra.cloudformation --check    # exit 1 when the committed template differs from the generated one

Tables come from ``tasks.core.tables`` (keys, GSIs, TTL attribute), queues and dead-letter queues from
``tasks.landing.sqs.landing_queues()`` (the spec ``aws-events setup`` applies), the listeners and the worker's pool from
``prefect.yaml``'s ecs set (as ``deployments.prefect_yaml`` generates it); the worker, the maintenance worker and
each listener run as an ECS service of desired count 1, so ECS starts a new task when one dies.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from prefect_aws.observers.ecs import SQS_MESSAGE_VISIBILITY_TIMEOUT_SECONDS
from prefect_aws.settings import EcsObserverSqsSettings

from deployments import prefect_yaml
from tasks.core import limits
from tasks.core.aws_template import AwsParts, ref, sub
from tasks.core.registry import default_table_names, hooks, landings, table_specs
from tasks.core.tables import create_request
from tasks.health import cloudwatch as health_metrics
from tasks.health.checks import severity_of
from tasks.landing import sqs
from tasks.landing.heartbeat import HEARTBEAT_VARIABLE

REPO_ROOT = Path(__file__).resolve().parents[1]
TEMPLATE_PATH = REPO_ROOT / "infra" / "pipelines.template.json"
ENV = "${Env}"  # default_names/QueueSpec.names fill {env} with it: Fn::Sub turns it into the stack's Env
LOG_RETENTION_DAYS = limits.PREFECT_RETENTION_DAYS  # seed 001: log_retention_days = 3
INCOMPLETE_UPLOAD_DAYS = 1  # a writer killed mid-upload leaves parts no reader sees but S3 bills
NONCURRENT_VERSION_DAYS = 7  # an overwritten or deleted object can be restored for a week
QUEUE_RETENTION_S = 4 * 24 * 3600  # SQS's default, stated: an arrival not taken in 4 days goes (its object stays)
# what happens to a resource when the stack deletes or replaces it, chosen per kind:
# - the data (tables, bucket): kept when the stack is deleted or the resource replaced, but removed when the stack's
#   own first create rolls back (nothing was written yet), so a retried create does not collide with its leftovers
# - everything else (queues, roles, logs kept 3 days, the cluster, services): rebuilt from this template, so deleted
KEEP_DATA = {"DeletionPolicy": "RetainExceptOnCreate", "UpdateReplacePolicy": "Retain"}
REBUILT = {"DeletionPolicy": "Delete", "UpdateReplacePolicy": "Delete"}
DATA_TYPES = ("AWS::DynamoDB::Table", "AWS::S3::Bucket")
# prefect-aws's ECS worker learns that a flow-run task stopped from ECS task state changes that an EventBridge rule
# sends to this queue; its observer reads it (named by PREFECT_INTEGRATIONS_AWS_ECS_OBSERVER_SQS_QUEUE_NAME)
OBSERVER_QUEUE = EcsObserverSqsSettings.model_fields["queue_name"].default + "-${Env}"
OBSERVER_SETTINGS = "PREFECT_INTEGRATIONS_AWS_ECS_OBSERVER_SQS_"
APP_DIR = "/opt/prefect/pipelines"  # the image's WORKDIR, prefect.yaml's ecs pull directory
SCRATCH = "/tmp"  # the only writable path: the root file system is read-only
# each service's limit on the names the template builds from Env (the stack's own name too); Env's MaxLength is what
# the longest of them leaves, so a too-long Env is refused before the create instead of failing halfway through it
NAME_LIMITS = {
    ("AWS::CloudFormation::Stack", "StackName"): 128,
    ("AWS::DynamoDB::Table", "TableName"): 255,
    ("AWS::SQS::Queue", "QueueName"): 80,
    ("AWS::ECS::Cluster", "ClusterName"): 255,
    ("AWS::ECS::TaskDefinition", "Family"): 255,
    ("AWS::Logs::LogGroup", "LogGroupName"): 512,
    ("AWS::Events::Rule", "Name"): 64,
    ("AWS::SNS::Topic", "TopicName"): 256,
    ("AWS::CloudWatch::Dashboard", "DashboardName"): 255,
    ("AWS::CloudWatch::Alarm", "AlarmName"): 255,
}
STACK_NAME = "pipelines-${Env}"  # deployments/aws.py names the stack so
ENV_PATTERN = "[a-z0-9]([a-z0-9-]*[a-z0-9])?"  # the default data bucket pipelines-ACCOUNT-ENV ends with it: no "-"


def health_check(command: list[str]) -> dict[str, Any]:
    """A container health check running ``command`` every 30 s: 3 failures in a row after a 2-minute start make
    the task unhealthy, and its service replaces it."""
    return {"Command": ["CMD", *command], "Interval": 30, "Timeout": 10, "Retries": 3, "StartPeriod": 120}


# the worker's own health server (`prefect worker start --with-healthcheck`, PREFECT_WORKER_WEBSERVER_PORT 8080)
# answers 200 while its polling loop is alive: ECS replaces a worker that stops polling, not only one that exits
WORKER_HEALTH_CHECK = health_check(
    ["python", "-c", "import urllib.request; urllib.request.urlopen('http://localhost:8080/health', timeout=5)"]
)
# a listener's receive loop touches this file (tasks/landing/heartbeat.py, at most every 5 s); one that has not
# received for 2 minutes (a receive waits at most 20 s, a failing source is tried again within a minute) is stuck
# or cannot reach its queue: ECS replaces a listener that stops receiving, not only one that exits
LISTENER_HEARTBEAT = f"{SCRATCH}/listener-heartbeat"
LISTENER_STALE_S = 120
LISTENER_HEALTH_CHECK = health_check(
    ["python", "-m", "tasks.landing.heartbeat", LISTENER_HEARTBEAT, str(LISTENER_STALE_S)]
)
# a listener's service runs one run of its ecs deployment in the container (deployments/ecs_listener.py), so the
# run is the deployment's (the UI and landing-listener-not-running see it) and ECS alone supervises it
LISTENER_COMMAND = ["python", "-m", "deployments.ecs_listener"]
# the frequent maintenance flows (prefect.yaml's aws-maintenance pool) run as processes of one always-on service's
# process worker rather than a Fargate task per run: a worker and MAINTENANCE_RUNS flow processes (every flow
# imported: 208 MB each) fit half a vCPU and 2 GiB; a run due while all are busy waits for a free slot
MAINTENANCE_SERVICE = "prefect-maintenance-worker"
MAINTENANCE_SIZE = {"Cpu": "512", "Memory": "2048"}
MAINTENANCE_RUNS = 4
# its worker runs pipeline-health, so pipeline-health cannot report it down: CloudWatch watches its running tasks
# (Container Insights, each minute); ECS replaces a dead task within minutes, so 5 minutes without one alarm
MAINTENANCE_DOWN_MINUTES = 5


def get_att(logical: str, attribute: str) -> dict[str, list[str]]:
    """``Fn::GetAtt [logical, attribute]``."""
    return {"Fn::GetAtt": [logical, attribute]}


def arn(logical: str) -> dict[str, list[str]]:
    """``Fn::GetAtt [logical, Arn]``."""
    return get_att(logical, "Arn")


def logical_id(*parts: str) -> str:
    """A CloudFormation logical id from name parts (alphanumerics, each part capitalised)."""
    return "".join(word[:1].upper() + word[1:] for part in parts for word in re.split(r"[^A-Za-z0-9]+", part) if word)


def skip(*reasons: tuple[str, str]) -> dict[str, Any]:
    """Metadata that suppresses checkov checks, each with the reason it does not apply here."""
    return {"checkov": {"skip": [{"id": check, "comment": why} for check, why in reasons]}}


def prefect_config() -> dict[str, Any]:
    """prefect.yaml as the declarations generate it, parsed: the template follows them even before it is rewritten."""
    return prefect_yaml.manifest()


def listener_deployments() -> dict[str, dict[str, Any]]:
    """Landing pipeline -> its listener's ecs deployment (entrypoint, parameters) in prefect.yaml."""
    functions = {pipeline: landing.flow.replace("-", "_") for pipeline, landing in landings().items()}
    found = {}
    for deployment in prefect_config()["deployments"]:
        function = deployment["entrypoint"].split(":")[1]
        if deployment["name"] == "ecs" and function in functions.values():
            found[function] = deployment
    missing = sorted(function for function in functions.values() if function not in found)
    if missing:
        raise ValueError(f"prefect.yaml has no ecs deployment of the listener flows {', '.join(missing)}")
    return {pipeline: found[function] for pipeline, function in functions.items()}


# --------------------------------------------------------------------------- parameters


def pipeline_parts() -> list[AwsParts]:
    """Each pipeline's own parts of the stack (``Pipeline.aws``), in seed order."""
    return [parts for _, parts in hooks("aws")]


def env_names(resources: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(type, property, name) of every name built from Env: each resource's name property (…Name, Family) that
    Fn::Sub builds from it, and the stack's; a kind missing from NAME_LIMITS is a KeyError in env_max_length."""
    found = [("AWS::CloudFormation::Stack", "StackName", STACK_NAME)]
    for resource in resources.values():
        for name, value in resource.get("Properties", {}).items():
            named = name.endswith("Name") or name == "Family"
            if named and isinstance(value, dict) and ENV in str(value.get("Fn::Sub", "")):
                found.append((resource["Type"], name, value["Fn::Sub"]))
    return found


def env_max_length(resources: dict[str, Any]) -> int:
    """The longest Env every name built from it stays within its service's limit with."""
    room = [NAME_LIMITS[kind, name] - len(text.replace(ENV, "")) for kind, name, text in env_names(resources)]
    return min(limit // text.count(ENV) for limit, (_, _, text) in zip(room, env_names(resources)))


def parameters() -> dict[str, Any]:
    """The stack's inputs: environment, image, network, the Prefect API, then each pipeline's own."""
    common = {
        "Env": {
            "Type": "String",
            "Default": "prod",
            "MinLength": 1,  # MaxLength: env_max_length of the resources (template())
            "AllowedPattern": ENV_PATTERN,
            "Description": "The tables' env (TABLE_ENV): it names the queues and the env-suffixed tables",
        },
        "BucketName": {
            "Type": "String",
            "AllowedPattern": "[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]",
            "Description": "The pipelines' bucket (created here)",
        },
        "StorePrefix": {
            "Type": "String",
            "Default": "pipelines",
            "AllowedPattern": "[A-Za-z0-9_-]+",
            "Description": "OBJECT_STORE_BASE_URL is s3://BucketName/StorePrefix",
        },
        "ImageRepository": {
            "Type": "String",
            "Default": "pipelines",
            "Description": "ECR repository in this account and region that holds the Dockerfile's image",
        },
        "ImageTag": {
            "Type": "String",
            "Description": "The image's tag (PIPELINES_IMAGE_TAG of `prefect deploy --name ecs`)",
        },
        "PrefectApiUrl": {"Type": "String", "Description": "PREFECT_API_URL of the Prefect server or workspace"},
        "PrefectApiKeySecretArn": {
            "Type": "String",
            "Default": "",
            "Description": "Full ARN of the Secrets Manager secret holding PREFECT_API_KEY as a plain string (empty: a "
            "server without auth)",
        },
        "PrefectApiKeySecretKmsKeyArn": {
            "Type": "String",
            "Default": "",
            "Description": "The customer managed KMS key encrypting that secret, which ECS decrypts it with (empty: "
            "the AWS managed aws/secretsmanager key)",
        },
        "VpcId": {"Type": "AWS::EC2::VPC::Id", "Description": "The VPC of the subnets (the flow runs' vpc_id)"},
        "Subnets": {
            "Type": "List<AWS::EC2::Subnet::Id>",
            "Description": "Subnets of the worker, the listeners and the flow-run tasks",
        },
        "SecurityGroups": {
            "Type": "List<AWS::EC2::SecurityGroup::Id>",
            "Description": "Security groups of those tasks (the flow runs' too)",
        },
        "AssignPublicIp": {
            "Type": "String",
            "Default": "DISABLED",
            "AllowedValues": ["ENABLED", "DISABLED"],
            "Description": "ENABLED only in public subnets without a NAT gateway (to reach ECR and Prefect)",
        },
    }
    assign = common.pop("AssignPublicIp")  # stays last, after the pipelines' own
    return {
        **common,
        **{k: v for parts in pipeline_parts() for k, v in parts.parameters.items()},
        "AssignPublicIp": assign,
    }


# --------------------------------------------------------------------------- state: tables, bucket, queues


def stack_table_names() -> dict[str, str]:
    """Logical table -> its name in the stack, ``${Env}`` in every one: the seeds' env-suffixed names as they are,
    the others (``granules``, ``ecs_task``, …) with ``-${Env}`` appended, so two environments share an account."""
    return {logical: name if ENV in name else f"{name}-{ENV}" for logical, name in default_table_names(ENV).items()}


def renamed_tables() -> dict[str, str]:
    """The tables whose stack name is not the seed's ``{env}`` name: the containers get them as ``TABLE_<LOGICAL>``."""
    seeds = default_table_names(ENV)
    return {logical: name for logical, name in stack_table_names().items() if name != seeds[logical]}


def table_resources() -> dict[str, Any]:
    """One AWS::DynamoDB::Table per table_specs() entry, keyed and indexed as ``ensure_tables`` creates it."""
    names = stack_table_names()
    resources = {}
    for logical, spec in table_specs().items():
        properties = create_request(names[logical], spec)
        properties["TableName"] = sub(properties["TableName"])
        properties["PointInTimeRecoverySpecification"] = {"PointInTimeRecoveryEnabled": True}
        properties["SSESpecification"] = {"SSEEnabled": True}  # KMS with the AWS managed key aws/dynamodb
        if spec.ttl_attribute:
            properties["TimeToLiveSpecification"] = {"AttributeName": spec.ttl_attribute, "Enabled": True}
        resources[logical_id("table", logical)] = {
            "Type": "AWS::DynamoDB::Table",
            "Properties": properties,
            "Metadata": skip(
                (
                    "CKV_AWS_119",
                    "encrypted at rest by KMS with the AWS managed key aws/dynamodb (SSEEnabled); a customer "
                    "managed key is a per-account choice this template leaves to its owner",
                )
            ),
        }
    return resources


def queue_resources() -> dict[str, Any]:
    """Each seed queue with its dead-letter queue, attributes from ``sqs.queue_attributes`` as ``aws-events setup``."""
    resources = {}
    encrypted = skip(
        (
            "CKV_AWS_27",
            "encrypted at rest with SQS-managed keys (SqsManagedSseEnabled): S3 cannot send "
            "its notifications to a queue under the AWS managed KMS key",
        )
    )
    for pipeline, spec in sqs.landing_queues().items():
        queue, dead_letter = spec.names(ENV)
        dlq_id, queue_id = logical_id(pipeline, "dead letter queue"), logical_id(pipeline, "queue")
        resources[dlq_id] = {
            "Type": "AWS::SQS::Queue",
            "Properties": {
                "QueueName": sub(dead_letter),
                **{k: int(v) for k, v in sqs.dead_letter_attributes().items()},
                "SqsManagedSseEnabled": True,
            },
            "Metadata": encrypted,
        }
        attributes = sqs.queue_attributes(spec, "DEAD_LETTER_ARN")
        redrive = json.loads(attributes.pop("RedrivePolicy"))
        redrive["deadLetterTargetArn"] = arn(dlq_id)
        resources[queue_id] = {
            "Type": "AWS::SQS::Queue",
            "Properties": {
                "QueueName": sub(queue),
                **{k: int(v) for k, v in attributes.items()},
                "RedrivePolicy": redrive,
                "MessageRetentionPeriod": QUEUE_RETENTION_S,
                "SqsManagedSseEnabled": True,
            },
            "Metadata": encrypted,
        }
        if spec.mode == sqs.OBJECTS:
            resources[logical_id(pipeline, "queue policy")] = {
                "Type": "AWS::SQS::QueuePolicy",
                "Properties": {
                    "Queues": [ref(queue_id)],
                    "PolicyDocument": {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Sid": "BucketSendsObjectCreated",
                                "Effect": "Allow",
                                "Principal": {"Service": "s3.amazonaws.com"},
                                "Action": "sqs:SendMessage",
                                "Resource": arn(queue_id),
                                "Condition": {
                                    "ArnLike": {"aws:SourceArn": sub("arn:${AWS::Partition}:s3:::${BucketName}")},
                                    "StringEquals": {"aws:SourceAccount": ref("AWS::AccountId")},
                                },
                            }
                        ],
                    },
                },
            }
    return resources


def observer_resources() -> dict[str, Any]:
    """The ECS task state changes of the cluster's tasks, sent by an EventBridge rule to the queue prefect-aws's
    observer reads (in the worker): a stopped flow-run task's run is marked Crashed, as a process worker does."""
    queue = {
        "Type": "AWS::SQS::Queue",
        "Properties": {
            "QueueName": sub(OBSERVER_QUEUE),
            "VisibilityTimeout": SQS_MESSAGE_VISIBILITY_TIMEOUT_SECONDS,
            "ReceiveMessageWaitTimeSeconds": sqs.MAX_WAIT_S,
            "MessageRetentionPeriod": QUEUE_RETENTION_S,
            "SqsManagedSseEnabled": True,
        },
        "Metadata": skip(
            (
                "CKV_AWS_27",
                "encrypted at rest with SQS-managed keys (SqsManagedSseEnabled): EventBridge "
                "sends to it without a KMS grant",
            )
        ),
    }
    rule = {
        "Type": "AWS::Events::Rule",
        "Properties": {
            "Name": sub("pipelines-${Env}-ecs-task-state"),
            "Description": "ECS task state changes of the cluster, for prefect-aws's observer (crash detection)",
            "State": "ENABLED",
            "EventPattern": {
                "source": ["aws.ecs"],
                "detail-type": ["ECS Task State Change"],
                "detail": {"clusterArn": [arn("Cluster")]},
            },
            "Targets": [{"Id": "prefect-ecs-observer", "Arn": arn("FlowRunEventsQueue")}],
        },
    }
    policy = {
        "Type": "AWS::SQS::QueuePolicy",
        "Properties": {
            "Queues": [ref("FlowRunEventsQueue")],
            "PolicyDocument": {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "RuleSendsTaskStateChanges",
                        "Effect": "Allow",
                        "Principal": {"Service": "events.amazonaws.com"},
                        "Action": "sqs:SendMessage",
                        "Resource": arn("FlowRunEventsQueue"),
                        "Condition": {"ArnEquals": {"aws:SourceArn": arn("FlowRunEventsRule")}},
                    }
                ],
            },
        },
    }
    return {"FlowRunEventsQueue": queue, "FlowRunEventsRule": rule, "FlowRunEventsQueuePolicy": policy}


def alarm_names() -> list[str]:
    """Every alarm pipeline-health reads (tasks/health/run.py's checks), in its order."""
    from tasks.health.run import all_checks

    return [name for names in all_checks().values() for name in names]


def alarm_topic_key() -> dict[str, Any]:
    """The alarm topic's encryption key: customer managed, since CloudWatch publishes to an encrypted topic only with
    kms:GenerateDataKey* and kms:Decrypt on its key, which the AWS managed alias/aws/sns's fixed policy never grants
    (its alarms' notifications would fail with KMS AccessDenied); the account administers it through IAM, as a
    key's default policy lets it. The statement is AWS's own for CloudWatch alarms to an encrypted topic."""
    return {
        "Type": "AWS::KMS::Key",
        "Properties": {
            "Description": sub("pipelines-${Env}: encrypts the alarm topic; CloudWatch alarms publish with it"),
            "EnableKeyRotation": True,
            "PendingWindowInDays": 7,
            "KeyPolicy": {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "AccountAdministersTheKeyThroughIam",
                        "Effect": "Allow",
                        "Principal": {"AWS": sub("arn:${AWS::Partition}:iam::${AWS::AccountId}:root")},
                        "Action": "kms:*",
                        "Resource": "*",
                    },
                    {
                        "Sid": "CloudWatchAlarmsPublishToTheTopic",
                        "Effect": "Allow",
                        "Principal": {"Service": "cloudwatch.amazonaws.com"},
                        "Action": ["kms:Decrypt", "kms:GenerateDataKey*"],
                        "Resource": "*",
                    },
                ],
            },
        },
    }


def monitoring_resources() -> dict[str, Any]:
    """The cloud dashboard over pipeline-health's readings (the numbers of its Prefect artifact), the landing queues'
    ages and the services' running tasks; each seed alarm as a CloudWatch alarm with its severity, to a topic."""
    names = alarm_names()
    readings = [[health_metrics.NAMESPACE, name, "Env", "${Env}"] for name in names]
    ages = [
        ["AWS/SQS", "ApproximateAgeOfOldestMessage", "QueueName", spec.names(ENV)[0]]
        for spec in sqs.landing_queues().values()
    ]
    services = [
        "prefect-worker",
        MAINTENANCE_SERVICE,
        *(d["entrypoint"].split(":")[1].replace("_", "-") for d in listener_deployments().values()),
    ]
    running = [
        ["ECS/ContainerInsights", "RunningTaskCount", "ClusterName", "pipelines-${Env}", "ServiceName", name]
        for name in services
    ]

    def widget(title: str, metrics: list[list[str]], y: int, stat: str = "Maximum") -> dict[str, Any]:
        return {
            "type": "metric",
            "x": 0,
            "y": y,
            "width": 24,
            "height": 8,
            "properties": {
                "title": title,
                "metrics": metrics,
                "stat": stat,
                "period": 300,
                "region": "${AWS::Region}",
                "view": "timeSeries",
            },
        }

    body = {
        "widgets": [
            widget("pipeline-health readings (the Prefect artifact's numbers)", readings, 0),
            widget("landing queues: oldest message age (s)", ages, 8),
            widget("services: running tasks (1 each)", running, 16, "Minimum"),
        ]
    }
    resources: dict[str, Any] = {
        "AlarmTopicKey": alarm_topic_key(),
        "AlarmTopic": {
            "Type": "AWS::SNS::Topic",
            "Properties": {"TopicName": sub("pipelines-${Env}-alarms"), "KmsMasterKeyId": arn("AlarmTopicKey")},
        },
        "Dashboard": {
            "Type": "AWS::CloudWatch::Dashboard",
            "Properties": {
                "DashboardName": sub("pipelines-${Env}"),
                "DashboardBody": sub(json.dumps(body, separators=(",", ":"))),
            },
        },
    }
    for name in names:
        severity = severity_of(name, 1)
        resources[logical_id("alarm", name)] = {
            "Type": "AWS::CloudWatch::Alarm",
            "Properties": {
                "AlarmName": sub(f"pipelines-${{Env}}-{name}"),
                "AlarmDescription": (
                    f"{severity}: pipeline-health's {name} fires (its incident and notification are on the Prefect "
                    "server)"
                ),
                "Namespace": health_metrics.NAMESPACE,
                "MetricName": health_metrics.FIRING,
                "Dimensions": [{"Name": "Env", "Value": ref("Env")}, {"Name": "Alarm", "Value": name}],
                "Statistic": "Maximum",
                "Period": 300,
                "EvaluationPeriods": 1,
                "Threshold": 1,
                "ComparisonOperator": "GreaterThanOrEqualToThreshold",
                "TreatMissingData": "notBreaching",  # pipeline-health runs every 5 minutes; no pass, no reading
                "AlarmActions": [ref("AlarmTopic")],
                "OKActions": [ref("AlarmTopic")],
            },
        }
    resources["AlarmMaintenanceWorkerNotRunning"] = maintenance_alarm()
    return resources


def maintenance_alarm() -> dict[str, Any]:
    """The maintenance service has had no running task for MAINTENANCE_DOWN_MINUTES: its sweeps, reconcile and
    pipeline-health (whose alarms then go silent) are not running. No reading (the service or the cluster's
    Container Insights gone) alarms too."""
    return {
        "Type": "AWS::CloudWatch::Alarm",
        "Properties": {
            "AlarmName": sub(f"pipelines-${{Env}}-{MAINTENANCE_SERVICE}-not-running"),
            "AlarmDescription": (
                f"critical: ECS service {MAINTENANCE_SERVICE} has run no task for {MAINTENANCE_DOWN_MINUTES} minutes: "
                "the maintenance flows, pipeline-health among them, are not running (see its log group and events)"
            ),
            "Namespace": "ECS/ContainerInsights",
            "MetricName": "RunningTaskCount",
            "Dimensions": [
                {"Name": "ClusterName", "Value": ref("Cluster")},
                {"Name": "ServiceName", "Value": MAINTENANCE_SERVICE},
            ],
            "Statistic": "Maximum",
            "Period": 60,
            "EvaluationPeriods": MAINTENANCE_DOWN_MINUTES,
            "DatapointsToAlarm": MAINTENANCE_DOWN_MINUTES,
            "Threshold": 1,
            "ComparisonOperator": "LessThanThreshold",
            "TreatMissingData": "breaching",
            "AlarmActions": [ref("AlarmTopic")],
            "OKActions": [ref("AlarmTopic")],
        },
    }


def notified_prefix(pipeline: str) -> dict[str, str]:
    """The key prefix whose created objects notify ``pipeline``'s queue: the store prefix + its input prefix."""
    return sub(f"${{StorePrefix}}/{sqs.landing_queues()[pipeline].input_prefix}")


def lifecycle_rules() -> list[dict[str, Any]]:
    """Abandoned uploads and old versions go; what a pipeline declares expiring goes after its days."""
    rules = [
        {
            "Id": "abort-incomplete-multipart-uploads",
            "Status": "Enabled",
            "Prefix": "",
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": INCOMPLETE_UPLOAD_DAYS},
            "NoncurrentVersionExpiration": {"NoncurrentDays": NONCURRENT_VERSION_DAYS},
        }
    ]
    rules += [
        {
            "Id": f"expire-{name}",
            "Status": "Enabled",
            "Prefix": sub(f"${{StorePrefix}}/{prefix}"),
            "ExpirationInDays": parts.expiring_days,
        }
        for parts in pipeline_parts()  # what a pipeline writes to explain a record, kept as long as the record
        for name, prefix in parts.expiring.items()
    ]
    return rules


def bucket_resources() -> dict[str, Any]:
    """The pipelines' bucket: private, encrypted, versioned, its arrivals notifying the queues, with lifecycle rules."""
    object_pipelines = [p for p, spec in sqs.landing_queues().items() if spec.mode == sqs.OBJECTS]
    bucket = {
        "Type": "AWS::S3::Bucket",
        "DependsOn": [logical_id(p, "queue policy") for p in object_pipelines],  # S3 checks it may send when configured
        "Properties": {
            "BucketName": ref("BucketName"),
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            },
            "OwnershipControls": {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]},
            "VersioningConfiguration": {"Status": "Enabled"},
            "LifecycleConfiguration": {"Rules": lifecycle_rules()},
            "NotificationConfiguration": {
                "QueueConfigurations": [
                    {
                        "Event": "s3:ObjectCreated:*",
                        "Queue": arn(logical_id(p, "queue")),
                        "Filter": {"S3Key": {"Rules": [{"Name": "prefix", "Value": notified_prefix(p)}]}},
                    }
                    for p in object_pipelines
                ]
            },
        },
        "Metadata": skip(
            (
                "CKV_AWS_18",
                "S3 server access logs would need a second bucket; CloudTrail data events are the "
                "account's audit trail, configured outside this environment",
            ),
            (
                "CKV_AWS_144",
                "one environment in one region: cross-region replication is a disaster-recovery choice "
                "outside this template",
            ),
            ("CKV_AWS_145", "SSE-S3 (AES256): the queues' S3 notifications and the tasks need no KMS grants"),
        ),
    }
    tls_only = {
        "Type": "AWS::S3::BucketPolicy",
        "Properties": {
            "Bucket": ref("Bucket"),
            "PolicyDocument": {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "TlsOnly",
                        "Effect": "Deny",
                        "Principal": "*",
                        "Action": "s3:*",
                        "Resource": [arn("Bucket"), sub("${Bucket.Arn}/*")],
                        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                    }
                ],
            },
        },
    }
    return {"Bucket": bucket, "BucketPolicy": tls_only}


# --------------------------------------------------------------------------- IAM


def assume_ecs_tasks() -> dict[str, Any]:
    """The trust policy of a role ECS tasks take, from this account only."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "ecs-tasks.amazonaws.com"},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": ref("AWS::AccountId")}},
            }
        ],
    }


def policy(name: str, statements: list[dict[str, Any]]) -> dict[str, Any]:
    """An inline policy of a role."""
    return {"PolicyName": name, "PolicyDocument": {"Version": "2012-10-17", "Statement": statements}}


def execution_statements(log_groups: list[str]) -> list[dict[str, Any]]:
    """The execution role's: pull the image, write logs, read the launch key and the API key."""
    return [
        {
            "Sid": "PullImage",
            "Effect": "Allow",
            "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            "Resource": sub("arn:${AWS::Partition}:ecr:${AWS::Region}:${AWS::AccountId}:repository/${ImageRepository}"),
        },
        {"Sid": "RegistryLogin", "Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
        {
            "Sid": "WriteLogs",
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": [sub(f"${{{group}.Arn}}") for group in log_groups],
        },
        {
            "Sid": "ReadLaunchKey",
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": ref(LAUNCH_KEY),
        },
        {
            "Fn::If": [
                "HasPrefectApiKey",
                {
                    "Sid": "ReadPrefectApiKey",
                    "Effect": "Allow",
                    "Action": "secretsmanager:GetSecretValue",
                    "Resource": ref("PrefectApiKeySecretArn"),
                },
                ref("AWS::NoValue"),
            ]
        },
        {
            "Fn::If": [
                "HasPrefectApiKeyKmsKey",
                {
                    "Sid": "DecryptPrefectApiKey",
                    "Effect": "Allow",
                    "Action": "kms:Decrypt",
                    "Resource": ref("PrefectApiKeySecretKmsKeyArn"),
                    "Condition": {
                        "StringEquals": {"kms:ViaService": sub("secretsmanager.${AWS::Region}.amazonaws.com")}
                    },
                },
                ref("AWS::NoValue"),
            ]
        },
    ]


def landing_queue_arns() -> list[dict[str, list[str]]]:
    """Every landing queue's ARN and its dead-letter queue's."""
    queues = [arn(logical_id(p, "queue")) for p in sqs.landing_queues()]
    return queues + [arn(logical_id(p, "dead letter queue")) for p in sqs.landing_queues()]


def state_statements() -> list[dict[str, Any]]:
    """What every flow run reads and writes: the tables, the bucket's objects under the store prefix, the health
    metrics (read; pipeline-health's readings put in its own namespace)."""
    tables = [arn(logical_id("table", t)) for t in table_specs()]
    table_indexes = [sub(f"${{{logical_id('table', t)}.Arn}}/index/*") for t, s in table_specs().items() if s.gsis]
    return [  # a transaction is authorized as its items' own actions (PutItem, UpdateItem, ConditionCheckItem)
        {
            "Sid": "Tables",
            "Effect": "Allow",
            "Resource": tables + table_indexes,
            "Action": [
                "dynamodb:GetItem",
                "dynamodb:BatchGetItem",
                "dynamodb:Query",
                "dynamodb:Scan",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
                "dynamodb:BatchWriteItem",
                "dynamodb:ConditionCheckItem",
                "dynamodb:DescribeTable",
                "dynamodb:DescribeTimeToLive",
            ],
        },
        {
            "Sid": "ListBucket",
            "Effect": "Allow",
            "Resource": arn("Bucket"),
            "Action": ["s3:ListBucket", "s3:ListBucketMultipartUploads", "s3:GetBucketLocation"],
        },
        {
            "Sid": "Objects",
            "Effect": "Allow",
            "Resource": sub("${Bucket.Arn}/${StorePrefix}/*"),
            "Action": [
                "s3:GetObject",
                "s3:PutObject",
                "s3:DeleteObject",
                "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts",
            ],
        },
        # the health checks read the DynamoDB throttle and SQS age metrics (tasks/etl/alarms.py,
        # tasks/health/listeners.py); GetMetricStatistics takes no resource ARN
        {"Sid": "ReadMetrics", "Effect": "Allow", "Resource": "*", "Action": "cloudwatch:GetMetricStatistics"},
        # pipeline-health puts its readings in its own namespace only (tasks/health/cloudwatch.py)
        {
            "Sid": "PublishReadings",
            "Effect": "Allow",
            "Resource": "*",
            "Action": "cloudwatch:PutMetricData",
            "Condition": {"StringEquals": {"cloudwatch:namespace": health_metrics.NAMESPACE}},
        },
    ]


def pipeline_statements() -> list[dict[str, Any]]:
    """The pipelines' task role's: their tables, bucket and queues, the metrics, and what each pipeline declares."""
    arrivals = {
        "Sid": "Arrivals",
        "Effect": "Allow",
        "Resource": landing_queue_arns(),
        "Action": [
            "sqs:ReceiveMessage",
            "sqs:DeleteMessage",
            "sqs:ChangeMessageVisibility",
            "sqs:GetQueueAttributes",
            "sqs:GetQueueUrl",
        ],
    }
    state = state_statements()
    return [*state[:3], arrivals, *state[3:], *(s for parts in pipeline_parts() for s in parts.statements)]


def maintenance_statements() -> list[dict[str, Any]]:
    """The maintenance service's task role's: what its flows (sweeps, cleanup, reconcile, health, the breaker) read
    and write, and what each pipeline declares its maintenance flows need; of the queues only their depth
    (pipeline-health's dead-letter and listener checks), never a message."""
    queue_depths = {
        "Sid": "QueueDepths",
        "Effect": "Allow",
        "Resource": landing_queue_arns(),
        "Action": ["sqs:GetQueueUrl", "sqs:GetQueueAttributes"],
    }
    state = state_statements()
    return [*state[:3], queue_depths, *state[3:], *(s for p in pipeline_parts() for s in p.maintenance_statements)]


def worker_statements() -> list[dict[str, Any]]:
    """The worker's task role's: run flow-run tasks on the cluster and watch them."""
    cluster_tasks = sub("arn:${AWS::Partition}:ecs:${AWS::Region}:${AWS::AccountId}:task/${Cluster}/*")
    on_cluster = {"ArnEquals": {"ecs:cluster": arn("Cluster")}}
    return [
        {
            "Sid": "RegisterTaskDefinitions",
            "Effect": "Allow",
            "Action": "ecs:RegisterTaskDefinition",
            "Resource": sub("arn:${AWS::Partition}:ecs:${AWS::Region}:${AWS::AccountId}:task-definition/*"),
        },
        {
            "Sid": "TaskDefinitions",
            "Effect": "Allow",
            "Resource": "*",
            "Action": ["ecs:DescribeTaskDefinition", "ecs:DeregisterTaskDefinition", "ecs:ListTaskDefinitions"],
        },
        {
            "Sid": "RunFlowRuns",
            "Effect": "Allow",
            "Action": "ecs:RunTask",
            "Resource": sub("arn:${AWS::Partition}:ecs:${AWS::Region}:${AWS::AccountId}:task-definition/*"),
            "Condition": on_cluster,
        },
        # prefect-aws tags every task it runs; tag-on-create is authorized as ecs:TagResource, whose requests carry
        # no ecs:cluster key (Service Authorization Reference): the task ARN names the cluster instead
        {
            "Sid": "TagFlowRunsAtLaunch",
            "Effect": "Allow",
            "Action": "ecs:TagResource",
            "Resource": cluster_tasks,
            "Condition": {"StringEquals": {"ecs:CreateAction": "RunTask"}},
        },
        {
            "Sid": "WatchFlowRuns",
            "Effect": "Allow",
            "Action": ["ecs:DescribeTasks", "ecs:StopTask"],
            "Resource": cluster_tasks,
            "Condition": on_cluster,
        },
        {
            "Sid": "PassFlowRunRoles",
            "Effect": "Allow",
            "Action": "iam:PassRole",
            "Resource": [arn("TaskRole"), arn("ExecutionRole")],
            "Condition": {"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}},
        },
        {
            "Sid": "ObserveFlowRuns",
            "Effect": "Allow",
            "Resource": arn("FlowRunEventsQueue"),
            "Action": ["sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"],
        },
        {
            "Sid": "Network",
            "Effect": "Allow",
            "Resource": "*",
            "Action": ["ec2:DescribeVpcs", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups"],
        },
        {
            "Sid": "FlowRunLogs",
            "Effect": "Allow",
            "Action": ["logs:GetLogEvents"],
            "Resource": sub("${FlowRunLogGroup.Arn}"),
        },
    ]


def iam_resources(log_groups: list[str]) -> dict[str, Any]:
    """The execution role, the pipelines' task role (nothing but their own parts), the worker's task role and the
    maintenance service's (its flows' share of the pipelines' parts)."""
    wildcard_reasons = (
        (
            "CKV_AWS_111",
            "ecs:DescribeTaskDefinition, DeregisterTaskDefinition and ListTaskDefinitions take no resource ARN "
            "(AWS's service authorization reference): the worker reads and retires its own revisions",
        ),
        (
            "CKV_AWS_356",
            "ecr:GetAuthorizationToken, the ECS task-definition calls and ec2:Describe* take no "
            "resource ARN; every other statement names its resources",
        ),
    )
    return {
        "ExecutionRole": {
            "Type": "AWS::IAM::Role",
            "Properties": {
                "AssumeRolePolicyDocument": assume_ecs_tasks(),
                "Policies": [policy("pull-log-secret", execution_statements(log_groups))],
            },
            "Metadata": skip(*wildcard_reasons),
        },
        "TaskRole": {
            "Type": "AWS::IAM::Role",
            "Properties": {
                "AssumeRolePolicyDocument": assume_ecs_tasks(),
                "Policies": [policy("pipelines-state", pipeline_statements())],
            },
        },
        "WorkerRole": {
            "Type": "AWS::IAM::Role",
            "Properties": {
                "AssumeRolePolicyDocument": assume_ecs_tasks(),
                "Policies": [policy("run-flow-runs", worker_statements())],
            },
            "Metadata": skip(*wildcard_reasons),
        },
        "MaintenanceRole": {
            "Type": "AWS::IAM::Role",
            "Properties": {
                "AssumeRolePolicyDocument": assume_ecs_tasks(),
                "Policies": [policy("maintenance-state", maintenance_statements())],
            },
        },
    }


# --------------------------------------------------------------------------- ECS


def log_group(name: str) -> dict[str, Any]:
    """A log group kept the seed's 3 days."""
    return {
        "Type": "AWS::Logs::LogGroup",
        "Properties": {"LogGroupName": sub(f"/pipelines/${{Env}}/{name}"), "RetentionInDays": LOG_RETENTION_DAYS},
        "Metadata": skip(
            ("CKV_AWS_158", "CloudWatch Logs encrypts every log group at rest; a customer key is the account's choice"),
            (
                "CKV_AWS_338",
                "the seed keeps logs 3 days (log_retention_days = 3); flow runs' logs are on the Prefect server too",
            ),
        ),
    }


LAUNCH_KEY = "LaunchKeySecret"


def launch_key_resources() -> dict[str, Any]:
    """The key every launch seals what a row says to run with (tasks/core/seal.py): 32 random bytes as 64 hex digits,
    made by Secrets Manager when the stack is created and kept by its updates; ECS hands it to every container as
    PIPELINES_LAUNCH_KEY (the execution role reads it), never in a plaintext variable."""
    return {
        LAUNCH_KEY: {
            "Type": "AWS::SecretsManager::Secret",
            "Properties": {
                "Description": sub("prefect-pipelines ${Env}: the launch key that seals GPU jobs and survey runs"),
                "GenerateSecretString": {
                    "PasswordLength": 64,
                    "ExcludeUppercase": True,
                    "ExcludePunctuation": True,
                    "ExcludeCharacters": "ghijklmnopqrstuvwxyz",  # hex digits only
                },
            },
            "Metadata": skip(
                (
                    "CKV_AWS_149",
                    "encrypted with the AWS managed aws/secretsmanager key; only this stack's roles read it",
                ),
                (
                    "CKV2_AWS_57",
                    "rows in flight carry seals made with it: a rotation is the operator's, with the previous key "
                    "kept in PIPELINES_LAUNCH_KEY_PREVIOUS (docs/operations.md)",
                ),
            ),
        }
    }


def container_secrets() -> list[dict[str, Any]]:
    """What ECS puts in every container's environment from Secrets Manager: the launch key, and the Prefect API key
    where one is given."""
    return [
        {"Name": "PIPELINES_LAUNCH_KEY", "ValueFrom": ref(LAUNCH_KEY)},
        {
            "Fn::If": [
                "HasPrefectApiKey",
                {"Name": "PREFECT_API_KEY", "ValueFrom": ref("PrefectApiKeySecretArn")},
                ref("AWS::NoValue"),
            ]
        },
    ]


def environment(pipeline_queues: bool, extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """What every container is configured by: the tables' env, the store, the Prefect API, the pipelines' own
    parameters (``AwsParts.environment``), the queues."""
    variables = {
        "TABLE_ENV": ref("Env"),
        health_metrics.ENV_VARIABLE: ref("Env"),
        **{variable: ref(parameter) for parts in pipeline_parts() for variable, parameter in parts.environment.items()},
        "OBJECT_STORE_BASE_URL": sub("s3://${BucketName}/${StorePrefix}"),
        "PREFECT_API_URL": ref("PrefectApiUrl"),
        **limits.PREFECT_CLIENT_ENV,
        "AWS_DEFAULT_REGION": ref("AWS::Region"),
        "HOME": SCRATCH,
        "PREFECT_HOME": f"{SCRATCH}/prefect",
        "NUMBA_CACHE_DIR": f"{SCRATCH}/numba",
    }
    variables |= {f"TABLE_{logical.upper()}": sub(name) for logical, name in renamed_tables().items()}
    if pipeline_queues:
        variables |= {sqs.queue_url_variable(p): ref(logical_id(p, "queue")) for p in sqs.landing_queues()}
    variables |= extra or {}
    return [{"Name": name, "Value": value} for name, value in variables.items()]


def task_definition(
    family: str,
    command: list[str],
    role: str,
    log_group_id: str,
    pipeline_queues: bool,
    extra: dict[str, Any] | None = None,
    health_check: dict[str, Any] | None = None,
    size: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Fargate task definition of the image running ``command`` as the image's non-root user, of ``size`` (Cpu and
    Memory; 1 vCPU / 4 GiB unless given)."""
    container = {
        "Name": family,
        "Image": sub("${AWS::AccountId}.dkr.ecr.${AWS::Region}.${AWS::URLSuffix}/${ImageRepository}:${ImageTag}"),
        "Essential": True,
        "Command": command,
        "WorkingDirectory": APP_DIR,
        "Environment": environment(pipeline_queues, extra),
        "Secrets": container_secrets(),
        "ReadonlyRootFilesystem": True,
        "MountPoints": [{"SourceVolume": "scratch", "ContainerPath": SCRATCH}],
        "LogConfiguration": {
            "LogDriver": "awslogs",
            "Options": {
                "awslogs-group": ref(log_group_id),
                "awslogs-region": ref("AWS::Region"),
                "awslogs-stream-prefix": family,
            },
        },
    }
    if health_check:
        container["HealthCheck"] = health_check
    return {
        "Type": "AWS::ECS::TaskDefinition",
        "Properties": {
            "Family": sub(f"pipelines-${{Env}}-{family}"),
            "RequiresCompatibilities": ["FARGATE"],
            "NetworkMode": "awsvpc",
            **(size or {"Cpu": "1024", "Memory": "4096"}),
            "ExecutionRoleArn": arn("ExecutionRole"),
            "TaskRoleArn": arn(role),
            "Volumes": [{"Name": "scratch"}],
            "ContainerDefinitions": [container],
        },
    }


def service(name: str, definition: str) -> dict[str, Any]:
    """An ECS service keeping one task of ``definition`` running: ECS starts another when it dies, and never
    two at once (a deployment stops the old task before it starts the new one)."""
    return {
        "Type": "AWS::ECS::Service",
        "Properties": {
            "ServiceName": name,
            "Cluster": ref("Cluster"),
            "TaskDefinition": ref(definition),
            "DesiredCount": 1,
            "LaunchType": "FARGATE",
            "PropagateTags": "SERVICE",
            "EnableECSManagedTags": True,
            "DeploymentConfiguration": {
                "MinimumHealthyPercent": 0,
                "MaximumPercent": 100,
                "DeploymentCircuitBreaker": {"Enable": True, "Rollback": True},
            },
            "NetworkConfiguration": {
                "AwsvpcConfiguration": {
                    "Subnets": ref("Subnets"),
                    "SecurityGroups": ref("SecurityGroups"),
                    "AssignPublicIp": ref("AssignPublicIp"),
                }
            },
        },
    }


def observer_environment() -> dict[str, Any]:
    """The worker's settings naming its observer's queue (prefect-aws reads them when the worker starts)."""
    return {
        f"{OBSERVER_SETTINGS}QUEUE_NAME": get_att("FlowRunEventsQueue", "QueueName"),
        f"{OBSERVER_SETTINGS}QUEUE_REGION": ref("AWS::Region"),
    }


def maintenance_resources() -> dict[str, Any]:
    """The maintenance service: a Prefect process worker of the aws-maintenance pool, its flow runs processes beside
    it with the stack's env (as a flow-run task gets from the ecs pool's defaults) and the maintenance role."""
    pool = prefect_config()["definitions"]["work_pools"]["maintenance"]["name"]
    command = ["prefect", "worker", "start", "--pool", pool, "--type", "process", "--limit", str(MAINTENANCE_RUNS)]
    return {
        "MaintenanceLogGroup": log_group("maintenance"),
        "MaintenanceTaskDefinition": task_definition(
            "maintenance",
            [*command, "--with-healthcheck"],
            "MaintenanceRole",
            "MaintenanceLogGroup",
            False,
            health_check=WORKER_HEALTH_CHECK,
            size=MAINTENANCE_SIZE,
        ),
        "MaintenanceService": service(MAINTENANCE_SERVICE, "MaintenanceTaskDefinition"),
    }


def ecs_resources() -> dict[str, Any]:
    """The cluster, the Prefect worker of the ecs pool, the maintenance service and one listener per seed queue,
    each a service of one task."""
    pool = prefect_config()["definitions"]["work_pools"]["ecs"]["name"]
    resources: dict[str, Any] = {
        "Cluster": {
            "Type": "AWS::ECS::Cluster",
            "Properties": {
                "ClusterName": sub("pipelines-${Env}"),
                "ClusterSettings": [{"Name": "containerInsights", "Value": "enabled"}],
            },
        },
        "FlowRunLogGroup": log_group("flow-runs"),
        "WorkerLogGroup": log_group("worker"),
        "WorkerTaskDefinition": task_definition(
            "worker",
            ["prefect", "worker", "start", "--pool", pool, "--type", "ecs", "--with-healthcheck"],
            "WorkerRole",
            "WorkerLogGroup",
            False,
            observer_environment(),
            WORKER_HEALTH_CHECK,
        ),
        "WorkerService": service("prefect-worker", "WorkerTaskDefinition"),
        **maintenance_resources(),
    }
    for pipeline, deployment in listener_deployments().items():
        family = deployment["entrypoint"].split(":")[1].replace("_", "-")
        command = [*LISTENER_COMMAND, f"{landings()[pipeline].flow}/{deployment['name']}"]
        resources[logical_id(pipeline, "listener log group")] = log_group(family)
        resources[logical_id(pipeline, "listener task definition")] = task_definition(
            family,
            command,
            "TaskRole",
            logical_id(pipeline, "listener log group"),
            True,
            {HEARTBEAT_VARIABLE: LISTENER_HEARTBEAT},
            LISTENER_HEALTH_CHECK,
        )
        resources[logical_id(pipeline, "listener service")] = service(
            family, logical_id(pipeline, "listener task definition")
        )
    return resources


def parameters_for(resources: dict[str, Any]) -> dict[str, Any]:
    """The stack's parameters, Env's MaxLength the one its longest name built from it leaves."""
    found = parameters()
    longest = env_max_length(resources)
    found["Env"] |= {
        "MaxLength": longest,
        "ConstraintDescription": f"1 to {longest} of a-z, 0-9 and - (the longest name built from Env must fit its "
        "service's limit), starting and ending with a letter or digit",
    }
    return found


def template() -> dict[str, Any]:
    """The whole environment's CloudFormation template."""
    ecs = ecs_resources()
    log_groups = [name for name, resource in ecs.items() if resource["Type"] == "AWS::Logs::LogGroup"]
    resources = {
        **table_resources(),
        **queue_resources(),
        **bucket_resources(),
        **iam_resources(log_groups),
        **ecs,
        **observer_resources(),
        **monitoring_resources(),
        **launch_key_resources(),
    }
    for resource in resources.values():
        resource.update(KEEP_DATA if resource["Type"] in DATA_TYPES else REBUILT)
    outputs = {  # what `prefect deploy --name ecs` and the blocks need (docs/aws.md, "Image, template, deployments")
        "EcsCluster": {"Value": ref("Cluster"), "Description": "ECS_CLUSTER"},
        "EcsTaskRoleArn": {"Value": arn("TaskRole"), "Description": "ECS_TASK_ROLE_ARN"},
        "EcsExecutionRoleArn": {"Value": arn("ExecutionRole"), "Description": "ECS_EXECUTION_ROLE_ARN"},
        "BucketUrl": {"Value": sub("s3://${Bucket}/${StorePrefix}"), "Description": "PIPELINES_BUCKET_URL"},
        "FlowRunLogGroup": {"Value": ref("FlowRunLogGroup"), "Description": "log group for the flow-run tasks"},
        "LaunchKeySecretArn": {"Value": ref(LAUNCH_KEY), "Description": "the flow runs' PIPELINES_LAUNCH_KEY secret"},
        "VpcId": {"Value": ref("VpcId"), "Description": "the flow runs' vpc_id (the pool's default)"},
        "Dashboard": {"Value": ref("Dashboard"), "Description": "the CloudWatch dashboard"},
        "AlarmTopic": {"Value": ref("AlarmTopic"), "Description": "SNS topic of the alarms: subscribe to it"},
    }
    outputs |= {
        logical_id(p, "queue url"): {"Value": ref(logical_id(p, "queue")), "Description": sqs.queue_url_variable(p)}
        for p in sqs.landing_queues()
    }
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": (
            "prefect-pipelines, one environment: tables, bucket, queues, roles, logs, the ECS cluster and "
            "the services of the Prefect workers (ecs, maintenance) and the listeners (generated by "
            "infra/cloudformation.py)"
        ),
        "Parameters": parameters_for(resources),
        "Conditions": {
            condition: {"Fn::Not": [{"Fn::Equals": [ref(parameter), ""]}]}
            for condition, parameter in (
                ("HasPrefectApiKey", "PrefectApiKeySecretArn"),
                ("HasPrefectApiKeyKmsKey", "PrefectApiKeySecretKmsKeyArn"),
                *(item for parts in pipeline_parts() for item in parts.conditions.items()),
            )
        },
        "Resources": resources,
        "Outputs": outputs,
    }


def render() -> str:
    """The template as the committed file holds it."""
    return json.dumps(template(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the template, or with ``--check`` say whether the committed one is what the specs generate."""
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in argv:
        if TEMPLATE_PATH.read_text() != text:
            print(f"{TEMPLATE_PATH} differs from the specs: run `pipelines generate`", file=sys.stderr)
            return 1
        return 0
    TEMPLATE_PATH.write_text(text)
    print(f"wrote {TEMPLATE_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
