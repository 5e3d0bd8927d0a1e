"""infra/pipelines.template.json: generated from the specs the code runs on (no drift), holding what one
environment needs, and clean for AWS's own linter (cfn-lint) and checkov (each suppression with its reason)."""

from __future__ import annotations

import json
import subprocess

import pytest

from infra import cloudformation as cfn
from tasks.core.registry import Landing, Pipeline, QueueSpec, default_table_names, registered, table_specs
from tasks.core.registry import landings as registry_landings
from tasks.core.tables import Index, TableSpec, schema_differences
from tasks.landing import sqs

TOOLS = cfn.REPO_ROOT / ".venv-tools" / "bin"  # `make lint-tools` (make test depends on it)
TEMPLATE = json.loads(cfn.TEMPLATE_PATH.read_text())
RESOURCES = TEMPLATE["Resources"]


def of_type(kind: str) -> dict[str, dict]:
    """The template's resources of one CloudFormation type, by logical id."""
    return {name: r for name, r in RESOURCES.items() if r["Type"] == kind}


def subbed(value) -> str:
    """The text of a plain string or an ``Fn::Sub``."""
    return value["Fn::Sub"] if isinstance(value, dict) else value


def test_the_committed_template_is_the_one_the_specs_generate():
    assert cfn.render() == cfn.TEMPLATE_PATH.read_text(), "run `python -m infra.cloudformation` and commit the template"
    assert cfn.main(["--check"]) == 0


def test_a_spec_change_shows_as_drift(monkeypatch):
    changed = dict(table_specs(), ecs_node=TableSpec("node_name", gsis=(Index("cluster-index", "cluster_name"),)))
    monkeypatch.setattr(cfn, "table_specs", lambda: changed)
    assert cfn.render() != cfn.TEMPLATE_PATH.read_text() and cfn.main(["--check"]) == 1


def test_every_table_has_the_specs_keys_indexes_and_ttl():
    tables = of_type("AWS::DynamoDB::Table")
    assert len(tables) == len(table_specs())
    stack_names = cfn.stack_table_names()  # the seeds' names, each with the env
    seeds = default_table_names("${Env}")
    assert stack_names == {logical: name if "${Env}" in name else f"{name}-${{Env}}" for logical, name in seeds.items()}
    for logical, spec in table_specs().items():
        properties = tables[cfn.logical_id("table", logical)]["Properties"]
        assert subbed(properties["TableName"]) == stack_names[logical]
        assert schema_differences(stack_names[logical], spec, properties) == []  # as ensure_tables checks a live table
        assert properties.get("TimeToLiveSpecification") == (
            {"AttributeName": spec.ttl_attribute, "Enabled": True} if spec.ttl_attribute else None
        )
        assert properties["BillingMode"] == "PAY_PER_REQUEST"


def test_every_seed_queue_has_its_dead_letter_queue_and_the_attributes_aws_events_setup_sets():
    queues = {n: q for n, q in of_type("AWS::SQS::Queue").items() if n != "FlowRunEventsQueue"}  # the observer's
    assert len(queues) == 2 * len(sqs.landing_queues())
    for pipeline, spec in sqs.landing_queues().items():
        queue = queues[cfn.logical_id(pipeline, "queue")]["Properties"]
        dead_letter = queues[cfn.logical_id(pipeline, "dead letter queue")]["Properties"]
        assert (subbed(queue["QueueName"]), subbed(dead_letter["QueueName"])) == spec.names("${Env}")
        wanted = sqs.queue_attributes(spec, "arn")
        assert {k: str(queue[k]) for k in ("VisibilityTimeout", "ReceiveMessageWaitTimeSeconds")} == {
            k: wanted[k] for k in ("VisibilityTimeout", "ReceiveMessageWaitTimeSeconds")
        }
        assert queue["RedrivePolicy"] == {
            "deadLetterTargetArn": {"Fn::GetAtt": [cfn.logical_id(pipeline, "dead letter queue"), "Arn"]},
            "maxReceiveCount": sqs.MAX_RECEIVE_COUNT,
        }
        assert {
            k: str(v) for k, v in dead_letter.items() if k in sqs.dead_letter_attributes()
        } == sqs.dead_letter_attributes()


def test_the_bucket_notifies_each_object_queue_and_expires_what_the_seeds_let_expire():
    bucket = RESOURCES["Bucket"]["Properties"]
    notified = {
        c["Queue"]["Fn::GetAtt"][0]: subbed(c["Filter"]["S3Key"]["Rules"][0]["Value"])
        for c in bucket["NotificationConfiguration"]["QueueConfigurations"]
    }
    assert notified == {
        cfn.logical_id(p, "queue"): f"${{StorePrefix}}/{s.input_prefix}"
        for p, s in sqs.landing_queues().items()
        if s.mode == sqs.OBJECTS
    }
    rules = {r["Id"]: r for r in bucket["LifecycleConfiguration"]["Rules"]}
    assert rules["abort-incomplete-multipart-uploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    assert rules["abort-incomplete-multipart-uploads"]["Prefix"] == ""  # every key
    expiring = {subbed(r["Prefix"]): r["ExpirationInDays"] for r in rules.values() if "ExpirationInDays" in r}
    assert expiring == {"${StorePrefix}/quarantine/": 30, "${StorePrefix}/manifests/": 30, "${StorePrefix}/logs/": 30}
    assert not any(p.startswith("${StorePrefix}/pipeline/") for p in expiring), "inputs and outputs never expire"


def test_the_etl_expires_the_prefixes_its_keys_write_what_explains_a_record_under():
    from datetime import datetime

    from tasks.etl import aws, keys

    written = {
        "quarantine": keys.quarantine_key("2026-01-01", "a.ndjson"),
        "manifests": keys.manifest_key("2026-01-01", "batch-0001-20260101-000000.json"),
        "reports": keys.run_report_key("glue", datetime(2026, 1, 1), "r"),
    }
    assert written.keys() == aws.EXPLAINING.keys()
    assert all(written[name].startswith(prefix) for name, prefix in aws.EXPLAINING.items())


def test_logs_are_kept_the_seeds_three_days():
    groups = of_type("AWS::Logs::LogGroup")
    assert groups and {g["Properties"]["RetentionInDays"] for g in groups.values()} == {3}


def test_a_landing_whose_listener_has_no_ecs_deployment_is_an_error_naming_it():
    toy = Pipeline(
        name="toy",
        seed=99,
        landing=Landing("toy-listen", "toy/in/", QueueSpec("toy-{env}", "toy-dlq-{env}", 60, "OBJECTS", "toy/in/")),
    )
    with registered(toy), pytest.raises(ValueError, match="no ecs deployment of the listener flows toy_listen"):
        cfn.render()
    assert set(cfn.listener_deployments()) == set(sqs.landing_queues())  # the registry's own landings all have one


def test_the_workers_and_each_listener_are_services_of_one_task_never_two():
    services = of_type("AWS::ECS::Service")
    listeners = cfn.listener_deployments()
    assert len(services) == 2 + len(listeners) == 2 + len(sqs.landing_queues())
    for service in services.values():
        properties = service["Properties"]
        assert properties["DesiredCount"] == 1 and properties["DeploymentConfiguration"]["MaximumPercent"] == 100
    commands = {}
    for service in services.values():
        definition = RESOURCES[service["Properties"]["TaskDefinition"]["Ref"]]["Properties"]
        commands[service["Properties"]["ServiceName"]] = definition["ContainerDefinitions"][0]["Command"]
    assert commands["prefect-worker"][:4] == ["prefect", "worker", "start", "--pool"]
    assert commands["prefect-maintenance-worker"] == [
        *("prefect", "worker", "start", "--pool", "aws-maintenance", "--type", "process", "--limit", "4"),
        "--with-healthcheck",
    ]
    for pipeline, deployment in listeners.items():
        command = commands[deployment["entrypoint"].split(":")[1].replace("_", "-")]
        flow = registry_landings()[pipeline].flow
        assert command == ["python", "-m", "deployments.ecs_listener", f"{flow}/ecs"]  # the deployment's own run
        assert deployment["parameters"]["source"] == "sqs"
        assert deployment["triggers"] == []  # ECS supervises it: no trigger starts a second listener


def test_the_maintenance_service_is_small_has_the_workers_health_check_its_own_logs_role_and_alarm():
    """Issue 51: half a vCPU and 2 GiB (the worker and 4 flow processes), the image as every service runs it (its
    non-root user, read-only root, /tmp scratch), the worker's health check, a log group and role of its own, and
    an alarm when it runs no task (pipeline-health runs in it, so cannot report it down)."""
    definition = RESOURCES["MaintenanceTaskDefinition"]["Properties"]
    worker = RESOURCES["WorkerTaskDefinition"]["Properties"]
    assert (definition["Cpu"], definition["Memory"]) == ("512", "2048")
    assert definition["TaskRoleArn"] == {"Fn::GetAtt": ["MaintenanceRole", "Arn"]}
    [container], [worker_container] = definition["ContainerDefinitions"], worker["ContainerDefinitions"]
    assert container["HealthCheck"] == worker_container["HealthCheck"] == cfn.WORKER_HEALTH_CHECK
    for same in ("Image", "ReadonlyRootFilesystem", "MountPoints", "WorkingDirectory", "Secrets"):
        assert container[same] == worker_container[same], same
    assert definition["Volumes"] == worker["Volumes"]
    assert container["LogConfiguration"]["Options"]["awslogs-group"] == {"Ref": "MaintenanceLogGroup"}
    env = {e["Name"] for e in container["Environment"]}
    assert {"TABLE_ENV", "OBJECT_STORE_BASE_URL", "PREFECT_API_URL", "HOME"} <= env  # its flow runs inherit it
    assert not [name for name in env if name.startswith("PIPELINES_") and name.endswith("_QUEUE_URL")]
    alarm = RESOURCES["AlarmMaintenanceWorkerNotRunning"]["Properties"]
    assert (alarm["Namespace"], alarm["MetricName"]) == ("ECS/ContainerInsights", "RunningTaskCount")
    assert {"Name": "ServiceName", "Value": "prefect-maintenance-worker"} in alarm["Dimensions"]
    assert alarm["ComparisonOperator"] == "LessThanThreshold" and alarm["Threshold"] == 1
    assert alarm["TreatMissingData"] == "breaching" and alarm["AlarmActions"] == [{"Ref": "AlarmTopic"}]
    dashboard = json.dumps(RESOURCES["Dashboard"]["Properties"]["DashboardBody"])
    assert "prefect-maintenance-worker" in dashboard


def test_roles_name_their_resources():
    """The pipelines' role names every table, queue and the bucket it may touch; no statement grants ``*`` actions."""
    roles = of_type("AWS::IAM::Role")
    assert set(roles) == {"ExecutionRole", "TaskRole", "WorkerRole", "MaintenanceRole"}
    for name, role in roles.items():
        for statement in role["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]:
            statement = statement.get("Fn::If", [None, statement])[1]
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            assert not [a for a in actions if "*" in a], (name, actions)
            flow_runs = name in ("TaskRole", "MaintenanceRole")
            if flow_runs and statement["Resource"] == "*":  # only actions that take no resource ARN
                no_arn = (["cloudwatch:GetMetricStatistics"], ["cloudwatch:PutMetricData"], ["ec2:DescribeInstances"])
                assert actions in no_arn, statement
                assert actions[0] != "cloudwatch:PutMetricData" or statement["Condition"] == {
                    "StringEquals": {"cloudwatch:namespace": "Pipelines"}
                }  # readings put only in pipeline-health's namespace
            elif flow_runs:  # a wildcard only as an ARN's last part or after a name-prefix parameter
                resources = json.dumps(statement["Resource"]).replace("/*", "").replace("${VideoEndpointPrefix}*", "")
                assert "*" not in resources, statement
    trust = roles["TaskRole"]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]
    assert trust["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}


def test_cfn_lint_reports_nothing_informational_rules_included():
    result = subprocess.run(
        [str(TOOLS / "cfn-lint"), "--include-checks", "I", "--", str(cfn.TEMPLATE_PATH)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (result.returncode, result.stdout) == (0, ""), result.stdout[-3000:]


def test_every_checkov_suppression_gives_its_reason():
    skipped = [
        (name, s) for name, r in RESOURCES.items() for s in r.get("Metadata", {}).get("checkov", {}).get("skip", [])
    ]
    assert skipped and all(len(s["comment"]) > 40 for _, s in skipped), skipped


def test_checkov_fails_no_check():
    result = subprocess.run(
        [
            str(TOOLS / "checkov"),
            "-f",
            str(cfn.TEMPLATE_PATH),
            "--framework",
            "cloudformation",
            "--compact",
            "--quiet",
            "--skip-download",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": str(TOOLS), "BC_SKIP_MAPPING": "TRUE", "HOME": "/tmp"},
    )
    report = json.loads(result.stdout)
    summary = report["summary"]
    assert summary["failed"] == 0 and summary["parsing_errors"] == 0 and summary["passed"] > 40, summary
    assert result.returncode == 0
