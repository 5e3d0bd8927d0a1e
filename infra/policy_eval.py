"""IAM's decision on one request against a role's policies from the template, conditions included.

No maintained Python library evaluates identity policies with their conditions offline (policy_sentry and
cloudsplaining query and audit the action database, parliament lints; moto's access control ignores conditions;
the IAM policy simulator is an AWS API), so this is a small evaluator restricted to what the template's policies
use, refusing anything else rather than guessing. Each rule follows AWS's IAM User Guide (the page named):

- statements with Effect, Action and Resource (no NotAction/NotResource/NotPrincipal), an explicit Deny winning
  (reference_policies_evaluation-logic.html);
- actions case-insensitive with ``*`` and ``?``; resources case-sensitive, compared segment by segment: a ``*`` or
  ``?`` stays within its colon-separated segment, except a ``*`` that is a segment's last character, which may
  match beyond the colon boundaries, and the resource segment (everything after the fifth colon) is one segment
  whose ``*`` matches ``/`` and ``:`` alike (reference_policies_elements_resource.html, "Using wildcards in resource
  ARNs");
- the condition operators StringEquals, StringLike, ArnEquals, ArnLike, Bool (and their ``IfExists`` forms), every
  key of every operator holding; ArnEquals and ArnLike compare each of the ARN's six colon-delimited parts
  separately, so a policy value must name all six (reference_policies_elements_condition_operators.html); a key the
  request does not carry fails the condition, and a request carries only the keys its action supports (the
  Service Authorization Reference, from parliament's database: ``tests/helpers/aws_calls.py`` reads it), which is
  how ``ecs:TagResource`` under an ``ecs:cluster`` condition is denied in AWS;
- a multivalued key (the reference's ArrayOf… types, ``aws:TagKeys``) needs ForAllValues or ForAnyValue
  (reference_policies_condition-single-vs-multi-valued-context-keys.html): ForAllValues holds when every value in
  the request matches a policy value (and when the key is absent), ForAnyValue when one does; a single-valued
  operator on a multivalued key is refused, since AWS documents no meaning for it;
- resource-based policies (bucket, queue, topic and KMS key policies) join the decision: within one account the
  request is allowed when the identity policy or the resource policy allows the role, and denied by an explicit
  Deny in either; a KMS key's policy must allow the role itself, or allow the account (which lets IAM policies
  grant it) (reference_policies_evaluation-logic_policies_resource.html, kms key-policy-default.html); a
  permissions boundary and the account's SCPs, when given, must allow it too.

The template's intrinsic functions are resolved as CloudFormation resolves them for a stack (``stack_values``):
Ref, Fn::Sub, Fn::GetAtt ... Arn, Fn::If on the template's conditions, Fn::Split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

OPERATORS = ("StringEquals", "StringLike", "ArnEquals", "ArnLike", "Bool")
SET_OPERATORS = ("ForAllValues:", "ForAnyValue:")
MULTIVALUED_GLOBAL_KEYS = frozenset({"aws:tagkeys", "aws:principalservicenameslist", "aws:calledvia"})
RESOURCE_POLICIES = {  # the resource policy kinds of the template: type -> (policy property, the resources' property)
    "AWS::S3::BucketPolicy": ("PolicyDocument", "Bucket"),
    "AWS::SQS::QueuePolicy": ("PolicyDocument", "Queues"),
    "AWS::SNS::TopicPolicy": ("PolicyDocument", "Topics"),
    "AWS::KMS::Key": ("KeyPolicy", None),
}
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
    multivalued: frozenset[str] = frozenset()  # the context keys that are multivalued (lower case)


@dataclass(frozen=True)
class ResourcePolicy:
    """A resource-based policy and the resources it is attached to (a bucket's policy covers its objects)."""

    resources: tuple[str, ...]
    statements: list[dict[str, Any]]

    def covers(self, resource: str) -> bool:
        """Whether the request's resource is one this policy is attached to."""
        return any(
            resource == r or (r.startswith("arn:aws:s3:::") and resource.startswith(r + "/")) for r in self.resources
        )


@dataclass(frozen=True)
class Principal:
    """Everything that decides for one role: its identity statements, the role's ARN (what a resource policy's
    Principal names), the resource policies, its permissions boundary and the account's SCPs (None: none set)."""

    statements: list[dict[str, Any]]
    arn: str = ""
    resource_policies: tuple[ResourcePolicy, ...] = ()
    boundary: list[dict[str, Any]] | None = None
    scps: list[dict[str, Any]] | None = None


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
    if "Fn::Split" in value:
        separator, text = value["Fn::Split"]
        return [part for part in str(resolve(text, values, conditions)).split(separator)]
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
        values[f"{logical}.Arn"] = resource_arn(kind, physical, account, region)
        values[logical] = values[f"{logical}.Arn"] if kind in REF_IS_ARN else physical
    return values


REF_IS_ARN = {"AWS::SecretsManager::Secret"}  # kinds whose Ref is their ARN, not their name


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
        # Secrets Manager appends six random characters to a secret's name in its ARN
        "AWS::SecretsManager::Secret": f"arn:aws:secretsmanager:{region}:{account}:secret:{name}-AbCdEf",
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


def _wildcards(text: str, star: str, one: str) -> str:
    """An IAM wildcard text (``*``, ``?``) as a regular expression, ``*`` and ``?`` given."""
    return "".join(star if c == "*" else one if c == "?" else re.escape(c) for c in text)


def _pattern(text: str, case: bool) -> re.Pattern[str]:
    """An action pattern (``*``, ``?`` match anything) as a full-match regular expression."""
    return re.compile(_wildcards(text, ".*", "."), 0 if case else re.IGNORECASE)


def resource_pattern(text: str) -> re.Pattern[str]:
    """A Resource element's ARN pattern: each colon-separated segment matched on its own, ``*`` and ``?`` not
    crossing a colon, except a ``*`` ending a segment (it may match beyond the colon boundaries); the resource
    segment (after the fifth colon) is one segment, colons and slashes included."""
    segments = text.split(":", 5)
    body = []
    for index, segment in enumerate(segments):
        if index == 5:
            body.append(_wildcards(segment, ".*", "."))
            continue
        inner = (
            _wildcards(segment[:-1], "[^:]*", "[^:]") if segment.endswith("*") else _wildcards(segment, "[^:]*", "[^:]")
        )
        body.append(inner + (".*" if segment.endswith("*") else ""))
    return re.compile(":".join(body))


def matches(patterns: str | list[str], value: str, case: bool = True) -> bool:
    """Whether any action pattern matches ``value``."""
    patterns = [patterns] if isinstance(patterns, str) else patterns
    return any(_pattern(p, case).fullmatch(value) for p in patterns)


def resource_matches(patterns: str | list[str], resource: str) -> bool:
    """Whether any Resource pattern matches the request's resource ARN."""
    patterns = [patterns] if isinstance(patterns, str) else patterns
    return any(resource_pattern(p).fullmatch(resource) for p in patterns)


def arn_like(pattern: str, value: str) -> bool:
    """ArnEquals/ArnLike: each of the six colon-delimited parts compared separately, each with ``*`` and ``?``; a
    pattern or value of fewer parts matches nothing."""
    wanted, given = pattern.split(":", 5), value.split(":", 5)
    if len(wanted) != 6 or len(given) != 6:
        return False
    return all(re.fullmatch(_wildcards(w, ".*", "."), g) for w, g in zip(wanted, given, strict=True))


def _value_matches(base: str, wanted: list[str], value: str) -> bool:
    """Whether one request value matches one of the policy's values under a single-valued operator."""
    if base == "StringEquals":
        return value in wanted
    if base == "Bool":
        return any(value.lower() == w.lower() for w in wanted)
    if base == "StringLike":
        return any(_pattern(w, True).fullmatch(value) for w in wanted)
    return any(arn_like(w, value) for w in wanted)  # ArnEquals, ArnLike


def condition_holds(
    condition: dict[str, dict[str, Any]], context: dict[str, tuple[str, ...]], multivalued: frozenset[str] = frozenset()
) -> bool:
    """Whether every key of every operator holds for the request's context."""
    for operator, keys in condition.items():
        qualifier = next((q for q in SET_OPERATORS if operator.startswith(q)), "")
        base = operator.removeprefix(qualifier).removesuffix("IfExists")
        if base not in OPERATORS:
            raise ValueError(f"condition operator {operator} is outside what this evaluator knows")
        for key, wanted in keys.items():
            wanted = [str(w) for w in (wanted if isinstance(wanted, list) else [wanted])]
            given = next((v for k, v in context.items() if k.lower() == key.lower()), None)
            many = key.lower() in multivalued or key.lower() in MULTIVALUED_GLOBAL_KEYS
            if many and not qualifier:
                raise ValueError(f"{operator} on the multivalued key {key}: IAM requires ForAllValues or ForAnyValue")
            if qualifier == "ForAllValues:":
                ok = all(_value_matches(base, wanted, g) for g in given or ())
            elif given is None:
                ok = operator.endswith("IfExists")
            elif qualifier == "ForAnyValue:":
                ok = any(_value_matches(base, wanted, g) for g in given)
            else:
                ok = any(_value_matches(base, wanted, g) for g in given)
            if not ok:
                return False
    return True


def _principal_named(statement: dict[str, Any], arn: str, effect: str) -> bool:
    """Whether a resource policy statement's Principal names the role: ``*``, its ARN, or (for a Deny, and for a
    KMS key's grant to the account) its account."""
    named = statement.get("Principal")
    if named == "*":
        return True
    if not isinstance(named, dict) or set(named) - {"AWS", "Service", "Federated"}:
        raise ValueError(f"statement {statement.get('Sid')} has a Principal outside this evaluator: {named}")
    aws = named.get("AWS", [])
    aws = [aws] if isinstance(aws, str) else aws
    account = arn.split(":")[4] if arn.count(":") >= 5 else ""
    account_named = any(a in (account, f"arn:aws:iam::{account}:root") for a in aws)
    return "*" in aws or arn in aws or (effect == "Deny" and account_named)


def _account_principal(statement: dict[str, Any], arn: str) -> bool:
    """Whether the statement's Principal is the role's account (a KMS key policy that lets IAM policies grant)."""
    aws = (statement.get("Principal") or {}).get("AWS", []) if isinstance(statement.get("Principal"), dict) else []
    aws = [aws] if isinstance(aws, str) else aws
    account = arn.split(":")[4] if arn.count(":") >= 5 else ""
    return any(a in (account, f"arn:aws:iam::{account}:root") for a in aws)


def _applies(statement: dict[str, Any], request: Request) -> bool:
    """Whether a statement's Action, Resource and Condition all match the request."""
    unknown = {"NotAction", "NotResource", "NotPrincipal"} & set(statement)
    if unknown:
        raise ValueError(f"statement {statement.get('Sid')} uses {sorted(unknown)}, outside this evaluator")
    return (
        matches(statement["Action"], request.action, case=False)
        and resource_matches(statement.get("Resource", "*"), request.resource)
        and condition_holds(statement.get("Condition", {}), request.context, request.multivalued)
    )


def _identity(statements: list[dict[str, Any]], request: Request) -> tuple[str | None, str | None]:
    """(the Sid of an explicit Deny, the Sid of an Allow) among identity-style statements (no Principal)."""
    allowed_by = None
    for statement in statements:
        if _applies(statement, request):
            if statement["Effect"] == "Deny":
                return statement.get("Sid", "?"), None
            allowed_by = allowed_by or statement.get("Sid", "?")
    return None, allowed_by


def decide(who: list[dict[str, Any]] | Principal, request: Request) -> tuple[bool, str]:
    """IAM's decision for ``request`` by a role (its identity statements alone, or a ``Principal`` with the
    resource policies, boundary and SCPs that also decide): (allowed, why)."""
    who = who if isinstance(who, Principal) else Principal(list(who))
    denied, allowed_by = _identity(who.statements, request)
    if denied:
        return False, f"explicitly denied by {denied}"
    for name, limits in (("SCP", who.scps), ("permissions boundary", who.boundary)):
        if limits is not None:
            limit_denied, limit_allows = _identity(limits, request)
            if limit_denied or not limit_allows:
                return False, f"explicitly denied by {name} {limit_denied}" if limit_denied else f"no {name} allows it"
    key_policy = None
    for policy in who.resource_policies:
        if not policy.covers(request.resource):
            continue
        is_key = request.resource.startswith("arn:aws:kms:")
        key_policy = key_policy or (policy if is_key else None)
        for statement in policy.statements:
            if not _applies(statement, request) or not _principal_named(statement, who.arn, statement["Effect"]):
                continue
            if statement["Effect"] == "Deny":
                return False, f"explicitly denied by the resource policy's {statement.get('Sid', '?')}"
            allowed_by = statement.get("Sid", "?") if is_key or not allowed_by else allowed_by
    if (
        key_policy is not None
        and allowed_by
        and not any(
            _applies(s, request)
            and s["Effect"] == "Allow"
            and (_principal_named(s, who.arn, "Allow") or _account_principal(s, who.arn))
            for s in key_policy.statements
        )
    ):
        return False, "the KMS key policy neither allows the role nor lets IAM policies grant it"
    if allowed_by:
        return True, f"allowed by {allowed_by}"
    return False, "no statement allows it (implicit deny)"


def resource_policies(template: dict[str, Any], values: dict[str, Any]) -> tuple[ResourcePolicy, ...]:
    """The template's resource-based policies, resolved for the stack, each with the ARNs it is attached to."""
    conditions = template_conditions(template, values)
    found = []
    for logical, resource in template["Resources"].items():
        if resource["Type"] not in RESOURCE_POLICIES:
            continue
        document, attached = RESOURCE_POLICIES[resource["Type"]]
        properties = resource.get("Properties", {})
        targets = properties.get(attached) if attached else {"Ref": logical}
        targets = targets if isinstance(targets, list) else [targets]
        arns = tuple(values[f"{t['Ref']}.Arn"] for t in targets)  # each a Ref of a resource of the stack
        statements = resolve(properties[document], values, conditions)["Statement"]
        found.append(ResourcePolicy(arns, statements))
    return tuple(found)
