"""pipeline-health's readings as CloudWatch metrics, so the cloud dashboard shows the numbers the Prefect UI shows.

In AWS (``PIPELINES_METRICS_ENV`` set by the stack: the containers' and the flow runs' environment) each pass puts,
per alarm, its reading as the metric ``<alarm name>`` and whether it fires as ``Firing`` (dimension ``Alarm``), in
the namespace ``Pipelines`` with the dimension ``Env``; the template's dashboard and CloudWatch alarms (with the
seed's severities, to its SNS topic) read them. Locally the variable is unset and nothing is put.
"""

from __future__ import annotations

from typing import Any

import boto3

from tasks.health.checks import severities
from tasks.health.settings import MetricsSettings

NAMESPACE = "Pipelines"
ENV_VARIABLE = MetricsSettings.env_name("metrics_env")
FIRING = "Firing"
BATCH = 1000  # PutMetricData's most metrics per call


def with_families(rows: list[dict[str, Any]], families: list[str]) -> list[dict[str, Any]]:
    """The rows, plus a row per family (an alarm read per member, e.g. ``disk-full-objects`` of ``disk-full``) that
    has members but no row of its own: the members' highest reading, firing when any member fires. The template's
    CloudWatch alarms name the family, as a stack cannot know its members in advance."""
    names = {row["name"] for row in rows}
    added = []
    for family in families:
        members = [row for row in rows if row["name"].startswith(family + "-")]
        if family in names or not members:
            continue
        readings = [row["value"] for row in members if row["value"] is not None]
        firing = [row for row in members if row["state"] != "OK"]
        added.append(
            {
                "name": family,
                "value": max(readings) if len(readings) == len(members) else None,
                "state": firing[0]["state"] if firing else "OK",
            }
        )
    return rows + added


def metric_data(rows: list[dict[str, Any]], env: str) -> list[dict[str, Any]]:
    """Each alarm row (as the pipeline-health artifact holds it) as its reading and its Firing 0/1, and each family's
    (``with_families``); an alarm whose check failed (no reading) only fires."""
    data = []
    for row in with_families(rows, sorted(severities())):
        if row["value"] is not None:
            data.append(
                {
                    "MetricName": row["name"],
                    "Dimensions": [{"Name": "Env", "Value": env}],
                    "Value": float(row["value"]),
                    "Unit": "Count",
                }
            )
        data.append(
            {
                "MetricName": FIRING,
                "Dimensions": [{"Name": "Env", "Value": env}, {"Name": "Alarm", "Value": row["name"]}],
                "Value": 0.0 if row["state"] == "OK" else 1.0,
                "Unit": "Count",
            }
        )
    return data


def publish_readings(rows: list[dict[str, Any]]) -> int:
    """Put the pass's readings to CloudWatch when the stack asks for it; how many metrics were put."""
    env = MetricsSettings.read().metrics_env
    if not env:
        return 0
    from tasks.landing.sqs import aws_session

    cloudwatch = (aws_session() or boto3.Session()).client("cloudwatch")
    data = metric_data(rows, env)
    for start in range(0, len(data), BATCH):
        cloudwatch.put_metric_data(Namespace=NAMESPACE, MetricData=data[start : start + BATCH])
    return len(data)
