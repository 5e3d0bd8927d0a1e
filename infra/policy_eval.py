"""IAM's decision on one request against a role's policy from the template, conditions included.

No maintained Python library evaluates identity policies with their conditions offline (policy_sentry and
cloudsplaining query and audit the action database, parliament lints; moto's access control ignores conditions;
the IAM policy simulator is an AWS API), so this is a small evaluator restricted to what the template's policies
use, refusing anything else rather than guessing:

- statements with Effect, Action and Resource (no NotAction/NotResource/NotPrincipal), an explicit Deny winning;
- action and resource patterns with ``*`` and ``?`` (actions case-insensitive, resources case-sensitive);
- the condition operators StringEquals, StringLike, ArnEquals, ArnLike, Bool (and their ``IfExists`` forms), every
  key of every operator holding; a key the request does not carry fails the condition (IAM's rule), and a request
  carries only the keys its action supports (the Service Authorization Reference, from policy_sentry's database:
  ``tests/helpers/aws_calls.py`` reads it), which is how ``ecs:TagResource`` under an ``ecs:cluster`` condition is
  denied in AWS.

The template's intrinsic functions are resolved as CloudFormation resolves them for a stack (``stack_values``):
Ref, Fn::Sub, Fn::GetAtt ... Arn, Fn::If on the template's conditions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

OPERATORS = ("StringEquals", "StringLike", "ArnEquals", "ArnLike", "Bool")
NAME_PROPERTIES = {  # the property naming a resource, for its Ref and Arn
    "AWS::DynamoDB::Table": "TableName",
    "AWS::SQS::Queue": "QueueName",
    "AWS::ECS::Cluster": "ClusterName",
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::S3::Bucket": "BucketName",
    "AWS::ECS::TaskDefinition": "Family",
    "AWS::ECS::Service": "ServiceName",
    "AWS::SNS::Topic": "TopicName",
    "AWS::Events::Rule": "Name",
}


@dataclass(frozen=True)
class Request:
    """One authorization IAM makes for a call: an action on a resource, with the request's condition keys."""

    action: str
    resource: str
    context: dict[str, tuple[str, ...]] = field(default_factory=dict)


def resolve(value: Any, values: dict[str, Any], conditions: dict[str, bool] | None = None) -> Any:
    """``value`` with Ref/Fn::Sub/Fn::GetAtt/Fn::If filled from ``values`` (parameters, pseudo parameters, logical
    ids, ``Logical.Arn``) and ``conditions``; an ``AWS::NoValue`` list item or key is dropped."""
    if isinstance(value, list):
        items = [resolve(v, values, conditions) for v in value]
        return [v for v in items if v is not NO_VALUE]
    if not isinstance(value, dict):
        return value
    if "Ref" in value:
        return NO_VALUE if value["Ref"] == "AWS::NoValue" else values[value["Ref"]]
    if "Fn::Sub" in value:
        return re.sub(r"\$\{([^}]+)\}", lambda m: str(values[m.group(1)]), value["Fn::Sub"])
    if "Fn::GetAtt" in value:
        return values[".".join(value["Fn::GetAtt"])]
    if "Fn::If" in value:
        name, then, otherwise = value["Fn::If"]
        return resolve(then if (conditions or {})[name] else otherwise, values, conditions)
    resolved = {k: resolve(v, values, conditions) for k, v in value.items()}
    return {k: v for k, v in resolved.items() if v is not NO_VALUE}


class _NoValue:
    """``Ref: AWS::NoValue``: the item or property is left out."""


NO_VALUE = _NoValue()


def template_conditions(template: dict[str, Any], values: dict[str, Any]) -> dict[str, bool]:
    """The template's Conditions (Fn::Equals, Fn::Not, Fn::And, Fn::Or) for these parameter values."""

    def evaluate(expression: Any) -> Any:
        if isinstance(expression, dict) and len(expression) == 1:
            [(function, arguments)] = expression.items()
            if function == "Fn::Equals":
                left, right = (evaluate(a) for a in arguments)
                return left == right
            if function == "Fn::Not":
                return not evaluate(arguments[0])
            if function == "Fn::And":
                return all(evaluate(a) for a in arguments)
            if function == "Fn::Or":
                return any(evaluate(a) for a in arguments)
            if function == "Condition":
                return evaluate(template["Conditions"][arguments])
            return resolve(expression, values)
        return expression

    return {name: bool(evaluate(expression)) for name, expression in template.get("Conditions", {}).items()}


def stack_values(
    template: dict[str, Any], parameters: dict[str, str], stack: str, account: str, region: str
) -> dict[str, Any]:
    """What CloudFormation fills in for a stack of ``template``: parameters (defaults included), pseudo parameters,
    each named resource's Ref and Arn, and a generated name for the others (roles: ``{stack}-{Logical}``)."""
    values: dict[str, Any] = {
        name: spec["Default"] for name, spec in template.get("Parameters", {}).items() if "Default" in spec
    }
    values |= parameters
    values |= {
        "AWS::AccountId": account,
        "AWS::Region": region,
        "AWS::Partition": "aws",
        "AWS::URLSuffix": "amazonaws.com",
        "AWS::StackName": stack,
    }
    for logical, resource in template["Resources"].items():
        kind, properties = resource["Type"], resource.get("Properties", {})
        name = NAME_PROPERTIES.get(kind)
        physical = resolve(properties[name], values) if name and name in properties else f"{stack}-{logical}"
        values[logical] = physical
        values[f"{logical}.Arn"] = resource_arn(kind, physical, account, region)
    return values


def resource_arn(kind: str, name: str, account: str, region: str) -> str:
    """The ARN of a resource of ``kind`` named ``name``."""
    service = kind.split("::")[1].lower()
    shapes = {
        "AWS::DynamoDB::Table": f"arn:aws:dynamodb:{region}:{account}:table/{name}",
        "AWS::SQS::Queue": f"arn:aws:sqs:{region}:{account}:{name}",
        "AWS::ECS::Cluster": f"arn:aws:ecs:{region}:{account}:cluster/{name}",
        "AWS::Logs::LogGroup": f"arn:aws:logs:{region}:{account}:log-group:{name}:*",
        "AWS::S3::Bucket": f"arn:aws:s3:::{name}",
        "AWS::IAM::Role": f"arn:aws:iam::{account}:role/{name}",
        "AWS::SNS::Topic": f"arn:aws:sns:{region}:{account}:{name}",
        "AWS::Events::Rule": f"arn:aws:events:{region}:{account}:rule/{name}",
        "AWS::KMS::Key": f"arn:aws:kms:{region}:{account}:key/{name}",
    }
    return shapes.get(kind, f"arn:aws:{service}:{region}:{account}:{name}")


def role_statements(template: dict[str, Any], role: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every statement of the role's inline policies, resolved for the stack."""
    conditions = template_conditions(template, values)
    policies = resolve(template["Resources"][role]["Properties"].get("Policies", []), values, conditions)
    return [statement for p in policies for statement in p["PolicyDocument"]["Statement"]]


def principal_statements(
    template: dict[str, Any], logical: str, policy: str, principal: dict[str, str], values: dict[str, Any]
) -> list[dict[str, Any]]:
    """The statements of resource ``logical``'s resource policy (its property ``policy``: a KMS key's KeyPolicy)
    that apply to ``principal`` (``{"Service": "cloudwatch.amazonaws.com"}``), resolved for the stack; ``decide``
    evaluates them as that principal's (in a key policy, Resource ``*`` is the key itself)."""

    def names(statement: dict[str, Any]) -> bool:
        given = statement["Principal"]
        if given == "*":
            return True
        return any(
            value == "*" or wanted in (value if isinstance(value, list) else [value])
            for kind, wanted in principal.items()
            for value in [given.get(kind, [])]
        )

    document = resolve(template["Resources"][logical]["Properties"][policy], values)
    return [statement for statement in document["Statement"] if names(statement)]


def _pattern(text: str, case: bool) -> re.Pattern[str]:
    """An IAM wildcard pattern (``*``, ``?``) as a full-match regular expression."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in text)
    return re.compile(body, 0 if case else re.IGNORECASE)


def matches(patterns: str | list[str], value: str, case: bool = True) -> bool:
    """Whether any IAM wildcard pattern matches ``value``."""
    patterns = [patterns] if isinstance(patterns, str) else patterns
    return any(_pattern(p, case).fullmatch(value) for p in patterns)


def condition_holds(condition: dict[str, dict[str, Any]], context: dict[str, tuple[str, ...]]) -> bool:
    """Whether every key of every operator holds for the request's context."""
    for operator, keys in condition.items():
        base = operator.removesuffix("IfExists")
        if base not in OPERATORS or operator.startswith(("ForAllValues:", "ForAnyValue:")):
            raise ValueError(f"condition operator {operator} is outside what this evaluator knows")
        for key, wanted in keys.items():
            wanted = [str(w) for w in (wanted if isinstance(wanted, list) else [wanted])]
            given = next((v for k, v in context.items() if k.lower() == key.lower()), None)
            if given is None:
                if operator.endswith("IfExists"):
                    continue
                return False
            if base in ("StringEquals", "ArnEquals"):
                ok = any(g == w for g in given for w in wanted)
            elif base == "Bool":
                ok = any(g.lower() == w.lower() for g in given for w in wanted)
            else:  # StringLike, ArnLike
                ok = any(matches(w, g) for g in given for w in wanted)
            if not ok:
                return False
    return True


def decide(statements: list[dict[str, Any]], request: Request) -> tuple[bool, str]:
    """IAM's decision for ``request`` under these identity-policy statements: (allowed, why)."""
    allowed_by = None
    for statement in statements:
        unknown = {"NotAction", "NotResource", "NotPrincipal"} & set(statement)
        if unknown:
            raise ValueError(f"statement {statement.get('Sid')} uses {sorted(unknown)}, outside this evaluator")
        if not matches(statement["Action"], request.action, case=False):
            continue
        if not matches(statement["Resource"], request.resource):
            continue
        if not condition_holds(statement.get("Condition", {}), request.context):
            continue
        if statement["Effect"] == "Deny":
            return False, f"explicitly denied by {statement.get('Sid', '?')}"
        allowed_by = allowed_by or statement.get("Sid", "?")
    if allowed_by:
        return True, f"allowed by {allowed_by}"
    return False, "no statement allows it (implicit deny)"
