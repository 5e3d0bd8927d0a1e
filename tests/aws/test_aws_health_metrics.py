"""The cloud dashboard agrees with the Prefect UI: after a pipeline-health pass in AWS mode, the metrics the
template's CloudWatch dashboard names hold the numbers of the pass's Prefect artifact (CloudWatch: moto's server).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from infra import cloudformation as cfn
from tasks.health import cloudwatch as health_metrics

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


def dashboard_readings(env: str) -> list[list[str]]:
    """The readings widget's metrics of the template's dashboard, for a stack of ``env``."""
    body = cfn.template()["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    widgets = json.loads(body.replace("${Env}", env).replace("${AWS::Region}", "us-east-1"))["widgets"]
    return widgets[0]["properties"]["metrics"]


@pytest.mark.timeout(300)
def test_a_health_pass_puts_the_artifacts_numbers_where_the_dashboard_reads_them(health, s3_endpoint, monkeypatch):
    import boto3
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    from flows.health import pipeline_health
    from tests.helpers.health import make_dead_letter

    env = f"h{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv(health_metrics.ENV_VARIABLE, env)
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", s3_endpoint)
    make_dead_letter()  # one alarm reads 1 and fires, the others 0
    rows = pipeline_health()
    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["pipeline-health"])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    table = artifact.data if isinstance(artifact.data, list) else json.loads(artifact.data)
    shown = {row["name"]: row["value"] for row in table}
    assert shown == {row["name"]: row["value"] for row in rows} and any(v for v in shown.values())

    cloudwatch = boto3.client("cloudwatch", endpoint_url=s3_endpoint, region_name="us-east-1")
    metrics = dashboard_readings(env)
    assert {m[1] for m in metrics} == set(cfn.alarm_names()) >= set(shown)
    queries = [
        {
            "Id": f"m{i}",
            "MetricStat": {
                "Metric": {"Namespace": namespace, "MetricName": name, "Dimensions": [{"Name": key, "Value": value}]},
                "Period": 300,
                "Stat": "Maximum",
            },
        }
        for i, (namespace, name, key, value) in enumerate(metrics)
    ]
    now = datetime.now(UTC)
    answer = cloudwatch.get_metric_data(
        MetricDataQueries=queries, StartTime=now - timedelta(minutes=10), EndTime=now + timedelta(minutes=1)
    )["MetricDataResults"]
    read = {metrics[int(r["Id"][1:])][1]: r["Values"][0] for r in answer if r["Values"]}
    assert read == {name: float(value) for name, value in shown.items() if value is not None}
    firing = cloudwatch.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "f",
                "MetricStat": {
                    "Metric": {
                        "Namespace": health_metrics.NAMESPACE,
                        "MetricName": health_metrics.FIRING,
                        "Dimensions": [
                            {"Name": "Env", "Value": env},
                            {"Name": "Alarm", "Value": "records-dead-letter-archive"},
                        ],
                    },
                    "Period": 300,
                    "Stat": "Maximum",
                },
            }
        ],
        StartTime=now - timedelta(minutes=10),
        EndTime=now + timedelta(minutes=1),
    )["MetricDataResults"][0]["Values"]
    assert firing == [1.0]  # the template's CloudWatch alarm of that name reads this


def test_locally_nothing_is_put(monkeypatch):
    monkeypatch.delenv(health_metrics.ENV_VARIABLE, raising=False)
    assert health_metrics.publish_readings([{"name": "x", "value": 1, "state": "ALARM"}]) == 0
    assert health_metrics.metric_data([{"name": "x", "value": None, "state": "ERROR"}], "dev") == [
        {
            "MetricName": "Firing",
            "Dimensions": [{"Name": "Env", "Value": "dev"}, {"Name": "Alarm", "Value": "x"}],
            "Value": 1.0,
            "Unit": "Count",
        }
    ]


def test_a_family_of_alarms_is_published_under_the_name_the_templates_alarm_reads():
    rows = [
        {"name": "disk-full-objects", "value": 97, "state": "CRITICAL"},
        {"name": "disk-full-prefect-database", "value": 40, "state": "OK"},
        {"name": "etl-files-pending", "value": 3, "state": "OK"},
        {"name": "etl-files-pending-too-long", "value": 0, "state": "OK"},
    ]
    data = health_metrics.metric_data(rows, "e1")
    readings = {d["MetricName"]: d["Value"] for d in data if d["MetricName"] != health_metrics.FIRING}
    firing = {d["Dimensions"][1]["Value"]: d["Value"] for d in data if d["MetricName"] == health_metrics.FIRING}
    assert readings == {
        "disk-full-objects": 97.0,
        "disk-full-prefect-database": 40.0,
        "etl-files-pending": 3.0,
        "etl-files-pending-too-long": 0.0,
        "disk-full": 97.0,
    }
    assert firing["disk-full"] == 1.0 and "etl-files" not in firing and "disk-space-low" not in firing
    assert {"disk-full", "disk-space-low", "landing-dead-letter-queue"} <= set(cfn.alarm_names())
