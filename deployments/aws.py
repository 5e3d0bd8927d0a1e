"""One environment in AWS: the template checked against CloudFormation's quotas and passed as AWS takes it.

CloudFormation takes a template inline only up to 51,200 bytes (the API refuses more, and `aws cloudformation
deploy` refuses a bigger file unless ``--s3-bucket`` is given); a bigger one goes through an S3 object of at most
1 MB named by ``TemplateURL``. ``template_argument`` does what the CLI does with ``--s3-bucket``: it uploads the
template to the artifact bucket (content-addressed, so an unchanged template is one object) and names it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
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


def wait_for(
    cloudformation: Any, stack: str, timeout_s: float = 3600, poll_s: float = POLL_S, executing: bool = False
) -> str:
    """Wait until the stack is no longer IN_PROGRESS; its final status. REVIEW_IN_PROGRESS (a stack only a CREATE
    change set made) is final unless ``executing``: right after ExecuteChangeSet the stack may still read it for
    a moment before CREATE_IN_PROGRESS, and the create goes on."""
    import time

    deadline = time.monotonic() + timeout_s
    while (status := stack_status(cloudformation, stack) or "DELETE_COMPLETE").endswith("_IN_PROGRESS"):
        if status in GONE and not executing:
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
    parameters: dict[str, str | None],
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
        StackName=stack,
        ChangeSetName=name,
        ChangeSetType=kind,
        Capabilities=["CAPABILITY_IAM"],
        Parameters=[  # None: the value the stack has (an index step keeps the deployed release running)
            {"ParameterKey": k, **({"UsePreviousValue": True} if v is None else {"ParameterValue": v})}
            for k, v in sorted(parameters.items())
        ],
        **template,
    )
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
    final = wait_for(cloudformation, stack, executing=True)
    if final not in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
        raise RuntimeError(f"stack {stack} ended {final}: " + "; ".join(failure_reasons(cloudformation, stack)))
    return {"action": kind, "changes": changes, "status": final}


TABLE_TYPE = "AWS::DynamoDB::Table"


def _index_operations(logical_id: str, deployed: dict, new: dict, refused: list[str]) -> list[tuple[str, dict]]:
    """One table resource's GSI changes as ('delete'|'create', index) operations; what CloudFormation cannot make
    in place (its key schema, an index's keys) is added to ``refused``."""
    if deployed.get("KeySchema") != new.get("KeySchema"):
        refused.append(f"{logical_id}: key schema {deployed.get('KeySchema')} -> {new.get('KeySchema')}")
    had = {g["IndexName"]: g for g in deployed.get("GlobalSecondaryIndexes", [])}
    wants = {g["IndexName"]: g for g in new.get("GlobalSecondaryIndexes", [])}
    for name in had.keys() & wants.keys():
        if had[name]["KeySchema"] != wants[name]["KeySchema"]:
            refused.append(f"{logical_id}: GSI {name} keys {had[name]['KeySchema']} -> {wants[name]['KeySchema']}")
    deletes = [("delete", had[name]) for name in had if name not in wants]
    return deletes + [("create", wants[name]) for name in wants if name not in had]


def _after(deployed: dict, new: dict, operations: list[tuple[str, dict]]) -> dict:
    """A table's deployed properties with ``operations`` applied, its AttributeDefinitions the ones its keys use."""
    indexes = {g["IndexName"]: g for g in deployed.get("GlobalSecondaryIndexes", [])}
    for operation, index in operations:
        if operation == "delete":
            indexes.pop(index["IndexName"])
        else:
            indexes[index["IndexName"]] = index
    used = {k["AttributeName"] for k in deployed["KeySchema"]}
    used |= {k["AttributeName"] for g in indexes.values() for k in g["KeySchema"]}
    known = {a["AttributeName"]: a for a in deployed["AttributeDefinitions"] + new["AttributeDefinitions"]}
    properties = {**deployed, "AttributeDefinitions": [known[name] for name in sorted(used)]}
    properties.pop("GlobalSecondaryIndexes", None)
    return properties | ({"GlobalSecondaryIndexes": list(indexes.values())} if indexes else {})


def index_steps(deployed: dict | None, new: dict) -> list[dict]:
    """The templates to deploy before ``new`` so that each stack update creates or deletes at most one GSI per table
    (CloudFormation's limit): the deployed template with one more index change per table at each step ([] when
    ``new`` does it in one). A change it cannot make in place is refused with the steps (ValueError)."""
    if not deployed:
        return []
    old_resources, new_resources = deployed.get("Resources", {}), new.get("Resources", {})
    refused: list[str] = []
    operations = {
        logical_id: _index_operations(
            logical_id, old_resources[logical_id]["Properties"], resource["Properties"], refused
        )
        for logical_id, resource in new_resources.items()
        if resource["Type"] == TABLE_TYPE and old_resources.get(logical_id, {}).get("Type") == TABLE_TYPE
    }
    if refused:
        raise ValueError(
            "Refusing to deploy: CloudFormation cannot change these tables in place (it would replace them, and "
            "cannot under their fixed names; nothing was changed):\n  " + "\n  ".join(refused) + "\n"
            "Steps: 1. declare the table under a new name (its Table.default_name) so the stack creates it beside "
            "the old one, and deploy; 2. with the stack's credentials, TABLE_<LOGICAL>=<old name> pipelines migrate "
            "copy-table <logical> <new name> (copies every item; resumable); 3. once checked, delete the old "
            "table (aws dynamodb delete-table --table-name <old name>)."
        )
    steps = []
    for count in range(1, max((len(ops) for ops in operations.values()), default=0)):
        template = json.loads(json.dumps(deployed))
        for logical_id, ops in operations.items():
            old = old_resources[logical_id]["Properties"]
            template["Resources"][logical_id]["Properties"] = _after(
                old, new_resources[logical_id]["Properties"], ops[:count]
            )
        steps.append(template)
    return steps


def deployed_template(cloudformation: Any, stack: str) -> dict | None:
    """The template the stack runs now (None: no stack)."""
    if stack_status(cloudformation, stack) in (None, *GONE):
        return None
    body = cloudformation.get_template(StackName=stack, TemplateStage="Original")["TemplateBody"]
    return json.loads(body) if isinstance(body, str) else body


def apply_index_steps(
    cloudformation: Any, stack: str, body: str, argument: Callable[[str], dict[str, str]], dry_run: bool = False
) -> int:
    """Deploy ``index_steps`` one after another at the stack's own parameter values (the release that runs keeps
    running until the last index is in; each update waits for its index to be ACTIVE). How many there were."""
    deployed = deployed_template(cloudformation, stack)
    steps = index_steps(deployed, json.loads(body))
    if dry_run or not steps:
        return len(steps)
    keep = {p: None for p in (deployed or {}).get("Parameters", {})}
    for number, template in enumerate(steps, 1):
        say(f"stack {stack}: index step {number} of {len(steps)} (CloudFormation adds one GSI per table per update)")
        change_set(cloudformation, stack, argument(json.dumps(template, indent=2)), keep)
    return len(steps)


def stack_outputs(cloudformation: Any, stack: str) -> dict[str, str]:
    """The stack's outputs by key."""
    described = cloudformation.describe_stacks(StackName=stack)["Stacks"][0]
    return {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}


# --------------------------------------------------------------------------- the flow runs' pool


def flow_run_environment(env: str, outputs: dict[str, str], parameters: dict[str, str]) -> dict[str, str]:
    """What every flow-run container is configured by, from the stack: its tables' env (and the tables the stack
    renames), the store, each pipeline's parameters its containers read; the same as the listeners' task
    definitions carry."""
    from infra import cloudformation as cfn
    from tasks.health.cloudwatch import ENV_VARIABLE

    variables = {"TABLE_ENV": env, "OBJECT_STORE_BASE_URL": outputs["BucketUrl"], ENV_VARIABLE: env}
    for parts in cfn.pipeline_parts():
        given = parts.parameter_defaults() | {k: v for k, v in parameters.items() if k in parts.parameters and v}
        variables |= {variable: given[parameter] for variable, parameter in parts.environment.items()}
    variables |= {
        f"TABLE_{logical.upper()}": name.replace(cfn.ENV, env) for logical, name in cfn.renamed_tables().items()
    }
    return variables


def pool_job_template(
    base: dict[str, Any], outputs: dict[str, str], parameters: dict[str, str], region: str
) -> dict[str, Any]:
    """The ``aws-ecs`` pool's base job template with the stack's defaults: the cluster and roles, the flow runs'
    network (the stack's subnets and security groups, no public IP unless asked), their containers' logs in the
    stack's flow-run log group, the Prefect API key and the launch key from Secrets Manager (never in plaintext
    overrides), and the environment from the stack's ``Env``. A deployment's own job variables still win."""
    import copy

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
        "env": flow_run_environment(parameters["Env"], outputs, parameters),
    }
    if parameters.get("PrefectApiKeySecretArn"):
        defaults["prefect_api_key_secret_arn"] = parameters["PrefectApiKeySecretArn"]
    template = copy.deepcopy(base)
    properties = template["variables"]["properties"]
    for name, value in defaults.items():
        properties[name]["default"] = value
    # the launch key as ECS hands it to the stack's own containers: from Secrets Manager (prefect-aws adds the API
    # key's beside it), never in the run's plaintext environment
    [container] = template["job_configuration"]["task_definition"]["containerDefinitions"]
    container["secrets"] = [{"name": "PIPELINES_LAUNCH_KEY", "valueFrom": outputs["LaunchKeySecretArn"]}]
    return template


# --------------------------------------------------------------------------- the one command


def say(message: str) -> None:
    """Progress, one line on stderr (stdout carries the command's JSON result)."""
    import sys

    print(f"==> {message}", file=sys.stderr, flush=True)


def image_tag() -> str:
    """The image's tag: the checkout's commit, so an unchanged checkout deploys an unchanged stack."""
    import subprocess

    from infra.cloudformation import REPO_ROOT

    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    if commit.returncode != 0:
        raise RuntimeError("not a git checkout: give --image-tag")
    return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def ensure_repository(ecr: Any, name: str) -> tuple[str, str]:
    """The ECR repository (scanned on push; tags stay mutable: `prefect deploy` pushes its own build of the same
    commit under the same tag, and a Docker build is not byte-for-byte repeatable); (its URI, created|exists)."""
    try:
        return ecr.describe_repositories(repositoryNames=[name])["repositories"][0]["repositoryUri"], "exists"
    except ecr.exceptions.RepositoryNotFoundException:
        made = ecr.create_repository(repositoryName=name, imageScanningConfiguration={"scanOnPush": True})
        return made["repository"]["repositoryUri"], "created"


def ensure_artifact_bucket(s3: Any, name: str) -> str:
    """The bucket templates go through: private, encrypted; created|exists."""
    if name in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        return "exists"
    region = s3.meta.region_name
    s3.create_bucket(
        Bucket=name, **({} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}})
    )
    private = {
        "BlockPublicAcls": True,
        "IgnorePublicAcls": True,
        "BlockPublicPolicy": True,
        "RestrictPublicBuckets": True,
    }
    s3.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration=private)
    s3.put_bucket_encryption(
        Bucket=name,
        ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
        },
    )
    return "created"


def build_and_push(ecr: Any, repository: str, tag: str) -> dict[str, Any]:
    """The Dockerfile's image built for Fargate and pushed, by prefect.yaml's own steps (prefect-docker)."""
    from prefect_docker.deployments.steps import build_docker_image, push_docker_image

    from infra.cloudformation import REPO_ROOT

    built = build_docker_image(
        image_name=repository,
        tag=tag,
        dockerfile=str(REPO_ROOT / "Dockerfile"),
        platform="linux/amd64",
        path=str(REPO_ROOT),
    )
    credentials = ecr_login(built["image_name"], ecr)["credentials"]
    push_docker_image(image_name=built["image_name"], tag=built["tag"], credentials=credentials)
    return {"image": built["image"]}


def aws_target(region: str | None, session: Any = None, doing: str = "change") -> tuple[Any, str, str]:
    """(session, account, region) of boto3's own credential chain (keys, profile, SSO, instance or task role) and
    region (``region``, else AWS_REGION, AWS_DEFAULT_REGION, the profile's region); said on stderr before anything
    changes, so a person sees which account and region the command is about to change (``doing``)."""
    import os

    import boto3

    # AWS_REGION is the AWS CLI v2's and the other SDKs' variable (over AWS_DEFAULT_REGION); botocore reads only the
    # latter and the profile's, so it is read here
    region = region or os.environ.get("AWS_REGION") or None
    session = session or boto3.session.Session(region_name=region)
    region = region or session.region_name
    if not region:
        raise ValueError("no AWS region: give --region, or set AWS_REGION or a region in your AWS profile")
    identity = session.client("sts", region_name=region).get_caller_identity()
    say(f"AWS account {identity['Account']} ({identity['Arn']}), region {region}: about to {doing}")
    return session, identity["Account"], region


ECR_HOST = re.compile(r"(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?")


def ecr_login(image_name: str, ecr: Any = None) -> dict[str, dict[str, str]]:
    """prefect.yaml's step before the ecs push (and ``build_and_push``'s): the ECR login of the image's registry from
    ``ecr get-authorization-token`` (valid 12 hours), as ``{"credentials": ...}`` for prefect-docker's push step,
    whose Docker client logs in with it in the process that pushes: a login in another process (an earlier push's
    Docker client) lives only in that process's memory."""
    import base64

    import boto3

    found = ECR_HOST.fullmatch(image_name.split("/", 1)[0])
    if found is None:
        raise ValueError(f"{image_name!r} is not in an ECR registry (ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME)")
    ecr = ecr or boto3.client("ecr", region_name=found["region"])
    token = ecr.get_authorization_token()["authorizationData"][0]
    username, password = base64.b64decode(token["authorizationToken"]).decode().split(":", 1)
    return {"credentials": {"username": username, "password": password, "registry_url": token["proxyEndpoint"]}}


def deploy_state_name(env: str) -> str:
    """The Prefect variable remembering what the last deploy of ``env`` applied (its fingerprint)."""
    return f"pipelines_aws_{env.replace('-', '_')}"


def fingerprint(*parts: Any) -> str:
    """A digest of what a deploy applies to the Prefect server (image, pool template, prefect.yaml)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def apply_prefect(
    env: str, outputs: dict[str, str], parameters: dict[str, str], region: str, image: dict[str, str]
) -> dict[str, str]:
    """The aws-ecs pool with the stack's defaults, the aws-maintenance pool (its worker is the stack's maintenance
    service), the blocks, then `prefect deploy --name ecs`; each skipped when the server already holds it (a Prefect
    variable keeps the last deploy's fingerprint)."""
    import os
    import subprocess
    import sys

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound
    from prefect.variables import Variable

    from blocks.core import DynamoTables, ObjectStorage
    from deployments.local_stack import (
        ECS_WORK_POOL,
        MAINTENANCE_WORK_POOL,
        ecs_base_job_template,
        maintenance_base_job_template,
    )
    from infra import cloudformation as cfn

    done: dict[str, str] = {}
    pools = {  # what done names each: "pool" stays the ECS pool's
        "pool": (ECS_WORK_POOL, "ecs", pool_job_template(ecs_base_job_template(), outputs, parameters, region)),
        "maintenance pool": (MAINTENANCE_WORK_POOL, "process", maintenance_base_job_template()),
    }
    with get_client(sync_client=True) as client:
        for said, (name, kind, template) in pools.items():
            try:
                pool = client.read_work_pool(name)
                if pool.base_job_template != template:
                    client.update_work_pool(name, WorkPoolUpdate(base_job_template=template))
                    done[said] = "updated"
                else:
                    done[said] = "unchanged"
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=name, type=kind, base_job_template=template))
                done[said] = "created"
    renamed = {logical: name.replace(cfn.ENV, env) for logical, name in cfn.renamed_tables().items()}
    for block, wanted in (
        (DynamoTables, DynamoTables(env=env, names=renamed)),
        (ObjectStorage, ObjectStorage(base_url=outputs["BucketUrl"])),
    ):
        fields = set(block.model_fields) - {"aws_credentials"}  # none in AWS: the task role grants access
        try:
            saved = block.load("default", validate=False).model_dump(include=fields)
        except ValueError:
            saved = None
        if saved == wanted.model_dump(include=fields):
            done[block.__name__] = "unchanged"
        else:
            wanted.save("default", overwrite=True)
            done[block.__name__] = "saved"
    state = fingerprint(image, (cfn.REPO_ROOT / "prefect.yaml").read_text(), outputs)
    if Variable.get(deploy_state_name(env), default=None) == state:
        done["deployments"] = "unchanged"
        return done
    say("prefect deploy --name ecs")
    repository, tag = image["image"].rsplit(":", 1)
    variables = {
        "PIPELINES_IMAGE_REPOSITORY": repository,
        "PIPELINES_IMAGE_TAG": tag,
        "ECS_CLUSTER": outputs["EcsCluster"],
        "ECS_TASK_ROLE_ARN": outputs["EcsTaskRoleArn"],
        "ECS_EXECUTION_ROLE_ARN": outputs["EcsExecutionRoleArn"],
        "PIPELINES_BUCKET_URL": outputs["BucketUrl"],
        "PREFECT_API_URL": parameters["PrefectApiUrl"],
    }
    command = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--name", "ecs"]
    result = subprocess.run(command, cwd=cfn.REPO_ROOT, env={**os.environ, **variables}, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError("prefect deploy --name ecs failed: " + (result.stdout + result.stderr)[-2000:])
    Variable.set(deploy_state_name(env), state, overwrite=True)
    done["deployments"] = "deployed"
    return done


def env_refusal(env: str) -> str | None:
    """Why the template's Env parameter would refuse ``env`` (None: it takes it), found before any call to AWS."""
    import re

    from infra import cloudformation as cfn

    declared = json.loads(cfn.TEMPLATE_PATH.read_text())["Parameters"]["Env"]
    if declared["MinLength"] <= len(env) <= declared["MaxLength"] and re.fullmatch(declared["AllowedPattern"], env):
        return None
    return f"--env {env!r} ({len(env)} characters): give {declared['ConstraintDescription']}"


def kept_data(session: Any, region: str, env: str, bucket: str) -> dict[str, str]:
    """The tables and the data bucket of ``env`` that exist outside any stack (a destroyed stack kept them:
    RetainExceptOnCreate), each with the command that deletes it; a new stack's create fails on them."""
    from botocore.exceptions import ClientError

    from infra import cloudformation as cfn

    dynamodb, s3 = session.client("dynamodb", region_name=region), session.client("s3", region_name=region)
    existing = {name for page in dynamodb.get_paginator("list_tables").paginate() for name in page["TableNames"]}
    wanted = sorted(name.replace(cfn.ENV, env) for name in cfn.stack_table_names().values())
    found = {
        f"table {name}": f"aws dynamodb delete-table --region {region} --table-name {name}"
        for name in wanted
        if name in existing
    }
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as error:
        if error.response["Error"]["Code"] not in ("404", "NoSuchBucket"):
            found[f"bucket {bucket}"] = f"the name is taken ({error.response['Error']['Code']}): give --bucket"
        return found
    found[f"bucket {bucket}"] = (  # versioned: every version goes before the bucket can
        f"python -c \"import boto3; b = boto3.resource('s3', region_name='{region}').Bucket('{bucket}'); "
        f'b.object_versions.delete(); b.delete()"'
    )
    return found


def refuse_kept_data(session: Any, region: str, env: str, bucket: str) -> None:
    """A RuntimeError naming what a create of ``env``'s stack would fail on ("already exists") and what to run."""
    found = kept_data(session, region, env, bucket)
    if found:
        commands = "; ".join(f"{what}: {command}" for what, command in found.items())
        raise RuntimeError(
            f"the stack of {env} would be created, but {len(found)} of its tables or bucket exist from an earlier "
            f"stack (kept by destroy), and CloudFormation fails a create on them (already exists). Delete them "
            f"(their data goes) with: {commands}"
        )


CLOUD_API_HOST = "api.prefect.cloud"
AWS_MANAGED_SECRET_KEY = "alias/aws/secretsmanager"


def api_key_secret_name(env: str) -> str:
    """The secret the deploy makes for a Prefect Cloud API key when none is given."""
    return f"pipelines/{env}/prefect-api-key"


def local_api_key() -> str:
    """The Prefect API key of this shell: PREFECT_API_KEY, else the active profile's (`prefect cloud login`)."""
    import os

    from prefect.settings import PREFECT_API_KEY

    value = os.environ.get("PREFECT_API_KEY") or PREFECT_API_KEY.value()
    return value.get_secret_value() if hasattr(value, "get_secret_value") else (value or "")


def checked_secret(secrets: Any, kms: Any, secret: str) -> dict[str, str]:
    """The secret ``secret`` (a name or ARN) as ECS reads it: its full ARN and the customer managed key the
    execution role must decrypt it with ("" for the AWS managed one); a ValueError unless it holds a plain string
    (ECS puts the whole SecretString in PREFECT_API_KEY: a JSON object would be the key)."""
    described = secrets.describe_secret(SecretId=secret)
    value = secrets.get_secret_value(SecretId=described["ARN"]).get("SecretString")
    if not value or value.lstrip().startswith(("{", "[")):
        raise ValueError(
            f"secret {described['ARN']} must hold the Prefect API key as a plain string, not JSON or bytes"
        )
    key, key_arn = described.get("KmsKeyId") or "", ""
    if key and key != AWS_MANAGED_SECRET_KEY:  # an AWS managed key's policy already lets Secrets Manager's callers
        metadata = kms.describe_key(KeyId=key)["KeyMetadata"]
        key_arn = "" if metadata.get("KeyManager") == "AWS" else metadata["Arn"]
    return {"arn": described["ARN"], "kms_key_arn": key_arn, "value": value}


def prefect_api_key_secret(
    session: Any, region: str, env: str, api_url: str, given: str = "", dry_run: bool = False
) -> dict[str, str]:
    """The Secrets Manager secret of the workers' PREFECT_API_KEY: ``given`` checked (full ARN, a plain string, its
    key); for a Prefect Cloud API URL with none given, ``pipelines/{env}/prefect-api-key`` made or brought up to date
    from this shell's key (a dry run says what it would do and changes nothing); for a server without auth, none.
    Returns ``{"arn", "kms_key_arn", "secret"}`` (secret: checked|created|updated|unchanged|would create|...)."""
    from urllib.parse import urlparse

    secrets, kms = session.client("secretsmanager", region_name=region), session.client("kms", region_name=region)
    if given:
        checked = checked_secret(secrets, kms, given)
        return {"arn": checked["arn"], "kms_key_arn": checked["kms_key_arn"], "secret": "checked"}
    if not (urlparse(api_url).hostname or "").endswith(CLOUD_API_HOST):
        return {"arn": "", "kms_key_arn": "", "secret": "none (a server without auth)"}
    key = local_api_key()
    if not key:
        raise ValueError(
            f"{api_url} is Prefect Cloud, which takes an API key: run `prefect cloud login` or set PREFECT_API_KEY "
            "(the deploy keeps it in Secrets Manager), or give --api-key-secret-arn"
        )
    name = api_key_secret_name(env)
    try:
        checked = checked_secret(secrets, kms, name)
    except secrets.exceptions.ResourceNotFoundException:
        if dry_run:
            placeholder = f"arn:aws:secretsmanager:{region}:000000000000:secret:{name}"
            return {"arn": placeholder, "kms_key_arn": "", "secret": f"would create {name}"}
        made = secrets.create_secret(Name=name, SecretString=key, Description="PREFECT_API_KEY of the pipelines")
        return {"arn": made["ARN"], "kms_key_arn": "", "secret": "created"}
    action = "unchanged" if checked["value"] == key else ("would update" if dry_run else "updated")
    if action == "updated":
        secrets.put_secret_value(SecretId=checked["arn"], SecretString=key)
    return {"arn": checked["arn"], "kms_key_arn": checked["kms_key_arn"], "secret": action}


def pipelines_parameters(given: dict[str, str]) -> dict[str, str]:
    """Every pipeline's own stack parameter: its value in ``given``, else its default; a name no pipeline declares
    is refused (a typo would otherwise deploy the default silently)."""
    from infra import cloudformation as cfn

    values = {name: value for parts in cfn.pipeline_parts() for name, value in parts.parameter_defaults().items()}
    unknown = sorted(set(given) - set(values))
    if unknown:
        raise ValueError(f"no pipeline declares the stack parameter(s) {unknown}; known: {sorted(values)}")
    return values | given


def deploy(
    env: str,
    region: str | None,
    vpc: str,
    subnets: list[str],
    security_groups: list[str],
    prefect_api_url: str,
    bucket: str | None = None,
    api_key_secret_arn: str = "",
    tag: str | None = None,
    assign_public_ip: str = "DISABLED",
    dry_run: bool = False,
    session: Any = None,
    pipeline_parameters: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`pipelines aws-stack deploy`: ECR repository, image, the stack by a change set through the artifact bucket, the
    pool, blocks and deployments on the Prefect server. Idempotent: a second run with nothing changed changes
    nothing. ``dry_run``: the change set's changes only (the artifact bucket is made if absent and the template
    object uploaded, and said so; nothing else changes). A create that would fail on the tables or bucket an earlier
    stack kept is refused first, with the commands that delete them. Before any change (a dry run too) the
    prerequisites are checked (deployments/aws_prerequisites.py: the network, Docker, the Prefect API, its workspace
    held by no other env), every missing one named.
    ``pipeline_parameters``: values of the pipelines' own stack parameters (``Pipeline.aws``); the others take their
    defaults."""
    from deployments.aws_prerequisites import refuse_unless_ready
    from infra import cloudformation as cfn

    pipelines = pipelines_parameters(pipeline_parameters or {})
    if refusal := env_refusal(env):
        raise ValueError(refusal)
    stack, tag = cfn.STACK_NAME.replace(cfn.ENV, env), tag or image_tag()
    doing = f"plan stack {stack} (a dry run)" if dry_run else f"deploy stack {stack}"
    session, account, region = aws_target(region, session, doing)
    parameters = {
        "Env": env,
        "BucketName": bucket or f"pipelines-{account}-{env}",
        "ImageTag": tag,
        "PrefectApiUrl": prefect_api_url,
        "PrefectApiKeySecretArn": api_key_secret_arn,
        "VpcId": vpc,
        "Subnets": ",".join(subnets),
        "SecurityGroups": ",".join(security_groups),
        "AssignPublicIp": assign_public_ip,
    }
    parameters |= pipelines
    refuse_unless_ready(
        session, region, env, vpc, subnets, security_groups, prefect_api_url, assign_public_ip == "ENABLED"
    )
    if stack_status(session.client("cloudformation", region_name=region), stack) in (None, *GONE):
        refuse_kept_data(session, region, env, parameters["BucketName"])
    secret = prefect_api_key_secret(session, region, env, prefect_api_url, api_key_secret_arn, dry_run)
    say(f"Prefect API key secret: {secret['secret']} {secret['arn']}".rstrip())
    parameters |= {"PrefectApiKeySecretArn": secret["arn"], "PrefectApiKeySecretKmsKeyArn": secret["kms_key_arn"]}
    result: dict[str, Any] = {"stack": stack, "parameters": parameters, "api_key_secret": secret["secret"]}
    s3, ecr = session.client("s3", region_name=region), session.client("ecr", region_name=region)
    artifacts = f"pipelines-artifacts-{account}-{region}"
    result["artifact_bucket"] = ensure_artifact_bucket(s3, artifacts)
    why = (
        " (a dry run too: the change set reads the template from it)" if result["artifact_bucket"] == "created" else ""
    )
    say(f"artifact bucket {artifacts}: {result['artifact_bucket']}{why}")
    body = cfn.TEMPLATE_PATH.read_text()
    template = template_argument(body, env, s3, artifacts)
    # one GSI per table per update: the steps before the change set (at the running release), or a refusal
    result["index_steps"] = apply_index_steps(
        session.client("cloudformation", region_name=region),
        stack,
        body,
        lambda step: template_argument(step, env, s3, artifacts),
        dry_run=dry_run,
    )
    if dry_run:
        result["change_set"] = change_set(
            session.client("cloudformation", region_name=region), stack, template, parameters, dry_run=True
        )
        say(f"change set of {stack}: {result['change_set']['action']}, {len(result['change_set']['changes'])} changes")
        return result
    repository, made = ensure_repository(ecr, "pipelines")
    say(f"ECR repository {repository}: {made}")
    image = {"image": f"{repository}:{tag}"}
    pushed = {i.get("imageTag") for i in ecr.list_images(repositoryName="pipelines").get("imageIds", [])}
    if tag in pushed:  # the tag names the checkout's commit: the image of this commit is there
        result["image"] = "unchanged"
    else:
        say(f"build and push {repository}:{tag}")
        image = build_and_push(ecr, repository, tag)
        result["image"] = "pushed"
    say(f"change set of {stack}")
    result["change_set"] = change_set(session.client("cloudformation", region_name=region), stack, template, parameters)
    say(f"stack {stack}: {result['change_set']['action']} ({result['change_set']['status']})")
    outputs = stack_outputs(session.client("cloudformation", region_name=region), stack)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_api_url}):  # the server the stack's workers talk to
        result["prefect"] = apply_prefect(env, outputs, parameters, region, image)
    say(f"prefect: {result['prefect']}")
    return result


KEPT_WHY = (
    "data: RetainExceptOnCreate keeps the tables and the bucket when the stack goes; delete them yourself once "
    "nothing needs them (a deploy of this env refuses to create the stack until then, and prints the commands)"
)


def destroy(env: str, region: str | None, session: Any = None) -> dict[str, Any]:
    """`pipelines aws-stack destroy`: the stack (its data kept, and said so), the artifact bucket's templates, the ECR
    repository (the image is rebuilt from the checkout) unless another env's stack runs from it, and the aws-ecs and
    aws-maintenance pools' deployments (and the latter pool) on the Prefect server when ``env`` holds that workspace
    (another env's are kept, and said so)."""
    from infra import cloudformation as cfn

    stack, deleted, kept = cfn.STACK_NAME.replace(cfn.ENV, env), [], {}
    session, account, region = aws_target(region, session, f"delete stack {stack}")
    cloudformation, s3, ecr = (session.client(s, region_name=region) for s in ("cloudformation", "s3", "ecr"))
    if stack_status(cloudformation, stack):
        for resource in cloudformation.list_stack_resources(StackName=stack)["StackResourceSummaries"]:
            if resource["ResourceType"] in ("AWS::DynamoDB::Table", "AWS::S3::Bucket"):
                kept[f"{resource['ResourceType']} {resource['PhysicalResourceId']}"] = KEPT_WHY
        say(f"delete stack {stack}")
        cloudformation.delete_stack(StackName=stack)
        if (final := wait_for(cloudformation, stack)) != "DELETE_COMPLETE":
            raise RuntimeError(f"stack {stack} ended {final}: " + "; ".join(failure_reasons(cloudformation, stack)))
        deleted.append(f"stack {stack}")
    artifacts = f"pipelines-artifacts-{account}-{region}"
    if artifacts in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        listed = s3.list_objects_v2(Bucket=artifacts, Prefix=f"templates/pipelines-{env}/").get("Contents", [])
        for item in listed:
            s3.delete_object(Bucket=artifacts, Key=item["Key"])
        deleted.append(f"{len(listed)} templates in s3://{artifacts}")
        if not s3.list_objects_v2(Bucket=artifacts).get("KeyCount"):
            s3.delete_bucket(Bucket=artifacts)
            deleted.append(f"bucket {artifacts}")
    if others := other_stacks(cloudformation, env):  # their services pull their images from it
        kept["ECR repository pipelines"] = f"the stacks {', '.join(others)} run images from it"
    else:
        try:
            ecr.delete_repository(repositoryName="pipelines", force=True)
            deleted.append("ECR repository pipelines")
        except ecr.exceptions.RepositoryNotFoundException:
            pass
    done, why = delete_ecs_deployments(env)
    deleted += done
    kept |= {"prefect": why} if why else {}
    return {"deleted": deleted, "kept": kept}


def other_stacks(cloudformation: Any, env: str) -> list[str]:
    """The other envs' pipelines stacks alive in this account and region (they share the ECR repository)."""
    from infra import cloudformation as cfn

    mine, prefix = cfn.STACK_NAME.replace(cfn.ENV, env), cfn.STACK_NAME.replace(cfn.ENV, "")
    found = []
    for page in cloudformation.get_paginator("describe_stacks").paginate():
        for stack in page["Stacks"]:
            envs = [p["ParameterValue"] for p in stack.get("Parameters", []) if p["ParameterKey"] == "Env"]
            named = envs and stack["StackName"] == prefix + envs[0]
            if named and stack["StackName"] != mine and stack["StackStatus"] not in ("DELETE_COMPLETE", *GONE):
                found.append(stack["StackName"])
    return sorted(found)


def delete_ecs_deployments(env: str) -> tuple[list[str], str]:
    """The AWS set's deployments (no worker serves them once the stack is gone), the ECS pool's defaults put back bare,
    the maintenance pool (its worker was the stack's service) and the deploy's variable, when ``env`` holds the
    workspace; another env's are left as they are (and the reason given)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolUpdate
    from prefect.client.schemas.filters import WorkPoolFilter, WorkPoolFilterName
    from prefect.exceptions import ObjectNotFound

    from deployments.aws_prerequisites import ecs_pool_owner
    from deployments.local_stack import ECS_WORK_POOL, MAINTENANCE_WORK_POOL, ecs_base_job_template

    with get_client(sync_client=True) as client:
        if (owner := ecs_pool_owner(client)) not in (None, env):
            return [], f"the Prefect workspace's {ECS_WORK_POOL} pool, blocks and deployments are env {owner}'s"
        deleted = []
        for name in (ECS_WORK_POOL, MAINTENANCE_WORK_POOL):
            pool = WorkPoolFilter(name=WorkPoolFilterName(any_=[name]))
            deployments = client.read_deployments(work_pool_filter=pool)
            for deployment in deployments:
                client.delete_deployment(deployment.id)
            deleted.append(f"{len(deployments)} deployments of the {name} pool")
        if owner is not None:  # bare again: the workspace is free for another env
            client.update_work_pool(ECS_WORK_POOL, WorkPoolUpdate(base_job_template=ecs_base_job_template()))
        try:
            client.delete_work_pool(MAINTENANCE_WORK_POOL)
            deleted.append(f"the {MAINTENANCE_WORK_POOL} pool")
        except ObjectNotFound:
            pass
        variable = client.read_variable_by_name(deploy_state_name(env))
        if variable is not None:
            client.delete_variable_by_name(deploy_state_name(env))
    return deleted, ""
