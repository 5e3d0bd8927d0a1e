"""infra/cost.py: the monthly cost at rest from the template and prefect.yaml, and docs/aws.md's figures its own."""

import copy
import json

import pytest

from infra import aws_docs, cost
from infra import cloudformation as cfn


@pytest.fixture(scope="module")
def committed():
    return json.loads(cfn.TEMPLATE_PATH.read_text()), cfn.prefect_config(), cost.load_prices()


def test_the_total_is_the_sum_of_its_lines(committed):
    template, config, prices = committed
    lines = cost.cost_lines(template, config, prices)
    text = cost.report(lines, prices)
    total = float(text.split("\ntotal")[1].split()[0].replace(",", ""))
    assert total == pytest.approx(sum(round(line.monthly, 2) for line in lines), abs=0.01 * len(lines))
    assert all(line.monthly >= 0 for line in lines)
    # every assumption is printed with the figures
    assert all(f"{name} = " in text for name in prices["assumptions"])


def test_every_resource_type_is_priced_or_named_free(committed):
    template, _, _ = committed
    assert cost.unpriced(template) == []
    grown = copy.deepcopy(template)
    grown["Resources"]["Extra"] = {"Type": "AWS::RDS::DBInstance", "Properties": {}}
    assert cost.unpriced(grown) == ["AWS::RDS::DBInstance"]


def test_every_price_names_its_source():
    prices = cost.load_prices()
    assert prices["region"] == "us-east-1" and prices["checked"]
    assert all(item["source"].startswith("https://aws.amazon.com/") for item in prices["prices"].values())
    assert all(item["why"] for item in prices["assumptions"].values())


def test_each_scheduled_ecs_run_is_counted_from_its_cron(committed):
    template, config, prices = committed
    hours = prices["assumptions"]["hours_per_month"]["value"]
    assert cost.launches_per_month("* * * * *", hours) == pytest.approx(60 * hours)
    assert cost.launches_per_month("*/10 * * * *", hours) == pytest.approx(6 * hours)
    assert cost.launches_per_month("17 3 * * *", hours) == pytest.approx(hours / 24)
    scheduled = {line.name for line in cost.scheduled_lines(config, prices, hours)}
    active = [
        d
        for d in config["deployments"]
        if d["work_pool"]["name"] == "aws-ecs" and any(s.get("active", True) for s in d.get("schedules") or [])
    ]
    assert len(scheduled) == len(active)
    # a schedule moved off the ECS pool leaves the lines
    moved = copy.deepcopy(config)
    for deployment in moved["deployments"]:
        deployment["work_pool"] = {**deployment["work_pool"], "name": "elsewhere"}
    assert cost.scheduled_lines(moved, prices, hours) == []


def test_the_docs_cost_section_is_the_scripts(committed):
    template, _, _ = committed
    lines, prices = cost.current(template)
    text = aws_docs.DOC.read_text()
    assert cost.markdown(lines, prices) in text  # as `pipelines generate` writes it
    assert f"| **total** | **{sum(line.monthly for line in lines):,.2f}** | |" in text
    assert cost.current() == (lines, prices)  # the committed template is the generated one


def test_only_the_hourly_and_daily_runs_launch_fargate_tasks_and_the_maintenance_service_is_priced(committed):
    """Issue 51: the frequent maintenance flows run in the maintenance service (one small always-on task) rather
    than a Fargate task per run; the hourly and daily ones stay on the ECS pool."""
    template, config, prices = committed
    hours = prices["assumptions"]["hours_per_month"]["value"]
    left = {line.name.split()[3] for line in cost.scheduled_lines(config, prices, hours)}
    assert left == {"ndjson-flush-orphans/ecs", "pipelines-retention/ecs"}
    lines = {line.name: line for line in cost.cost_lines(template, config, prices)}
    service = lines["Fargate service prefect-maintenance-worker"]
    assert service.detail == "1 task x 0.5 vCPU / 2 GB x 730 h"
    assert service.monthly == pytest.approx(cost.fargate_hourly(0.5, 2, prices) * hours)
    # $4,431 a month with a task per maintenance run; each listener adds its always-on task and what it brings
    assert sum(line.monthly for line in lines.values()) < ceiling(len(cfn.listener_deployments()))


def ceiling(listeners: int) -> float:
    """The most the stack may cost at rest a month: the shared part (the workers, NAT, the scheduled runs, the
    monitoring, $165 with the four listeners taken out) under $170, and $50 a listener (its 1 vCPU / 4 GB task $42.53,
    its Container Insights metrics $6, $0.70 for each of its alarms)."""
    return 170 + 50 * listeners


def test_the_ceiling_grows_by_a_listener_and_not_by_a_maintenance_run_per_fargate_task(committed):
    """A listener more (as `pipelines new` makes) stays under the ceiling; the maintenance runs as Fargate tasks do
    not, nor a listener twice the size."""
    template, config, prices = committed
    listeners = len(cfn.listener_deployments())
    total = sum(line.monthly for line in cost.cost_lines(template, config, prices))
    one_more = copy.deepcopy(template)
    resources = one_more["Resources"]
    assert "AnotherListenerService" not in resources
    resources["AnotherListenerTaskDefinition"] = copy.deepcopy(resources["RecordsListenerTaskDefinition"])
    resources["AnotherListenerService"] = copy.deepcopy(resources["RecordsListenerService"])
    resources["AnotherListenerService"]["Properties"]["ServiceName"] = "another-listen"
    resources["AnotherListenerService"]["Properties"]["TaskDefinition"] = {"Ref": "AnotherListenerTaskDefinition"}
    grown = sum(line.monthly for line in cost.cost_lines(one_more, config, prices))
    assert grown - total == pytest.approx(42.53 + 6.00, abs=0.01)
    assert grown < ceiling(listeners + 1)
    doubled = copy.deepcopy(template)
    for name, resource in doubled["Resources"].items():
        if name.endswith("ListenerTaskDefinition"):
            resource["Properties"].update(Cpu="2048", Memory="8192")
    assert sum(line.monthly for line in cost.cost_lines(doubled, config, prices)) > ceiling(listeners)
    per_run = copy.deepcopy(config)
    pools = per_run["definitions"]["work_pools"]
    for deployment in per_run["deployments"]:
        if deployment["work_pool"]["name"] == pools["maintenance"]["name"]:
            deployment["work_pool"] = pools["ecs"]
    assert sum(line.monthly for line in cost.cost_lines(template, per_run, prices)) > ceiling(listeners)


def test_only_pipeline_health_alarms_count_as_its_readings(committed):
    """The maintenance service's alarm reads Container Insights' RunningTaskCount: no reading of pipeline-health's."""
    template, _, prices = committed
    alarms = {n: r for n, r in template["Resources"].items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    theirs = [n for n, r in alarms.items() if r["Properties"]["Namespace"] == "ECS/ContainerInsights"]
    assert theirs == ["AlarmMaintenanceWorkerNotRunning"]
    [health] = [line for line in cost.monitoring_lines(template["Resources"], prices) if "pipeline-health" in line.name]
    assert health.detail.startswith(f"{2 * (len(alarms) - 1)} metrics")
