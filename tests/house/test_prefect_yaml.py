"""prefect.yaml: every entrypoint imports, every parameter set fits its flow's schema, `prefect deploy --all` works."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import jsonschema
import pytest
import yaml
from prefect import Flow
from prefect.flows import load_flow_from_entrypoint
from prefect.utilities.callables import parameter_schema

from tasks.core import limits
from tests.helpers.docker_standin import ECS_IMAGE, docker_standin, prefect_deploy

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
DEPLOYMENTS = CONFIG["deployments"]
SUBFLOWS = {"phspectra-fit-chunks"}  # run only inside their parent flow
MAINTENANCE_FLOWS = set(limits.maintenance_flows())
LOCAL_POOL, ECS_POOL, MAINTENANCE_POOL = "local-process", "aws-ecs", "aws-maintenance"


def _flow(entrypoint: str):
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        return load_flow_from_entrypoint(entrypoint)
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=lambda d: f"{d['entrypoint'].split(':')[1]}/{d['name']}")
def test_each_deployment_imports_and_its_parameters_fit_the_flow(deployment):
    flow = _flow(deployment["entrypoint"])
    schema = parameter_schema(flow).model_dump_for_openapi()
    params = deployment.get("parameters") or {}
    unknown = set(params) - set(schema["properties"])
    assert not unknown, f"{deployment['entrypoint']}: unknown parameters {unknown}"
    # required parameters may be left to run time; what is given must validate
    jsonschema.validate(params, {**schema, "required": []})
    assert deployment["enforce_parameter_schema"] is True
    assert deployment["work_pool"]["name"] in (LOCAL_POOL, ECS_POOL, MAINTENANCE_POOL)


def test_every_flow_is_deployed_locally_and_in_aws():
    by_flow: dict[str, set[str]] = {}
    for deployment in DEPLOYMENTS:
        by_flow.setdefault(deployment["entrypoint"], set()).add(deployment["work_pool"]["name"])
    aws = ({LOCAL_POOL, ECS_POOL}, {LOCAL_POOL, MAINTENANCE_POOL})  # each flow in one AWS pool
    assert all(pools in aws for pools in by_flow.values()), by_flow
    deployed_names = {_flow(e).name for e in by_flow}
    on_disk = set()
    for module in sorted((REPO_ROOT / "flows").glob("[!_]*.py")):
        namespace = importlib.import_module(f"flows.{module.stem}")
        on_disk |= {obj.name for obj in vars(namespace).values() if isinstance(obj, Flow)}
    missing = on_disk - deployed_names - SUBFLOWS
    assert not missing, f"flows without a deployment: {missing}"


def test_maintenance_flows_never_overlap_themselves_and_cannot_hang():
    for deployment in DEPLOYMENTS:
        flow = _flow(deployment["entrypoint"])
        if flow.name in MAINTENANCE_FLOWS:
            assert deployment["concurrency_limit"] == {"limit": 1, "collision_strategy": "CANCEL_NEW"}, flow.name
            assert flow.timeout_seconds == limits.MAINTENANCE_TIMEOUT_S, flow.name


def test_maintenance_flows_are_scheduled():
    scheduled = {}
    for deployment in DEPLOYMENTS:
        flow = _flow(deployment["entrypoint"])
        if deployment.get("schedules"):
            scheduled[flow.name] = deployment["schedules"]
    assert MAINTENANCE_FLOWS <= set(scheduled), MAINTENANCE_FLOWS - set(scheduled)
    # replay needs a person: its schedule exists but is off
    assert all(s["active"] is False for s in scheduled["records-replay-dla"])


def test_the_frequent_maintenance_flows_run_in_the_maintenance_service_and_the_rest_on_ecs():
    """Issue 51: an AWS deployment due every 10 minutes or more often is a process of the maintenance service's
    worker (aws-maintenance), not a Fargate task per run; the hourly and daily ones and every pipeline run stay on
    the ECS pool. The maintenance set runs the stack's image as the service has it: no build, push or job variable."""
    from infra.cost import launches_per_month

    week = 7 * 24
    aws = [d for d in DEPLOYMENTS if d["name"] == "ecs"]
    frequent = {
        _flow(d["entrypoint"]).name
        for d in aws
        if any(
            s.get("active", True) and launches_per_month(s["cron"], week) >= week * 6 for s in d.get("schedules") or []
        )
    }
    assert frequent == {
        "phspectra-sweep-stuck",
        "ndjson-merge-breaker",
        "gpu-sweep",
        "gpu-node-healthcheck",
        "video-delete-cleanup",
        "video-sweep-stuck",
        "records-reconcile",
        "pipeline-health",
    }
    for deployment in aws:
        name = _flow(deployment["entrypoint"]).name
        pool = deployment["work_pool"]
        assert pool["name"] == (MAINTENANCE_POOL if name in frequent else ECS_POOL), name
        if pool["name"] == MAINTENANCE_POOL:
            assert pool == CONFIG["definitions"]["work_pools"]["maintenance"], name
            assert "build" not in deployment and "push" not in deployment, name
            assert deployment["pull"] == CONFIG["definitions"]["pulls"]["ecs"], name  # the image's checkout
        else:
            assert deployment["build"] == CONFIG["definitions"]["images"]["ecs_build"], name


def assert_ecs_image_built_and_pushed(docker) -> None:
    """The ecs set built the Dockerfile for Fargate from a context of the package alone, and pushed it, once:
    prefect-docker caches a step's output for the same inputs, so the other deployments reuse it."""
    image = (ECS_IMAGE["PIPELINES_IMAGE_REPOSITORY"], ECS_IMAGE["PIPELINES_IMAGE_TAG"])
    assert len(docker.builds) == 1 and docker.pushes == [image] and docker.tags == [image]
    for build in docker.builds:
        assert (build["query"]["dockerfile"], build["query"]["platform"]) == ("Dockerfile", "linux/amd64")
        assert {"Dockerfile", "pyproject.toml", "constraints.txt", "prefect.yaml", "flows/etl.py"} <= set(
            build["files"]
        )
        tops = {name.split("/")[0] for name in build["files"]}
        assert tops <= {
            "Dockerfile",
            ".dockerignore",
            "pyproject.toml",
            "constraints.txt",
            "README.md",
            "prefect.yaml",
            "blocks",
            "deployments",
            "flows",
            "tasks",
            "infra",  # the installed command's `aws-stack` imports it (docs/aws.md)
        }, tops  # no venv, data, tests or git in the context
        assert not [name for name in build["files"] if "__pycache__" in name]


@pytest.mark.sweep  # deploys every set through the CLI (~35 s)
@pytest.mark.timeout(900)
def test_prefect_deploy_of_each_set_against_the_test_server(moto_thread):
    """`make up` deploys the local set only; the AWS set deploys too; a later `make up` retires it, Late runs too."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from deployments.local_stack import (
        ECS_WORK_POOL,
        LOCAL_DEPLOYMENTS,
        aws_work_pools,
        create_work_pools,
        retire_unserved_deployments,
    )

    with get_client(sync_client=True) as client:
        create_work_pools(
            client
        )  # as `make up`: the ECS pool with the ECS worker's template, so job variables are checked
    prefect_deploy(LOCAL_DEPLOYMENTS)
    expected = {(_flow(d["entrypoint"]).name, d["name"], d["work_pool"]["name"]) for d in DEPLOYMENTS}
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        # prefect.yaml's sets only (other tests deploy copies of these flows under names of their own)
        deployed = [
            d
            for d in client.read_deployments()
            if flows[d.flow_id] in {e[0] for e in expected} and d.name in ("local", "ecs")
        ]
    assert {(flows[d.flow_id], d.name, d.work_pool_name) for d in deployed} == {
        e for e in expected if e[1] == "local"
    }, "make up deployed something its worker does not serve"
    schedules = {flows[d.flow_id]: d.schedules for d in deployed}
    assert schedules["records-replay-dla"][0].active is False and schedules["phspectra-sweep-stuck"][0].active is True
    limits = {
        flows[d.flow_id]: (
            d.global_concurrency_limit and d.global_concurrency_limit.limit,
            d.concurrency_options and d.concurrency_options.collision_strategy.value,
        )
        for d in deployed
    }
    assert limits["ndjson-merge"] == (3, "ENQUEUE") and limits["pipeline-health"] == (1, "CANCEL_NEW")

    with docker_standin() as docker:  # what an AWS user runs (here: what an older `make up` left on a local server)
        prefect_deploy("ecs", {"DOCKER_HOST": docker.host, **ECS_IMAGE})
    assert_ecs_image_built_and_pushed(docker)
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        deployed = client.read_deployments()
        assert {(flows[d.flow_id], d.name, d.work_pool_name) for d in deployed} >= expected
        image = f"{ECS_IMAGE['PIPELINES_IMAGE_REPOSITORY']}:{ECS_IMAGE['PIPELINES_IMAGE_TAG']}"
        on_ecs = [d for d in deployed if d.work_pool_name == ECS_WORK_POOL]
        assert {d.job_variables["image"] for d in on_ecs} == {image}  # the image it built
        # the server's scheduler path really creates runs (it fails on SQLAlchemy 2.1 with prefect 3.8)
        sweep = next(d for d in deployed if flows[d.flow_id] == "phspectra-sweep-stuck" and d.name == "ecs")
        response = client._client.post(f"/deployments/{sweep.id}/schedule", json={"max_runs": 3})
        assert response.status_code < 300, response.text
        only_sweep = DeploymentFilter(id=DeploymentFilterId(any_=[sweep.id]))
        assert (
            len([r for r in client.read_flow_runs(deployment_filter=only_sweep) if r.state_type.value == "SCHEDULED"])
            >= 3
        )
        unserved = [d for d in deployed if d.work_pool_name in aws_work_pools()]
        assert {d.work_pool_name for d in unserved} == set(aws_work_pools())  # aws-ecs and aws-maintenance
        retired, deleted_runs = retire_unserved_deployments(client)
        assert retired == len(unserved) and deleted_runs >= 3
        left = client.read_deployments()
        assert not [d for d in left if d.work_pool_name in aws_work_pools()]
        assert not client.read_flow_runs(deployment_filter=only_sweep)
        assert {d.id for d in left} >= {d.id for d in deployed if d.name == "local"}


def test_nothing_runs_every_minute_the_breaker_and_the_gpu_sweep_run_when_due():
    """Issue 52 (each flow run costs ~30 Prefect API calls): no schedule is due more often than every 5 minutes.
    The breaker's check is scheduled by its trip (flows/etl.py, tasks/etl/breaker.py); gpu-sweep is triggered by a
    gpu-job run that ended without its job (then follows itself up while a job has no watcher); for both the
    schedule every 10 minutes is the backstop."""
    from infra.cost import launches_per_month

    for deployment in DEPLOYMENTS:
        for schedule in deployment.get("schedules") or []:
            assert launches_per_month(schedule["cron"], 1) <= 12, (deployment["entrypoint"], schedule)
    every_10 = CONFIG["definitions"]["schedules"]["every_10_minutes"]
    for deployment in DEPLOYMENTS:
        flow = _flow(deployment["entrypoint"]).name
        if flow in ("ndjson-merge-breaker", "gpu-sweep"):
            assert deployment["schedules"] == [every_10], (flow, deployment["name"])
        if flow == "gpu-sweep":
            (trigger,) = deployment["triggers"]
            assert trigger["match_related"] == {"prefect.resource.role": "flow", "prefect.resource.name": "gpu-job"}
            assert set(trigger["expect"]) == {
                f"prefect.flow-run.{state}" for state in ("Crashed", "Cancelled", "Failed", "TimedOut")
            }
            assert (trigger["posture"], trigger["threshold"], trigger.get("parameters")) == ("Reactive", 1, None)
