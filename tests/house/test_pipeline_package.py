"""Adding a pipeline edits nothing shared: a toy pipeline's files, written in a temporary folder laid out as the
repository is (``tasks/toy/``, ``flows/toy.py``, ``deployments/ops/toy.py``, ``deployments/samples/toy.py``,
``blocks/toy.py``) and put on PYTHONPATH, are picked up by every shared part that visits the pipelines.

This is docs/design.md's "How to add a pipeline", step by step; prefect.yaml's deployments and the template are what
`pipelines generate` makes of the declarations, the toy's included. A child process imports the project
with the folder on its path, as a process started from a checkout holding the new files would; it loads the toy's
flow module by path first, as a worker does, and reads the house with ``tests/helpers/house.py``. What the visiting
machinery then does with a declared pipeline (tables created, records stamped, alarms raised, records repaired) is
``tests/house/test_pipeline_registry.py``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FILES = {
    "tasks/toy/__init__.py": '"""The toy pipeline."""\n',
    "tasks/toy/keys.py": '''
        """The toy's keys."""

        INCOMING_PREFIX = "toy/incoming/"
    ''',
    "tasks/toy/pipeline.py": '''
        """The toy pipeline, as the shared machinery sees it."""

        from tasks.core.registry import OBJECTS, Deployment, Landing, Pipeline, QueueSpec, Table
        from tasks.core.tables import TableSpec
        from tasks.toy import keys

        PIPELINE = Pipeline(
            name="toy",
            seed=50,
            tables={"toy_items": Table(TableSpec("item_id", ttl_attribute="ttl"), "toy-items-{env}")},
            landing=Landing(
                "toy-listen",
                keys.INCOMING_PREFIX,
                QueueSpec("toy-{env}", "toy-dlq-{env}", 60, OBJECTS, keys.INCOMING_PREFIX),
            ),
            flows=("toy-run",),
            maintenance_flows=("toy-sweep",),
            health_checks="tasks.toy.alarms:CHECKS",
            severities={"toy-items-stuck": "CRITICAL"},
            retention_rules="tasks.toy.retention:RULES",
            reconcile_adapters="tasks.toy.reconcile:ADAPTERS",
            aws="tasks.toy.aws:PARTS",
            deployments=(
                Deployment("flows/toy.py:toy_listen", "Its listener."),
                Deployment("flows/toy.py:toy_run", "Its work.", limit="fan_out_local"),
            ),
            record_flows=("toy-run",),
        )
    ''',
    "tasks/toy/alarms.py": '''
        """The toy's alarm."""

        from tasks.health.checks import count_alarm


        def toy_items_stuck(limits):
            """Never stuck."""
            return count_alarm("toy-items-stuck", "toy", [], 0, "toy item(s) stuck")


        CHECKS = {toy_items_stuck: ("toy-items-stuck",)}
    ''',
    "tasks/toy/retention.py": '''
        """The toy's retention rule."""

        from tasks.retention.sweep import Rule

        RULES = (Rule("toy_items", ("item_id",), "status", ("DONE", "FAILED"), ("ended_at",)),)
    ''',
    "tasks/toy/reconcile.py": '''
        """The toy's reconcile adapter."""

        from tasks.reconcile.adapters import TableAdapter

        ADAPTERS = (TableAdapter("toy", "toy_items", "status", "RUNNING", None, "FAILED", ("item_id",)),)
    ''',
    "tasks/toy/aws.py": '''
        """The toy's own parts of the AWS stack."""

        from tasks.core.aws_template import AwsParts, sub, when

        PARTS = AwsParts(
            parameters={"ToyTopic": {"Type": "String", "Default": "", "Description": "toy topic"}},
            conditions={"HasToyTopic": "ToyTopic"},
            statements=[when("HasToyTopic", {"Sid": "ToyPublish", "Effect": "Allow", "Action": "sns:Publish",
                                             "Resource": sub("${ToyTopic}")})],
            expiring={"toy-notes": "toy/notes/"},
            expiring_days=7,
            environment={"TOY_TOPIC": "ToyTopic"},
        )
    ''',
    "flows/toy.py": '''
        """The toy's flows."""

        from flows.policies import pipeline_flow


        @pipeline_flow("toy-listen")
        def toy_listen() -> None:
            """Its listener."""


        @pipeline_flow("toy-run")
        def toy_run() -> None:
            """Its work."""
    ''',
    "deployments/ops/toy.py": '''
        """`pipelines toy …`."""


        def register(groups) -> None:
            """The toy's subcommand group."""
            group = groups.add_parser("toy").add_subparsers(dest="command", required=True)
            group.add_parser("things").set_defaults(handler=lambda args: ["a thing"])


        def local_setup() -> dict:
            """What `make up` prints for the toy."""
            return {"toy things": "ready"}
    ''',
    "deployments/samples/toy.py": '''
        """The toy's demo sample."""


        def make(workdir):
            return {"item": "one"}


        def drop(workdir, store):
            return make(workdir)


        def landed(item):
            return True


        def report(item):
            return f"toy {item}"
    ''',
    "blocks/toy.py": '''
        """The toy's settings."""

        from typing import ClassVar

        from blocks.base import ConfigBlock

        __all__ = ["ToySettings"]


        class ToySettings(ConfigBlock):
            """The toy's settings (env ``TOY_<FIELD>``)."""

            _block_type_name = "Toy Settings"
            _env_prefix: ClassVar[str] = "TOY_"

            size: int = 1
    ''',
}

# what the child reports: each shared part's view of the pipelines, read through its own functions
PROBE = """
import contextlib, io, json, logging, sys
from pathlib import Path

from prefect import flow_engine
from prefect.utilities.importtools import load_script_as_module

from tasks.core.redact import REDACTED_LOGGERS, RedactingFilter

# first, before anything declares a flow: its flow module loaded by path, as a worker loads it, runs the preamble
load_script_as_module(str(Path(sys.argv[1]) / "flows" / "toy.py"))
preamble = getattr(flow_engine._send_heartbeats, "quick_exit", False) and all(
    any(isinstance(f, RedactingFilter) for f in logging.getLogger(name).filters) for name in REDACTED_LOGGERS
)

import blocks
import deployments.ops.gpu
from deployments import aws, cli, demo, local_stack, prefect_yaml
from infra import cloudformation as cfn
from tasks import reconcile
from tasks.core import limits, registry
from tasks.health.checks import severity_of
from tasks.health.run import all_checks
from tasks.landing import sqs
from tasks.retention.sweep import rules
from tests.helpers import house

template = cfn.template()
manifest = prefect_yaml.manifest()
toy = [d for d in manifest["deployments"] if "toy" in d["entrypoint"]]
state = [d for d in manifest["deployments"] if d["entrypoint"].endswith(":records_prefect_state")][0]
printed = io.StringIO()
deployments.ops.gpu.local_setup = lambda: {}  # its nodes need the tables: the toy's setup is the one looked at
with contextlib.redirect_stdout(printed):
    local_stack.register_extras()
policy = template["Resources"]["TaskRole"]["Properties"]["Policies"]
statements = [s for p in policy for s in p["PolicyDocument"]["Statement"]]
imports = house.imports()
lifecycle = template["Resources"]["Bucket"]["Properties"]["LifecycleConfiguration"]
listener = template["Resources"]["ToyListenerTaskDefinition"]["Properties"]["ContainerDefinitions"][0]
deploy_args = ["aws-stack", "deploy", "--env", "e", "--vpc", "v", "--subnets", "s", "--security-groups", "g"]
given = dict(cli.build_parser().parse_args([*deploy_args, "--parameter", "ToyTopic=arn:toy"]).parameter)
print(json.dumps({
    "preamble": preamble,
    "pipelines": [p.name for p in registry.pipelines()],
    "tables": sorted(registry.table_specs()),
    "maintenance": list(limits.maintenance_flows()),
    "health": sorted(name for names in all_checks().values() for name in names),
    "severity": severity_of("toy-items-stuck", 1),
    "retention": sorted({rule.table for rule in rules()}),
    "reconcile": sorted(reconcile.adapters()),
    "queues": sorted(sqs.landing_queues()),
    "listeners": list(local_stack.listener_deployments()),
    "setup": printed.getvalue().splitlines(),
    "cli": cli.build_parser().parse_args(["toy", "things"]).handler(None),
    "landed": demo.landed_samples(),
    "deployed": demo.deployed_samples(),
    "indirect": demo.indirect_flows(),
    "blocks": hasattr(blocks, "ToySettings"),
    "floors": {room: floor for room, floor in house.FLOORS.items() if "toy" in room},
    "toy_imports": sorted(f"{m} -> {t}" for m, ts in imports.items() for t in ts if "toy" in m),
    "wrong": sorted(f"{m} -> {t}" for m, ts in imports.items() for t in ts if house.up_or_across(m, t)),
    "flow_modules": list(house.flow_modules()),
    "template_resources": sorted(r for r in template["Resources"] if "Toy" in r),
    "template_parameters": [p for p in template["Parameters"] if "Toy" in p],
    "template_conditions": [c for c in template["Conditions"] if "Toy" in c],
    "template_statements": {s.get("Sid", "when"): json.dumps(s) for s in statements if "Toy" in json.dumps(s)},
    "template_rules": [r["Id"] for r in lifecycle["Rules"]],
    "template_env": [e for e in listener["Environment"] if e["Name"] == "TOY_TOPIC"],
    "deploy_parameters": {k: v for k, v in aws.pipelines_parameters(given).items() if "Toy" in k},
    "flow_run_env": aws.flow_run_environment("e", {"BucketUrl": "s3://b/p"}, given)["TOY_TOPIC"],
    "generated": [[d["entrypoint"], d["name"], d["work_pool"]["name"]] for d in toy],
    "reconciled": state["triggers"][0]["match_related"]["prefect.resource.name"],
}))
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))


def _probe(root: Path) -> dict:
    """The shared parts' view, from a child whose path holds the repository and then ``root``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(root)])}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(root)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_pipeline_package_kept_in_another_folder_is_picked_up_by_every_shared_part(tmp_path):
    _write(tmp_path, {**FILES, "tasks/toy/upward.py": "from flows import toy\n"})  # one import going up a floor
    seen = _probe(tmp_path)

    assert "toy" in seen["pipelines"] and "toy_items" in seen["tables"] and "toy-sweep" in seen["maintenance"]
    assert "toy-items-stuck" in seen["health"] and seen["severity"] == "CRITICAL"
    assert "toy_items" in seen["retention"] and "toy" in seen["reconcile"]
    assert "toy" in seen["queues"] and "toy-listen/local" in seen["listeners"]
    assert seen["setup"] == ["toy things       ready"]
    assert seen["cli"] == ["a thing"] and seen["blocks"]
    assert ["toy", "toy-listen/local"] in seen["landed"] and ["toy", "toy-listen/local"] not in seen["deployed"]
    assert "toy-run" in seen["indirect"]
    # the house: the toy's package sits on the pipelines' floor and its imports are checked like any other's
    assert seen["floors"] == {"tasks.toy": 4}
    assert "tasks.toy.pipeline -> tasks.core.registry" in seen["toy_imports"]
    assert seen["wrong"] == ["tasks.toy.upward -> flows", "tasks.toy.upward -> flows.toy"]
    # its flows: loaded by path, as a worker does, they run the flow modules' preamble; the policies' pins see them
    assert seen["preamble"] and "toy" in seen["flow_modules"]
    # the template: its table, queues and listener service, its parameter, condition, statement and lifecycle rule
    assert seen["template_resources"] == [
        "AlarmToyItemsStuck",  # its health alarm
        "TableToyItems",
        "ToyDeadLetterQueue",
        "ToyListenerLogGroup",
        "ToyListenerService",
        "ToyListenerTaskDefinition",
        "ToyQueue",
        "ToyQueuePolicy",
    ]
    assert seen["template_parameters"] == ["ToyTopic"] and seen["template_conditions"] == ["HasToyTopic"]
    statements = seen["template_statements"]  # by Sid; a conditional one under "when"
    assert set(statements) == {"Tables", "Arrivals", "when"} and "ToyPublish" in statements["when"]
    assert "TableToyItems" in statements["Tables"] and "ToyQueue" in statements["Arrivals"]
    assert "expire-toy-notes" in seen["template_rules"]
    # its containers read the parameter; `aws-stack deploy --parameter` sets it, and its flow runs get it too
    assert seen["template_env"] == [{"Name": "TOY_TOPIC", "Value": {"Ref": "ToyTopic"}}]
    assert seen["deploy_parameters"] == {"ToyTopic": "arn:toy"} and seen["flow_run_env"] == "arn:toy"
    # prefect.yaml's deployments as `pipelines generate` writes them: its two flows in both sets, its run reconciled
    assert seen["generated"] == [
        ["flows/toy.py:toy_listen", "local", "local-process"],
        ["flows/toy.py:toy_run", "local", "local-process"],
        ["flows/toy.py:toy_listen", "ecs", "aws-ecs"],
        ["flows/toy.py:toy_run", "ecs", "aws-ecs"],
    ]
    assert "toy-run" in seen["reconciled"] and "ndjson-merge" in seen["reconciled"]
