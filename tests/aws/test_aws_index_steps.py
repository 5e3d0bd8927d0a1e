"""A deploy that adds several GSIs to a table applies them one stack update at a time (CloudFormation's limit: one
GSI created or deleted per table per update), at the running release's parameters, and refuses a key change with
the steps; run against moto's CloudFormation."""

from __future__ import annotations

import copy
import json

import pytest

from deployments import aws

moto = pytest.importorskip("moto")


def table(*indexes: tuple[str, str]) -> dict:
    """A table resource with a GSI per (name, hash key)."""
    properties = {
        "TableName": "jobs",
        "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": [{"AttributeName": "job_id", "KeyType": "HASH"}],
        "AttributeDefinitions": [
            {"AttributeName": a, "AttributeType": "S"} for a in ["job_id", *(k for _, k in indexes)]
        ],
    }
    if indexes:
        properties["GlobalSecondaryIndexes"] = [
            {
                "IndexName": name,
                "KeySchema": [{"AttributeName": key, "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "ALL"},
            }
            for name, key in indexes
        ]
    return {"Type": "AWS::DynamoDB::Table", "Properties": properties}


def template(*indexes: tuple[str, str], tag: str = "1") -> dict:
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Parameters": {"ImageTag": {"Type": "String", "Default": tag}},
        "Resources": {"JobsTable": table(*indexes)},
    }


NEW = (("status-index", "status"), ("owner-index", "owner"), ("queue-index", "queue"))


def index_names(body: dict) -> list[str]:
    return [g["IndexName"] for g in body["Resources"]["JobsTable"]["Properties"].get("GlobalSecondaryIndexes", [])]


def test_each_step_adds_one_index_and_defines_only_the_keys_it_uses():
    steps = aws.index_steps(template(), template(*NEW))
    assert [index_names(step) for step in steps] == [["status-index"], ["status-index", "owner-index"]]
    attributes = [a["AttributeName"] for a in steps[0]["Resources"]["JobsTable"]["Properties"]["AttributeDefinitions"]]
    assert attributes == ["job_id", "status"]  # DynamoDB refuses a definition no key uses
    assert aws.index_steps(template(), template(NEW[0])) == []  # one index: the deploy itself makes it
    assert aws.index_steps(None, template(*NEW)) == []  # a new stack creates the table with all of them


def test_a_key_change_is_refused_with_the_steps():
    changed = copy.deepcopy(template())
    changed["Resources"]["JobsTable"]["Properties"]["KeySchema"][0]["AttributeName"] = "id"
    with pytest.raises(ValueError, match="JobsTable: key schema") as refused:
        aws.index_steps(template(), changed)
    assert "pipelines migrate copy-table" in str(refused.value)


def test_moto_cloudformation_runs_the_steps_at_the_deployed_parameters(monkeypatch):
    import boto3

    with moto.mock_aws():
        cloudformation = boto3.client("cloudformation", region_name="us-east-1")
        monkeypatch.setattr(aws, "POLL_S", 0.05)
        aws.change_set(cloudformation, "pipelines-t", {"TemplateBody": json.dumps(template())}, {"ImageTag": "1"})
        deployed = []
        real = aws.change_set

        def recording(*args, **kwargs):
            result = real(*args, **kwargs)
            deployed.append(aws.deployed_template(cloudformation, "pipelines-t"))
            return result

        monkeypatch.setattr(aws, "change_set", recording)
        new = json.dumps(template(*NEW, tag="2"))
        assert aws.apply_index_steps(cloudformation, "pipelines-t", new, lambda b: {"TemplateBody": b}) == 2
        assert [index_names(body) for body in deployed] == [["status-index"], ["status-index", "owner-index"]]
        described = cloudformation.describe_stacks(StackName="pipelines-t")["Stacks"][0]
        parameters = {p["ParameterKey"]: p.get("ParameterValue") for p in described["Parameters"]}
        assert parameters["ImageTag"] == "1"  # the running release's: its code runs until the last index is in
        aws.change_set(cloudformation, "pipelines-t", {"TemplateBody": new}, {"ImageTag": "2"})
        assert index_names(deployed[-1]) == ["status-index", "owner-index", "queue-index"]
        assert aws.apply_index_steps(cloudformation, "pipelines-t", new, lambda b: {"TemplateBody": b}) == 0
