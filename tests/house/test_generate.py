"""`pipelines generate`: prefect.yaml's deployments and the CloudFormation template are what the pipelines'
declarations make of them (no drift), and a declaration's deployments come out as prefect deploy reads them."""

from __future__ import annotations

import shutil

import yaml
from prefect.flows import load_flow_from_entrypoint

from deployments import cli, prefect_yaml
from deployments.ops import generate
from infra import aws_docs
from infra import cloudformation as cfn
from tasks.core.registry import (
    OBJECTS,
    SET,
    Deployment,
    Landing,
    Pipeline,
    QueueSpec,
    pipelines,
    record_flows,
    registered,
)

LOCAL_POOL = {"name": "local-process", "work_queue_name": "default"}
ONE_AT_A_TIME = {"limit": 1, "collision_strategy": "CANCEL_NEW"}
EVERY_10_MINUTES = {"cron": "*/10 * * * *", "timezone": "UTC", "active": True}

TOY = Pipeline(
    name="toy",
    seed=50,
    landing=Landing("toy-listen", "toy/in/", QueueSpec("toy-{env}", "toy-dlq-{env}", 60, OBJECTS, "toy/in/")),
    maintenance_flows=("toy-sweep",),
    deployments=(
        Deployment("flows/toy.py:toy_listen", "Its listener.", parameters={"run_deployment": f"toy-run/{SET}"}),
        Deployment(
            "flows/toy.py:toy_run",
            "Its work.",
            limit="fan_out_local",
            aws_limit="survey_limit_aws",
            parameters={"size": 1},
            aws_parameters={"size": 2},
        ),
        Deployment("flows/toy.py:toy_sweep", "Its upkeep.", schedule="every_10_minutes", maintenance_service=True),
    ),
    record_flows=("toy-run",),
)


def _toy_deployments() -> dict[tuple[str, str], dict]:
    with registered(TOY):
        deployments = prefect_yaml.manifest()["deployments"]
    return {(d["entrypoint"].rpartition(":")[2], d["name"]): d for d in deployments if "toy" in d["entrypoint"]}


def test_the_committed_files_are_what_the_declarations_generate(capsys):
    assert cli.main(["generate", "--check"]) == 0, "run `pipelines generate` and commit the files it writes"
    assert [path.name for path, _ in generate.targets()] == [
        "prefect.yaml",
        "pipelines.template.json",
        "operations.md",
        "aws.md",
    ]


def test_prefect_yaml_deploys_each_declared_flow_once_locally_and_once_in_aws_and_nothing_else(monkeypatch):
    declared = [d for p in pipelines() for d in p.deployments]
    deployed = [(d["entrypoint"], d["name"]) for d in yaml.safe_load(prefect_yaml.PATH.read_text())["deployments"]]
    assert deployed == [(d.entrypoint, s) for s in ("local", "ecs") for d in declared]
    # entrypoints are relative to the repository, as prefect deploy reads them
    monkeypatch.chdir(prefect_yaml.REPO_ROOT)
    assert all(load_flow_from_entrypoint(d.entrypoint).name == d.flow for d in declared)


def test_a_new_pipelines_deployments_show_as_drift_and_generate_writes_them_all_or_nothing(
    tmp_path, monkeypatch, capsys
):
    manifest, template = tmp_path / "prefect.yaml", tmp_path / "pipelines.template.json"
    doc = tmp_path / "aws.md"
    shutil.copy(prefect_yaml.PATH, manifest)
    shutil.copy(cfn.TEMPLATE_PATH, template)
    shutil.copy(aws_docs.DOC, doc)
    monkeypatch.setattr(prefect_yaml, "PATH", manifest)
    monkeypatch.setattr(cfn, "TEMPLATE_PATH", template)
    monkeypatch.setattr(aws_docs, "DOC", doc)
    before = manifest.read_text(), template.read_text(), doc.read_text()
    with registered(TOY):
        assert cli.main(["generate", "--check"]) == 2
        assert (manifest.read_text(), template.read_text(), doc.read_text()) == before  # --check writes nothing
        assert (
            capsys.readouterr().err
            == f"error: stale: {manifest}, {template}, {doc}: run `pipelines generate` and commit them\n"
        )
        assert cli.main(["generate"]) == 0
        written = capsys.readouterr()
        assert cli.main(["generate", "--check"]) == 0
        listeners = len(cfn.listener_deployments())
    assert "toy_listen" in manifest.read_text() and "ToyListenerService" in template.read_text()
    assert f"| of them listeners | {listeners} |" in doc.read_text()  # the counts and the cost take the listener in
    assert f"| of them listeners | {listeners - 1} |" in before[2]
    assert "| Fargate service toy-listen | 42.53 |" in doc.read_text()
    assert manifest.read_text().startswith(prefect_yaml.hand_part(before[0]))  # the hand part as it was
    assert '"written"' in written.out


def test_the_check_names_each_stale_file(monkeypatch, capsys):
    monkeypatch.setattr(generate, "targets", lambda: [(prefect_yaml.PATH, lambda: "other\n")])
    assert cli.main(["generate", "--check"]) == 2
    assert capsys.readouterr().err == "error: stale: prefect.yaml: run `pipelines generate` and commit them\n"


def test_a_listener_is_supervised_locally_one_at_a_time_and_reads_sqs_in_aws():
    deployments = _toy_deployments()
    supervision = [
        {
            "type": "event",
            "enabled": True,
            "match": {"prefect.resource.id": "prefect.flow-run.*"},
            "match_related": {"prefect.resource.role": "flow", "prefect.resource.name": "toy-listen"},
            "expect": expect,
            "posture": "Reactive",
            "threshold": 1,
            **extra,
        }
        for expect, extra in (
            (["prefect.flow-run.Crashed", "prefect.flow-run.Failed"], {"schedule_after": 20}),
            (["prefect.flow-run.Completed"], {}),
        )
    ]
    local = {
        "name": "local",
        "entrypoint": "flows/toy.py:toy_listen",
        "description": "Its listener.",
        "tags": ["toy", "landing"],
        "concurrency_limit": ONE_AT_A_TIME,
        "enforce_parameter_schema": True,
        "parameters": {"source": "local", "max_runtime_seconds": 21600, "run_deployment": "toy-run/local"},
        "triggers": supervision,
        "work_pool": LOCAL_POOL,
    }
    assert deployments["toy_listen", "local"] == local
    config = yaml.safe_load(prefect_yaml.PATH.read_text())["definitions"]
    assert deployments["toy_listen", "ecs"] == {
        **local,
        "name": "ecs",
        "parameters": {"source": "sqs", "max_runtime_seconds": 21600, "run_deployment": "toy-run/ecs"},
        "triggers": [],
        "work_pool": config["work_pools"]["ecs"],
        "pull": config["pulls"]["ecs"],
        "build": config["images"]["ecs_build"],
        "push": config["images"]["ecs_push"],
    }


def test_work_takes_its_limits_and_parameters_per_set_and_upkeep_runs_in_the_maintenance_service():
    deployments = _toy_deployments()
    config = yaml.safe_load(prefect_yaml.PATH.read_text())["definitions"]
    assert deployments["toy_run", "local"]["concurrency_limit"] == config["limits"]["fan_out_local"]
    assert deployments["toy_run", "ecs"]["concurrency_limit"] == config["limits"]["surveys_aws"]
    assert deployments["toy_run", "local"]["parameters"] == {"size": 1}
    assert deployments["toy_run", "ecs"]["parameters"] == {"size": 2}
    assert deployments["toy_run", "ecs"]["tags"] == ["toy"] and "triggers" not in deployments["toy_run", "ecs"]
    sweep = deployments["toy_sweep", "ecs"]
    assert sweep["tags"] == ["toy", "maintenance"] and sweep["concurrency_limit"] == ONE_AT_A_TIME
    assert sweep["schedules"] == [EVERY_10_MINUTES] == deployments["toy_sweep", "local"]["schedules"]
    assert sweep["work_pool"] == config["work_pools"]["maintenance"] and "build" not in sweep and "push" not in sweep


def test_the_reconcile_reacts_to_every_pipelines_record_flows():
    with registered(TOY):
        flows = record_flows()
        deployments = prefect_yaml.manifest()["deployments"]
    # seed order (video 3, toy 50); a pipeline scaffolded between them adds its flows in between
    assert flows.index("video-sweep-stuck") < flows.index("toy-run")
    state = [d for d in deployments if d["entrypoint"] == "flows/records.py:records_prefect_state"]
    assert [d["name"] for d in state] == ["local", "ecs"]
    for deployment in state:
        (trigger,) = deployment["triggers"]
        assert trigger["match_related"] == {"prefect.resource.role": "flow", "prefect.resource.name": flows}


def test_without_the_marker_line_generate_refuses_naming_it(tmp_path, monkeypatch, capsys):
    manifest = tmp_path / "prefect.yaml"
    manifest.write_text("name: x\n")
    monkeypatch.setattr(prefect_yaml, "PATH", manifest)
    assert cli.main(["generate", "--check"]) == 2
    assert "prefect.yaml has no line" in capsys.readouterr().err and manifest.read_text() == "name: x\n"
