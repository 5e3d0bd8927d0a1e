"""What a pipeline adds to the CloudFormation template beyond its tables and landing queue (``AwsParts``), and the
few intrinsic functions it is written with.

    tasks/<pipeline>/aws.py: PARTS = AwsParts(...) ──Pipeline.aws──▶ infra/cloudformation.py: its stack parameters,
        the conditions on them, its statements in the pipelines' task role (and those its maintenance flows need in
        the maintenance service's role), its objects' lifecycle rules, the environment its containers read the
        parameters from
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PREFIX_ARN = "arn:${{AWS::Partition}}:{service}:${{AWS::Region}}:${{AWS::AccountId}}"  # .format(service=...)


@dataclass(frozen=True)
class AwsParts:
    """One pipeline's own parts of the stack, each in the template's order (pipelines in seed order)."""

    parameters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # stack parameter -> its declaration
    conditions: Mapping[str, str] = field(default_factory=dict)  # condition -> the parameter it needs non-empty
    statements: Sequence[Mapping[str, Any]] = ()  # the pipelines' task role's statements (``when`` for a condition)
    # what its maintenance flows need of ``statements``: the maintenance service's role (they run in that service)
    maintenance_statements: Sequence[Mapping[str, Any]] = ()
    expiring: Mapping[str, str] = field(default_factory=dict)  # lifecycle rule name -> the key prefix it expires
    expiring_days: int = 0  # how long objects under ``expiring`` are kept
    environment: Mapping[str, str] = field(default_factory=dict)  # container env variable -> the parameter it carries

    def parameter_defaults(self) -> dict[str, str]:
        """Each of this pipeline's stack parameters with the value it takes when the deploy names none."""
        return {name: str(declaration.get("Default", "")) for name, declaration in self.parameters.items()}


def sub(text: str) -> dict[str, str]:
    """``Fn::Sub`` of ``text``."""
    return {"Fn::Sub": text}


def ref(name: str) -> dict[str, str]:
    """``Ref`` of a parameter or resource."""
    return {"Ref": name}


def when(condition: str, statement: Mapping[str, Any]) -> dict[str, Any]:
    """A statement the policy holds only when the template's ``condition`` is true."""
    return {"Fn::If": [condition, statement, ref("AWS::NoValue")]}
