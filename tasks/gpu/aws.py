"""The GPU pipeline's own parts of the AWS stack (``Pipeline.aws``): your GPU cluster, and what its ecs backend may
do there (``tasks/gpu/backends.py`` ``EcsBackend``)."""

from __future__ import annotations

from typing import Any

from tasks.core.aws_template import PREFIX_ARN, AwsParts, ref, sub, when
from tasks.gpu.backends import GPU_CLUSTER_TAG

CLUSTER = {
    "Type": "String",
    "Default": "",
    "AllowedPattern": "[A-Za-z0-9_-]{0,255}",
    "Description": "ECS cluster of your GPU instances (GpuCompute.cluster_name, the gpu pipeline's ecs "
    "backend); empty: the task role gets no GPU-cluster permissions",
}

TASK_ROLE = {
    "Type": "String",
    "Default": "",
    "AllowedPattern": "(arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]{1,512})?",
    "Description": "IAM role your GPU task definitions run as (their taskRoleArn): StartTask passes it, so the task "
    "role may pass it to ECS tasks; empty: the GPU task definitions carry no role",
}


def pass_role_statement() -> dict[str, Any]:
    """StartTask passes the role of the task definition it starts: that one role, to ECS tasks only."""
    return {
        "Sid": "GpuPassTaskRole",
        "Effect": "Allow",
        "Action": "iam:PassRole",
        "Resource": ref("GpuTaskRoleArn"),
        "Condition": {"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}},
    }


def cluster_statements() -> list[dict[str, Any]]:
    """List and describe the cluster's container instances, start tasks pinned to them (tagged at launch), find,
    describe and stop them, read the instances' private IPs and reboot an unhealthy one."""
    ecs = PREFIX_ARN.format(service="ecs")
    on_gpu_cluster = {"ArnEquals": {"ecs:cluster": sub(f"{ecs}:cluster/${{GpuClusterName}}")}}
    gpu_tasks = sub(f"{ecs}:task/${{GpuClusterName}}/*")
    return [
        {
            "Sid": "GpuClusterNodes",
            "Effect": "Allow",
            "Action": "ecs:ListContainerInstances",
            "Resource": sub(f"{ecs}:cluster/${{GpuClusterName}}"),
        },
        {
            "Sid": "GpuClusterInstances",
            "Effect": "Allow",
            "Condition": on_gpu_cluster,
            "Action": ["ecs:DescribeContainerInstances", "ecs:ListTasks"],
            "Resource": sub(f"{ecs}:container-instance/${{GpuClusterName}}/*"),
        },
        {
            "Sid": "GpuStartTasks",
            "Effect": "Allow",
            "Action": "ecs:StartTask",
            "Condition": on_gpu_cluster,
            "Resource": sub(f"{ecs}:task-definition/*"),
        },
        # start_task tags each attempt at launch; TagResource requests carry no ecs:cluster key: the ARN names it
        {
            "Sid": "GpuTagTasksAtLaunch",
            "Effect": "Allow",
            "Action": "ecs:TagResource",
            "Resource": gpu_tasks,
            "Condition": {"StringEquals": {"ecs:CreateAction": "StartTask"}},
        },
        {
            "Sid": "GpuWatchTasks",
            "Effect": "Allow",
            "Action": ["ecs:DescribeTasks", "ecs:StopTask"],
            "Resource": gpu_tasks,
            "Condition": on_gpu_cluster,
        },
        # DescribeInstances takes no resource ARN; a container instance's EC2 instance is not named by the cluster,
        # so a reboot is scoped by the tag the GPU cluster's instances carry (docs/aws.md)
        {"Sid": "GpuInstances", "Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
        {
            "Sid": "GpuRebootInstances",
            "Effect": "Allow",
            "Action": "ec2:RebootInstances",
            "Resource": sub(f"{PREFIX_ARN.format(service='ec2')}:instance/*"),
            "Condition": {"StringEquals": {f"aws:ResourceTag/{GPU_CLUSTER_TAG}": ref("GpuClusterName")}},
        },
    ]


STATEMENTS = [
    *(when("HasGpuCluster", s) for s in cluster_statements()),
    when("HasGpuTaskRole", pass_role_statement()),
]
PARTS = AwsParts(
    parameters={"GpuClusterName": CLUSTER, "GpuTaskRoleArn": TASK_ROLE},
    conditions={"HasGpuCluster": "GpuClusterName", "HasGpuTaskRole": "GpuTaskRoleArn"},
    statements=STATEMENTS,
    # gpu-sweep restarts jobs' tasks (StartTask, StopTask, reboot) and gpu-node-healthcheck starts health tasks on
    # the nodes: both drive the cluster as a job does
    maintenance_statements=STATEMENTS,
)
