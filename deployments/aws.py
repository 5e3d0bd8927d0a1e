"""One environment in AWS: the template checked against CloudFormation's quotas and passed as AWS takes it.

CloudFormation takes a template inline only up to 51,200 bytes (the API refuses more, and `aws cloudformation
deploy` refuses a bigger file unless ``--s3-bucket`` is given); a bigger one goes through an S3 object of at most
1 MB named by ``TemplateURL``. ``template_argument`` does what the CLI does with ``--s3-bucket``: it uploads the
template to the artifact bucket (content-addressed, so an unchanged template is one object) and names it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

INLINE_TEMPLATE_BYTES = 51_200  # TemplateBody in a request (and the CLI's limit without --s3-bucket)
S3_TEMPLATE_BYTES = 1_000_000  # a template in an S3 object (TemplateURL): 1 MB
# CloudFormation's quotas on one template (AWS CloudFormation User Guide, "Understand CloudFormation quotas")
SECTION_LIMITS = {"Resources": 500, "Parameters": 200, "Outputs": 200, "Mappings": 200}
NAME_LIMIT = 255  # a logical id, parameter, output or mapping name
DESCRIPTION_BYTES = 1_024  # the template's Description
INLINE_REFUSAL = (
    "Templates with a size greater than 51,200 bytes must be deployed via an S3 Bucket. "
    "Please add the --s3-bucket parameter to your command."
)  # the AWS CLI's own words (awscli.customizations.cloudformation.exceptions.DeployBucketRequiredError)


def quota_violations(body: str) -> list[str]:
    """What CloudFormation would refuse in ``body`` (empty: nothing), each a sentence naming the quota."""
    size = len(body.encode())
    problems = [f"the template is {size:,} bytes; CloudFormation takes at most {S3_TEMPLATE_BYTES:,} (via S3)"]
    problems = problems if size > S3_TEMPLATE_BYTES else []
    try:
        template = json.loads(body)
    except json.JSONDecodeError as error:
        return [*problems, f"the template is not JSON: {error}"]
    for section, limit in SECTION_LIMITS.items():
        names = template.get(section) or {}
        if len(names) > limit:
            problems.append(f"{len(names)} {section.lower()}; CloudFormation takes at most {limit}")
        problems += [f"{section} name {n[:40]}… is over {NAME_LIMIT} characters" for n in names if len(n) > NAME_LIMIT]
    if "Resources" not in template or not template["Resources"]:
        problems.append("the template has no Resources")
    if len(template.get("Description", "").encode()) > DESCRIPTION_BYTES:
        problems.append(f"the Description is over {DESCRIPTION_BYTES:,} bytes")
    return problems


def template_key(body: str, env: str) -> str:
    """The artifact bucket's key of ``body``: one object per distinct template, so an unchanged one is not re-sent."""
    return f"templates/pipelines-{env}/{hashlib.sha256(body.encode()).hexdigest()[:16]}.json"


def template_url(bucket: str, key: str, region: str) -> str:
    """The virtual-hosted S3 URL of an uploaded template, as CloudFormation's TemplateURL takes it."""
    return f"https://{bucket}.s3.{region}.amazonaws.com/{key}"


def template_argument(body: str, env: str, s3: Any = None, bucket: str | None = None) -> dict[str, str]:
    """``TemplateBody`` for a template within 51,200 bytes, else ``TemplateURL`` of its upload to ``bucket``;
    a ValueError for a template CloudFormation would refuse either way, or a big one with no bucket to go through."""
    problems = quota_violations(body)
    if problems:
        raise ValueError("CloudFormation would refuse the template: " + "; ".join(problems))
    if len(body.encode()) <= INLINE_TEMPLATE_BYTES and bucket is None:
        return {"TemplateBody": body}
    if bucket is None or s3 is None:
        raise ValueError(INLINE_REFUSAL)
    key = template_key(body, env)
    s3.put_object(Bucket=bucket, Key=key, Body=body.encode(), ContentType="application/json")
    return {"TemplateURL": template_url(bucket, key, s3.meta.region_name)}


# --------------------------------------------------------------------------- the stack, by change sets

NO_CHANGES = ("didn't contain changes", "No updates are to be performed")  # CloudFormation's words for "nothing to do"
GONE = ("REVIEW_IN_PROGRESS",)  # a stack only a never-executed CREATE change set made: create it again
FAILED_CREATE = ("ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "CREATE_FAILED")  # deleted before a retry (its data went)
POLL_S = 2.0


def stack_status(cloudformation: Any, stack: str) -> str | None:
    """The stack's status, or None when there is no such stack."""
    from botocore.exceptions import ClientError

    try:
        return cloudformation.describe_stacks(StackName=stack)["Stacks"][0]["StackStatus"]
    except ClientError as error:
        if "does not exist" in str(error):
            return None
        raise


def wait_for(cloudformation: Any, stack: str, timeout_s: float = 3600, poll_s: float = POLL_S) -> str:
    """Wait until the stack is no longer IN_PROGRESS; its final status."""
    import time

    deadline = time.monotonic() + timeout_s
    while (status := stack_status(cloudformation, stack) or "DELETE_COMPLETE").endswith("_IN_PROGRESS"):
        if status in GONE:
            return status
        if time.monotonic() > deadline:
            raise RuntimeError(f"stack {stack} still {status} after {timeout_s:.0f} s")
        time.sleep(poll_s)
    return status


def failure_reasons(cloudformation: Any, stack: str, limit: int = 5) -> list[str]:
    """The latest failed events' reasons (what a person needs to fix a failed deploy)."""
    events = cloudformation.describe_stack_events(StackName=stack)["StackEvents"]
    failed = [e for e in events if e.get("ResourceStatus", "").endswith("FAILED")]
    return [f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason', '')}" for e in failed[:limit]]


def change_set(
    cloudformation: Any,
    stack: str,
    template: dict[str, str],
    parameters: dict[str, str],
    dry_run: bool = False,
    name: str | None = None,
) -> dict[str, Any]:
    """Create (or update) ``stack`` through a change set: with ``dry_run`` only the changes, else executed and
    waited for. A stack whose first create failed is deleted first (its data resources went with the rollback).
    Returns ``{"action": CREATE|UPDATE|NONE, "changes": [...], "status": ...}``."""
    import time

    status = stack_status(cloudformation, stack)
    if status in FAILED_CREATE and not dry_run:
        cloudformation.delete_stack(StackName=stack)
        wait_for(cloudformation, stack)
        status = None
    kind = "UPDATE" if status and status not in GONE and status not in FAILED_CREATE else "CREATE"
    name = name or f"pipelines-{time.strftime('%Y%m%d%H%M%S')}"
    cloudformation.create_change_set(
        StackName=stack, ChangeSetName=name, ChangeSetType=kind, Capabilities=["CAPABILITY_IAM"],
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in sorted(parameters.items())], **template,
    )  # fmt: skip
    while (described := cloudformation.describe_change_set(StackName=stack, ChangeSetName=name))["Status"] in (
        "CREATE_PENDING",
        "CREATE_IN_PROGRESS",
    ):
        time.sleep(POLL_S)
    changes = [
        {k: c["ResourceChange"].get(k) for k in ("Action", "LogicalResourceId", "ResourceType", "Replacement")}
        for c in described.get("Changes", [])
    ]
    if described["Status"] == "FAILED":
        cloudformation.delete_change_set(StackName=stack, ChangeSetName=name)
        if any(words in described.get("StatusReason", "") for words in NO_CHANGES):
            return {"action": "NONE", "changes": [], "status": status}
        raise RuntimeError(f"change set of {stack} failed: {described.get('StatusReason')}")
    if dry_run:  # leaves nothing behind: a CREATE change set's empty REVIEW_IN_PROGRESS stack goes too
        cloudformation.delete_change_set(StackName=stack, ChangeSetName=name)
        if kind == "CREATE" and stack_status(cloudformation, stack) in GONE:
            cloudformation.delete_stack(StackName=stack)
        return {"action": kind, "changes": changes, "status": status, "dry_run": True}
    cloudformation.execute_change_set(StackName=stack, ChangeSetName=name)
    final = wait_for(cloudformation, stack)
    if final not in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
        raise RuntimeError(f"stack {stack} ended {final}: " + "; ".join(failure_reasons(cloudformation, stack)))
    return {"action": kind, "changes": changes, "status": final}


def stack_outputs(cloudformation: Any, stack: str) -> dict[str, str]:
    """The stack's outputs by key."""
    described = cloudformation.describe_stacks(StackName=stack)["Stacks"][0]
    return {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}


# --------------------------------------------------------------------------- the flow runs' pool


def flow_run_environment(env: str, outputs: dict[str, str], catalog_database: str) -> dict[str, str]:
    """What every flow-run container is configured by, from the stack: its tables' env (and the tables the stack
    renames), the store, the Glue database; the same as the listeners' task definitions carry."""
    from infra import cloudformation as cfn

    variables = {"TABLE_ENV": env, "OBJECT_STORE_BASE_URL": outputs["BucketUrl"], "CATALOG_DATABASE": catalog_database}
    variables |= {
        f"TABLE_{logical.upper()}": name.replace(cfn.ENV, env) for logical, name in cfn.renamed_tables().items()
    }
    return variables


def pool_job_template(
    base: dict[str, Any], outputs: dict[str, str], parameters: dict[str, str], region: str
) -> dict[str, Any]:
    """The ``aws-ecs`` pool's base job template with the stack's defaults: the cluster and roles, the flow runs'
    network (the stack's subnets and security groups, no public IP unless asked), their containers' logs in the
    stack's flow-run log group, the Prefect API key from Secrets Manager (never in plaintext overrides), and the
    environment from the stack's ``Env``. A deployment's own job variables still win."""
    import copy

    from blocks.etl import EtlSettings

    defaults: dict[str, Any] = {
        "cluster": outputs["EcsCluster"],
        "task_role_arn": outputs["EcsTaskRoleArn"],
        "execution_role_arn": outputs["EcsExecutionRoleArn"],
        "vpc_id": parameters["VpcId"],
        "network_configuration": {
            "subnets": parameters["Subnets"].split(","),
            "securityGroups": parameters["SecurityGroups"].split(","),
            "assignPublicIp": parameters.get("AssignPublicIp", "DISABLED"),
        },
        "configure_cloudwatch_logs": True,
        "cloudwatch_logs_options": {
            "awslogs-group": outputs["FlowRunLogGroup"],
            "awslogs-region": region,
            "awslogs-stream-prefix": "flow-run",
        },
        "env": flow_run_environment(
            parameters["Env"],
            outputs,
            parameters.get("CatalogDatabase") or EtlSettings.model_fields["catalog_database"].default,
        ),
    }
    if parameters.get("PrefectApiKeySecretArn"):
        defaults["prefect_api_key_secret_arn"] = parameters["PrefectApiKeySecretArn"]
    template = copy.deepcopy(base)
    properties = template["variables"]["properties"]
    for name, value in defaults.items():
        properties[name]["default"] = value
    return template
