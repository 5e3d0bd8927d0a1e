"""The alarms reach someone: each CloudWatch alarm's actions name the stack's topic, and the topic's key lets
CloudWatch publish (kms:GenerateDataKey* and kms:Decrypt for the cloudwatch.amazonaws.com principal, evaluated by
infra/policy_eval.py). The AWS managed alias/aws/sns cannot: its policy is fixed and grants no AWS service, so
every notification would fail with KMS AccessDenied."""

from __future__ import annotations

import json

from infra import cloudformation as cfn
from infra import policy_eval

STACK, ACCOUNT, REGION = "pipelines-dev", "123456789012", "us-east-1"
CLOUDWATCH = {"Service": "cloudwatch.amazonaws.com"}


def test_every_alarm_publishes_to_a_topic_whose_key_lets_cloudwatch_use_it():
    template = json.loads(cfn.TEMPLATE_PATH.read_text())
    resources = template["Resources"]
    values = policy_eval.stack_values(template, {"Env": "dev", "BucketName": "b"}, STACK, ACCOUNT, REGION)
    alarms = {name: r for name, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    assert alarms
    topics = {
        action["Ref"]
        for alarm in alarms.values()
        for action in alarm["Properties"]["AlarmActions"] + alarm["Properties"]["OKActions"]
    }
    assert topics == {"AlarmTopic"}
    for topic in topics:
        key = resources[topic]["Properties"]["KmsMasterKeyId"]
        assert isinstance(key, dict), f"{topic} is encrypted with {key}, a key whose policy CloudWatch cannot be in"
        logical = (key.get("Fn::GetAtt") or [key.get("Ref")])[0]
        assert resources[logical]["Type"] == "AWS::KMS::Key"
        statements = policy_eval.principal_statements(template, logical, "KeyPolicy", CLOUDWATCH, values)
        key_arn = values[f"{logical}.Arn"]
        for action in ("kms:GenerateDataKey", "kms:Decrypt"):
            allowed, why = policy_eval.decide(statements, policy_eval.Request(action, key_arn))
            assert allowed, f"CloudWatch {action} on {logical}: {why}"
        assert not policy_eval.decide(statements, policy_eval.Request("kms:ScheduleKeyDeletion", key_arn))[0]
