"""Every AWS API call the code makes, recorded through botocore's event hooks with the role that makes it in AWS.

With ``PIPELINES_AWS_CALL_LOG=<file>`` set, each botocore session (boto3's, the code's own, prefect-aws's) gets a
``before-parameter-build`` handler (it sees the call's own parameters) that appends one JSON line per call:
service, operation, parameters, and the role that would make it in AWS, read from the call's stack: prefect-aws's
ECS worker → ``worker`` (the WorkerRole), tasks/landing/ (the listeners) → ``listener`` and the rest of tasks/,
flows/, blocks/ → ``task`` (both the TaskRole). The test harness's own calls (tests/, moto's fixtures), the
operator's (deployments/ and ``ensure_tables``: admin credentials) are left out. The GPU backend's ECS and EC2 calls
(on your GPU cluster, ``GpuClusterName``) and the SageMaker backend's (your endpoints, ``VideoEndpointPrefix``) are
the flow runs' own: the task role's. Child processes (workers, flow runs, listeners) record too:
``install_in_children`` puts this module's ``sitecustomize`` on their PYTHONPATH. The tags EC2 instances are
launched or tagged with (by anyone, the tests included) are logged too (``read_resource_tags``): IAM reads an
instance's own tags (``aws:ResourceTag/...``) when a call acts on it. tests/aws/test_aws_policies.py evaluates the lines
against the template's roles.

Which resources are the stack's: a name stands for the stack's resource of its kind only where the test world
made it so, as CloudFormation would have: a bucket, queue, cluster or role the harness or the operator created
(``created`` lines: their create calls), or the cluster and roles the operator configured the worker with
(``ECS_CLUSTER``, ``ECS_TASK_ROLE_ARN``, ``ECS_EXECUTION_ROLE_ARN`` in the calling process). Any other name is
evaluated as itself, so a call against a resource the stack does not own is denied as AWS would deny it. Each
registered task definition's roles are logged too (``task_definitions``): a RunTask or StartTask passes them.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.policy_eval import Request

LOG_VARIABLE = "PIPELINES_AWS_CALL_LOG"
REPO_ROOT = Path(__file__).resolve().parents[2]
SITE_DIR = Path(__file__).resolve().parent / "aws_calls_site"
ROLES = (  # the innermost frame under one of these paths names the role
    (f"{os.sep}prefect_aws{os.sep}workers{os.sep}", "worker"),
    (f"{os.sep}prefect_aws{os.sep}observers{os.sep}", "worker"),  # the worker's observer (crash detection)
    (str(REPO_ROOT / "tests") + os.sep, None),
    (str(REPO_ROOT / "deployments") + os.sep, None),
    (str(REPO_ROOT / "tasks" / "core" / "tables.py"), None),  # ensure_tables: make up's; the template makes them
    (str(REPO_ROOT / "tasks" / "landing") + os.sep, "listener"),
    (str(REPO_ROOT / "tasks") + os.sep, "task"),
    (str(REPO_ROOT / "flows") + os.sep, "task"),
    (str(REPO_ROOT / "blocks") + os.sep, "task"),
)
_lock = threading.Lock()
_installed = False
_configured_written: set[str] = set()  # the configurations this process has logged


def role_of_caller() -> tuple[str | None, str]:
    """The role whose credentials make the current call, and the frame that decided it (file:line)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        for marker, role in ROLES if filename != __file__ else ():
            if marker in filename:
                return (
                    role,
                    f"{Path(filename).relative_to(REPO_ROOT) if role != 'worker' else 'prefect_aws'}:{frame.f_lineno}",
                )
        frame = frame.f_back
    return None, ""


def jsonable(value: Any) -> Any:
    """Call parameters as JSON: bytes and streams as their size, anything else as text."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    return f"<{type(value).__name__}>"


CREATES = {  # the create calls that make a resource the stack's (kind, the parameter naming it)
    ("s3", "CreateBucket"): ("bucket", "Bucket"),
    ("sqs", "CreateQueue"): ("queue", "QueueName"),
    ("ecs", "CreateCluster"): ("cluster", "clusterName"),
    ("iam", "CreateRole"): ("role", "RoleName"),
}
CONFIGURED = {"ECS_CLUSTER": "cluster", "ECS_TASK_ROLE_ARN": "task_role", "ECS_EXECUTION_ROLE_ARN": "execution_role"}


def record(model: Any, params: dict[str, Any], **_: Any) -> None:
    """botocore's ``before-parameter-build`` handler: one JSON line per call made by the code; the harness's and
    the operator's create calls as the resources they make the stack's; every task definition's roles."""
    role, where = role_of_caller()
    service = model.service_model.service_name
    if model.name == "RegisterTaskDefinition":
        roles = {k: params.get(k) for k in ("taskRoleArn", "executionRoleArn") if params.get(k)}
        _write({"task_definition": {params.get("family", ""): roles}, "pid": os.getpid()})
    if role is None:
        kind, name = CREATES.get((service, model.name), (None, None))
        if kind and params.get(name):
            _write({"created": [kind, params[name]], "pid": os.getpid()})
        return
    configured = {kind: os.environ[variable] for variable, kind in CONFIGURED.items() if os.environ.get(variable)}
    if configured and json.dumps(configured, sort_keys=True) not in _configured_written:
        _configured_written.add(json.dumps(configured, sort_keys=True))
        _write({"configured": configured, "pid": os.getpid()})
    line = {
        "service": service,
        "operation": model.name,
        "role": role,
        "where": where,
        "params": jsonable(params),
        "pid": os.getpid(),
    }
    _write(line)


def _write(line: dict[str, Any]) -> None:
    """Append one JSON line to the log."""
    with _lock, open(os.environ[LOG_VARIABLE], "a") as log:
        log.write(json.dumps(line, default=str) + "\n")


def record_instance_tags(parsed: dict[str, Any], model: Any, **_: Any) -> None:
    """botocore's ``after-call`` handler on EC2: the tags each launched instance carries, whoever launched it (the
    tests' instances included), since IAM reads a resource's own tags (``aws:ResourceTag/...``) when it is acted on."""
    if model.name != "RunInstances":
        return
    tags = {i["InstanceId"]: {t["Key"]: t["Value"] for t in i.get("Tags", [])} for i in parsed.get("Instances", [])}
    _write({"resource_tags": tags, "pid": os.getpid()})


def record_created_tags(params: dict[str, Any], model: Any, **_: Any) -> None:
    """botocore's ``before-parameter-build`` handler on EC2 ``CreateTags``: the tags added to existing resources."""
    if model.name == "CreateTags":
        tags = {t["Key"]: t.get("Value", "") for t in params.get("Tags", [])}
        _write({"resource_tags": dict.fromkeys(params.get("Resources", []), tags), "pid": os.getpid()})


def install() -> None:
    """Register ``record`` on every botocore session created from now on in this process (once)."""
    global _installed
    if _installed or not os.environ.get(LOG_VARIABLE):
        return
    import botocore.session

    original = botocore.session.Session.__init__

    def recorded_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.register("before-parameter-build", record)
        self.register("before-parameter-build.ec2", record_created_tags)
        self.register("after-call.ec2", record_instance_tags)

    botocore.session.Session.__init__ = recorded_init
    _installed = True


def install_in_children() -> None:
    """Child processes record too: this module's sitecustomize leads their PYTHONPATH."""
    paths = [str(SITE_DIR), str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


def _lines(path: Path) -> list[dict[str, Any]]:
    """The log's lines."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def read(path: Path) -> list[dict[str, Any]]:
    """The recorded calls."""
    return [line for line in _lines(path) if "operation" in line]


def read_resource_tags(path: Path) -> dict[str, dict[str, str]]:
    """Resource id -> the tags it carries, as the log's launches and CreateTags calls left them."""
    tags: dict[str, dict[str, str]] = {}
    for line in _lines(path):
        for resource, added in line.get("resource_tags", {}).items():
            tags[resource] = {**tags.get(resource, {}), **added}
    return tags


def pytest_configure(config) -> None:
    """As a pytest plugin: record the session's calls and its children's when the log variable is set."""
    if os.environ.get(LOG_VARIABLE):
        install()
        install_in_children()


# --------------------------------------------------------------------------- calls as IAM authorizations

ACCOUNT, REGION, ENV = "123456789012", "us-east-1", "test"
GPU_CLUSTER, VIDEO_ENDPOINT_PREFIX = "gpu-test", "pipelines-video-"  # the test stack's GPU cluster and endpoints
GPU_BACKEND = str(Path("tasks") / "gpu" / "backends.py")  # its ECS calls are on the GPU cluster, not the stack's
# "maintenance": the maintenance service's flows (their code is the task role's; tests name it for the service)
TEMPLATE_ROLES = {"worker": "WorkerRole", "task": "TaskRole", "listener": "TaskRole", "maintenance": "MaintenanceRole"}
MULTIVALUED = "multivalued:"  # supported_condition_keys: the multivalued keys of an action
GLOBAL_KEYS = ("aws:SecureTransport", "aws:CurrentTime", "aws:PrincipalArn", "aws:PrincipalAccount")
SAR_SCRIPT = """
import json, os, sys
import parliament
with open(os.path.join(os.path.dirname(parliament.__file__), "iam_definition.json")) as f:
    services = {s["prefix"]: s for s in json.load(f)}
out = {}
for action in json.load(sys.stdin):
    prefix, name = action.split(":")
    service = services[prefix]
    (privilege,) = [p for p in service["privileges"] if p["privilege"].lower() == name.lower()]
    resources = {r["resource"]: r for r in service["resources"]}
    types = {c["condition"]: c.get("type", "") for c in service.get("conditions", [])}
    keys = set()
    for entry in privilege["resource_types"]:
        keys |= set(entry["condition_keys"])
        keys |= set(resources.get(entry["resource_type"].rstrip("*"), {}).get("condition_keys", []))
    out[action] = [[k, types.get(k, "").startswith("ArrayOf")] for k in sorted(keys)]
print(json.dumps(out))
"""


def supported_condition_keys(actions: set[str]) -> dict[str, set[str]]:
    """Action -> the condition keys its requests carry (the Service Authorization Reference as parliament's
    database in .venv-tools holds it: `make lint-tools`); the multivalued ones (ArrayOf… types) lower-cased under
    ``MULTIVALUED`` + action."""
    import subprocess

    result = subprocess.run(
        [str(REPO_ROOT / ".venv-tools" / "bin" / "python"), "-c", SAR_SCRIPT],
        input=json.dumps(sorted(actions)),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    found: dict[str, set[str]] = {}
    for action, keys in json.loads(result.stdout).items():
        found[action] = {key for key, _ in keys}
        found[MULTIVALUED + action] = {key.lower() for key, many in keys if many}
    return found


class StackWorld:
    """The test world's names bound to one stack of the template (Env ``test``): each table, queue, bucket,
    cluster and role a test's call names becomes the stack's resource of the same kind, as AWS would name it."""

    def __init__(self, log: Path | None = None) -> None:
        from infra import cloudformation as cfn
        from infra.policy_eval import stack_values
        from tasks.core.registry import default_table_names
        from tasks.landing import sqs

        self.template = cfn.template()
        self.parameters = {
            "Env": ENV,
            "BucketName": f"pipelines-data-{ENV}",
            "ImageTag": "t",
            "PrefectApiUrl": "https://prefect/api",
            "VpcId": "vpc-1",
            "Subnets": "subnet-1",
            "SecurityGroups": "sg-1",
            "PrefectApiKeySecretArn": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:prefect-api-key-AbCdEf",
            "GpuClusterName": GPU_CLUSTER,
            "VideoEndpointPrefix": VIDEO_ENDPOINT_PREFIX,
        }
        self.values = stack_values(self.template, self.parameters, f"pipelines-{ENV}", ACCOUNT, REGION)
        self.cfn, self.sqs = cfn, sqs
        self.seed_tables = {name: logical for logical, name in default_table_names(ENV).items()}
        self.task_definitions: dict[str, dict[str, Any]] = {}
        self.resource_tags: dict[str, dict[str, str]] = {}  # instance id -> its tags (``read_resource_tags``)
        self.owned: dict[str, set[str]] = {"bucket": set(), "queue": set(), "cluster": set(), "role": set()}
        self.configured_roles: dict[str, str] = {}  # role ARN -> the stack's role it is configured as
        for kind, logical in (("bucket", "Bucket"), ("cluster", "Cluster"), ("role", "TaskRole")):
            self.own(kind, self.values[logical])
        self.own("role", self.values["ExecutionRole"])
        self.own("cluster", GPU_CLUSTER)
        if log is not None:
            self.learn(log)

    def own(self, kind: str, name: str) -> None:
        """Make ``name`` one of the stack's resources of ``kind`` (the test world created or configured it)."""
        self.owned[kind].add(name.rsplit("/", 1)[-1] if kind in ("cluster", "role") else name)

    def learn(self, log: Path) -> None:
        """What the log says of the world: the resources created and configured, instance tags, task definitions."""
        for line in _lines(log):
            if "created" in line:
                self.own(*line["created"])
            for kind, value in line.get("configured", {}).items():
                self.own("cluster" if kind == "cluster" else "role", value)
                if kind != "cluster":
                    self.configured_roles[value] = "ExecutionRole" if kind == "execution_role" else "TaskRole"
            for family, roles in line.get("task_definition", {}).items():
                self.task_definitions[family] = roles
        self.resource_tags = read_resource_tags(log)

    def table(self, name: str) -> str | None:
        """The stack's ARN of the table a test named (its fresh-table suffix dropped), or None if none is."""
        seed = re.sub(r"-[0-9a-f]{8}$", "", name)
        logical = self.seed_tables.get(seed) or self.seed_tables.get(name)
        return self.values[f"{self.cfn.logical_id('table', logical)}.Arn"] if logical else None

    def queue(self, url_or_name: str) -> str:
        """The stack's ARN of the landing queue, dead-letter queue or observer queue a test created (in any env);
        any other queue's own ARN."""
        name = url_or_name.rstrip("/").rsplit("/", 1)[-1]
        own_arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"
        # a name the stack's own naming gives (in the env a test runs under) is the stack's queue, which
        # CloudFormation made whether or not this test did; any other name is that queue itself
        observer = re.escape(self.cfn.OBSERVER_QUEUE).replace(re.escape("${Env}"), "[A-Za-z0-9_-]+")
        if re.fullmatch(observer, name):
            return self.values["FlowRunEventsQueue.Arn"]
        for pipeline, spec in self.sqs.landing_queues().items():
            for pattern, logical in zip(spec.names("{env}"), ("queue", "dead letter queue"), strict=True):
                if re.fullmatch(re.escape(pattern).replace(r"\{env\}", "[A-Za-z0-9_-]+"), name):
                    return self.values[f"{self.cfn.logical_id(pipeline, logical)}.Arn"]
        return own_arn

    def bucket(self, name: str) -> str:
        """The stack's bucket if the test world created ``name``; else the bucket itself."""
        return self.values["Bucket"] if name in self.owned["bucket"] else name

    def cluster(self, name: str = "") -> str:
        """The stack's cluster ARN if the test world created or configured the cluster; else its own ARN."""
        name = name.rsplit("/", 1)[-1] or self.values["Cluster"]
        own = name in self.owned["cluster"] or re.fullmatch(r"pipelines-[A-Za-z0-9_-]+", name)  # the stack's naming
        return self.values["Cluster.Arn"] if own else f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{name}"

    def gpu_cluster(self, name: str = "") -> str:
        """The GPU cluster's ARN (``GpuClusterName``) if the test world created the cluster the GPU backend names;
        else that cluster's own ARN."""
        name = name.rsplit("/", 1)[-1] or self.values["GpuClusterName"]
        own = name in self.owned["cluster"]
        return f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{self.values['GpuClusterName'] if own else name}"

    def instance_tags(self, instance_id: str) -> dict[str, tuple[str, ...]]:
        """The ``aws:ResourceTag/...`` keys of a reboot of the instance: its tags, a GPU-cluster tag naming a cluster
        the GPU backend drives standing for the stack's GPU cluster (as its cluster ARN does)."""
        from tasks.gpu.backends import GPU_CLUSTER_TAG

        def value(key: str, given: str) -> str:
            names_gpu_cluster = key == GPU_CLUSTER_TAG and given in self.owned["cluster"]
            return self.values["GpuClusterName"] if names_gpu_cluster else given

        tags = self.resource_tags.get(instance_id, {})
        return {f"aws:ResourceTag/{k}": (value(k, v),) for k, v in tags.items()}

    def endpoint(self, name: str) -> str:
        """The ARN of the endpoint a test named, as the stack's endpoints are named (``VideoEndpointPrefix``)."""
        return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/{self.values['VideoEndpointPrefix']}{name}".lower()

    def role(self, role_arn: str) -> str:
        """The stack's role a configured or created role ARN stands for (the flow runs' task and execution roles);
        any other role's own ARN."""
        name = role_arn.rsplit("/", 1)[-1]
        if role_arn in self.configured_roles:
            return self.values[f"{self.configured_roles[role_arn]}.Arn"]
        if name in self.owned["role"]:
            return self.values["ExecutionRole.Arn" if "execution" in name.lower() else "TaskRole.Arn"]
        return role_arn if role_arn.startswith("arn:") else f"arn:aws:iam::{ACCOUNT}:role/{name}"


def launch_tags(params: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """The request-tag condition keys of an ECS call that tags what it creates."""
    tags = {f"aws:RequestTag/{t['key']}": (t["value"],) for t in params.get("tags", [])}
    return tags | ({"aws:TagKeys": tuple(t["key"] for t in params["tags"])} if tags else {})


def _ecs(world: StackWorld, operation: str, params: dict[str, Any]) -> list[Request]:
    """ECS calls of the worker: RunTask with the tag-on-create TagResource and the PassRole of its roles."""
    from infra.policy_eval import Request

    base = f"arn:aws:ecs:{REGION}:{ACCOUNT}"
    cluster_arn = world.cluster(params.get("cluster", ""))
    cluster, cluster_name = {"ecs:cluster": (cluster_arn,)}, cluster_arn.rsplit("/", 1)[-1]
    tags = launch_tags(params)
    if operation == "RegisterTaskDefinition":
        world.task_definitions[params["family"]] = params
        resource = f"{base}:task-definition/{params['family']}:1"
        requests = [Request("ecs:RegisterTaskDefinition", resource, tags)]
        if tags:  # tag-on-create is authorized as ecs:TagResource too
            created = {**tags, "ecs:CreateAction": ("RegisterTaskDefinition",)}
            requests.append(Request("ecs:TagResource", resource, created))
        return requests
    if operation == "RunTask":
        definition = params["taskDefinition"]
        family = definition.rsplit("/", 1)[-1].split(":")[0]
        resource = definition if definition.startswith("arn:") else f"{base}:task-definition/{definition}"
        resource = resource if ":" in resource.rsplit("/", 1)[-1] else f"{resource}:1"
        requests = [Request("ecs:RunTask", resource, {**cluster, **tags})]
        if tags:
            task = f"{base}:task/{cluster_name}/0123456789abcdef"
            requests.append(Request("ecs:TagResource", task, {**tags, "ecs:CreateAction": ("RunTask",)}))
        return requests + pass_roles(world, family, params)
    if operation in ("DescribeTasks", "StopTask"):
        tasks = params.get("tasks") or [params["task"]]
        return [
            Request(f"ecs:{operation}", f"{base}:task/{cluster_name}/{t.rsplit('/', 1)[-1]}", cluster) for t in tasks
        ]
    if operation in ("DescribeTaskDefinition", "DeregisterTaskDefinition", "ListTaskDefinitions"):
        return [Request(f"ecs:{operation}", "*")]
    raise LookupError(f"no IAM mapping for ecs:{operation}")


def pass_roles(world: StackWorld, family: str, params: dict[str, Any]) -> list[Request]:
    """The ``iam:PassRole`` a RunTask or StartTask needs for each role its task definition (or its overrides) gives
    the task."""
    from infra.policy_eval import Request

    registered = world.task_definitions.get(family, {})
    roles = {params.get("overrides", {}).get(k) or registered.get(k) for k in ("taskRoleArn", "executionRoleArn")}
    passed = {"iam:PassedToService": ("ecs-tasks.amazonaws.com",)}
    return [Request("iam:PassRole", world.role(r), passed) for r in sorted(filter(None, roles))]


def _gpu_ecs(world: StackWorld, operation: str, params: dict[str, Any]) -> list[Request]:
    """ECS calls of the GPU backend (tasks/gpu/backends.py) on the GPU cluster: StartTask with its tag-on-create."""
    from infra.policy_eval import Request

    cluster_arn = world.gpu_cluster(params.get("cluster", ""))
    base, name = cluster_arn.rsplit(":cluster/", 1)
    cluster = {"ecs:cluster": (cluster_arn,)}
    if operation == "ListContainerInstances":
        return [Request("ecs:ListContainerInstances", cluster_arn)]
    if operation in ("DescribeContainerInstances", "ListTasks"):
        instances = params.get("containerInstances") or [params.get("containerInstance", "*")]
        return [
            Request(f"ecs:{operation}", f"{base}:container-instance/{name}/{i.rsplit('/', 1)[-1]}", cluster)
            for i in instances
        ]
    if operation == "StartTask":
        tags = launch_tags(params)
        definition = params["taskDefinition"].rsplit("/", 1)[-1]
        definition = definition if ":" in definition else f"{definition}:1"
        requests = [Request("ecs:StartTask", f"{base}:task-definition/{definition}", {**cluster, **tags})]
        created = {**tags, "ecs:CreateAction": ("StartTask",)}
        tagged = [Request("ecs:TagResource", f"{base}:task/{name}/0123456789abcdef", created)] if tags else []
        return requests + tagged + pass_roles(world, definition.split(":")[0], params)
    if operation in ("DescribeTasks", "StopTask"):
        tasks = params.get("tasks") or [params["task"]]
        return [Request(f"ecs:{operation}", f"{base}:task/{name}/{t.rsplit('/', 1)[-1]}", cluster) for t in tasks]
    raise LookupError(f"no IAM mapping for the GPU backend's ecs:{operation}")


def _dynamodb(world: StackWorld, operation: str, params: dict[str, Any]) -> list[Request]:
    """DynamoDB calls: each item of a batch or transaction as its own action on its table (and index)."""
    from infra.policy_eval import Request

    def on(action: str, table: str, index: str | None = None) -> Request:
        resource = world.table(table) or f"unknown-table:{table}"
        return Request(f"dynamodb:{action}", f"{resource}/index/{index}" if index else resource)

    if operation in ("BatchGetItem", "BatchWriteItem"):
        return [on(operation, table) for table in params["RequestItems"]]
    if operation in ("TransactWriteItems", "TransactGetItems"):
        kinds = {
            "Put": "PutItem",
            "Update": "UpdateItem",
            "Delete": "DeleteItem",
            "Get": "GetItem",
            "ConditionCheck": "ConditionCheckItem",
        }
        return [on(kinds[kind], body["TableName"]) for item in params["TransactItems"] for kind, body in item.items()]
    return [on(operation, params["TableName"], params.get("IndexName"))]


S3_ACTIONS = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "DeleteObject": "s3:DeleteObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "ListParts": "s3:ListMultipartUploadParts",
    "ListObjectsV2": "s3:ListBucket",
    "ListObjects": "s3:ListBucket",
    "HeadBucket": "s3:ListBucket",
    "ListMultipartUploads": "s3:ListBucketMultipartUploads",
    "GetBucketLocation": "s3:GetBucketLocation",
    "DeleteObjects": "s3:DeleteObject",
}


def _s3(world: StackWorld, operation: str, params: dict[str, Any]) -> list[Request]:
    """S3 calls: object actions on bucket/key, listings on the bucket (its prefix as ``s3:prefix``)."""
    from infra.policy_eval import Request

    bucket = f"arn:aws:s3:::{world.bucket(params['Bucket'])}"
    if operation in ("CopyObject", "UploadPartCopy"):
        source = params["CopySource"]
        if not isinstance(source, dict):
            source_bucket, source_key = source.lstrip("/").split("?")[0].split("/", 1)
            source = {"Bucket": source_bucket, "Key": source_key}
        source_arn = f"arn:aws:s3:::{world.bucket(source['Bucket'])}/{source['Key']}"
        return [Request("s3:GetObject", source_arn), Request("s3:PutObject", f"{bucket}/{params['Key']}")]
    action = S3_ACTIONS.get(operation)
    if action is None:
        raise LookupError(f"no IAM mapping for s3:{operation}")
    if operation == "DeleteObjects":
        return [Request(action, f"{bucket}/{o['Key']}") for o in params["Delete"]["Objects"]]
    if "Key" in params:
        return [Request(action, f"{bucket}/{params['Key']}")]
    return [Request(action, bucket, {"s3:prefix": (params.get("Prefix", ""),)})]


def _sqs(world: StackWorld, operation: str, params: dict[str, Any]) -> list[Request]:
    """SQS calls on the queue their URL (or GetQueueUrl's name) names; batches as their single action."""
    from infra.policy_eval import Request

    named = params.get("QueueUrl") or params.get("QueueName", "")
    action = f"sqs:{operation.removesuffix('Batch')}"
    return [Request(action, world.queue(named))]


def _glue(world: StackWorld, operation: str, params: dict[str, Any]) -> list[Request]:
    """Glue Data Catalog calls: authorized on the catalog, the database and (for tables and partitions) the table."""
    from infra.policy_eval import Request

    base = f"arn:aws:glue:{REGION}:{ACCOUNT}"
    table = params.get("TableName") or params.get("TableInput", {}).get("Name")
    if operation == "GetTable":
        table = params["Name"]
    database = world.values["CatalogDatabase"]  # a test's own database stands for the stack's (ETL_CATALOG_DATABASE)
    resources = [f"{base}:catalog", f"{base}:database/{database}"]
    resources += [f"{base}:table/{database}/{table}"] if table else []
    return [Request(f"glue:{operation}", r) for r in resources]


def authorizations(world: StackWorld, call: dict[str, Any]) -> list[Request]:
    """The IAM authorizations one recorded call needs in AWS, in the stack's names."""
    from infra.policy_eval import Request

    service, operation, params = call["service"], call["operation"], call["params"]
    if service == "dynamodb":
        return _dynamodb(world, operation, params)
    if service == "s3":
        return _s3(world, operation, params)
    if service == "sqs":
        return _sqs(world, operation, params)
    if service == "glue":
        return _glue(world, operation, params)
    if service == "ecs" and call["where"].startswith(GPU_BACKEND):
        return _gpu_ecs(world, operation, params)
    if service == "ecs":
        return _ecs(world, operation, params)
    if service == "ec2" and operation == "RebootInstances":
        return [
            Request("ec2:RebootInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{i}", world.instance_tags(i))
            for i in params["InstanceIds"]
        ]
    if service == "sagemaker-runtime":  # the runtime API's actions are authorized as sagemaker:
        return [Request(f"sagemaker:{operation}", world.endpoint(params["EndpointName"]))]
    if service in ("cloudwatch", "ec2"):  # these actions take no resource ARN
        context = {"cloudwatch:namespace": (params["Namespace"],)} if "Namespace" in params else {}
        return [Request(f"{service}:{operation}", "*", context)]
    if service == "logs" and operation == "GetLogEvents":
        group = world.values["FlowRunLogGroup"]
        stream = params["logStreamName"]
        return [Request("logs:GetLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}:log-stream:{stream}")]
    raise LookupError(f"no IAM mapping for {service}:{operation}")


def with_supported_keys(request: Request, supported: dict[str, set[str]]) -> Request:
    """The request as IAM sees it: only the condition keys its action supports (plus the global ones)."""
    from infra.policy_eval import Request

    keys = supported.get(request.action, set())

    def carried(key: str) -> bool:
        generic = re.sub(r"/.*", "/${TagKey}", key)
        return key in keys or generic in keys or key in GLOBAL_KEYS

    context = {k: v for k, v in request.context.items() if carried(k)}
    many = frozenset(supported.get(MULTIVALUED + request.action, set()))
    return Request(request.action, request.resource, {**context, "aws:SecureTransport": ("true",)}, many)
