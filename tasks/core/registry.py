"""The pipelines the shared machinery serves: one typed declaration per package, found by its place.

    tasks/<package>/pipeline.py: PIPELINE = Pipeline(...) ──pipelines()──▶ tables and their default names,
        the landing place and queue, maintenance flows and timeouts, health checks and severities,
        retention rules, reconcile adapters, dashboard figures, its flows' deployments (prefect.yaml's
        generated part: `pipelines generate`)

Tables, landing, health, retention and reconcile iterate ``pipelines()`` and name no pipeline. A declaration names
its checks, rules and adapters by import path (``"module:attribute"``, resolved by ``Pipeline.hook``), so reading
the registry imports the declarations only, and each hook's module is imported when the machinery first uses it.
A test adds a pipeline of its own with ``registered(pipeline)``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tasks.core.tables import TableSpec

OBJECTS, MESSAGES = "objects", "messages"  # what a landing queue carries: S3 notifications, or workflow messages
DECLARATION = "pipeline"  # the module of a package under tasks/ that declares it, holding PIPELINE
SET = "{set}"  # in a deployment's parameters and triggers: the deployment set's name (local, ecs) once generated
RECORD_FLOWS = "{record_flows}"  # in a trigger: every pipeline's record_flows, as a list, once generated


@dataclass(frozen=True)
class Table:
    """One DynamoDB table of a pipeline: its keys, and its name when nobody configured another."""

    spec: TableSpec
    default_name: str  # may hold {env}, the tables' environment suffix


@dataclass(frozen=True)
class QueueSpec:
    """A pipeline's arrival queue as its seed describes it: names, visibility timeout, what it carries."""

    queue: str  # name, with {env}
    dead_letter: str  # its dead-letter queue's name, with {env}
    visibility_timeout_s: int
    mode: str  # OBJECTS: S3 notifications for keys under input_prefix; MESSAGES: plain workflow messages
    input_prefix: str = ""  # key prefix (in the pipeline's store) whose created objects are notified

    def names(self, env: str) -> tuple[str, str]:
        """(queue name, dead-letter queue name) in ``env``."""
        return self.queue.format(env=env), self.dead_letter.format(env=env)


@dataclass(frozen=True)
class Landing:
    """Where data that lands starts a pipeline: the listener flow, the place it watches, the queue in AWS."""

    flow: str  # the listener flow's name
    prefix: str  # the key prefix it watches in its store
    queue: QueueSpec
    suffixes: tuple[str, ...] | None = None  # only names ending so (None: every name)
    store: str | None = None  # hook returning the URL of the store it watches (None: the pipeline object store)


@dataclass(frozen=True)
class Deployment:
    """One flow's deployments, local and in AWS, as prefect.yaml's generated part writes them.

    Names in ``limit``, ``aws_limit`` and ``schedule`` are anchors of prefect.yaml's hand-written ``definitions``;
    ``SET`` in a parameter or trigger becomes the set's name. The listener (the flow of ``Pipeline.landing``) gets
    the supervision triggers, one run at a time and ``source``; a maintenance flow one run at a time.
    """

    entrypoint: str  # "flows/<module>.py:<function>"; the flow's name is the function's, dashed
    description: str
    limit: str | None = None  # concurrency anchor of both sets (listeners and maintenance: one_at_a_time)
    aws_limit: str | None = None  # the ecs set's own, when it differs
    schedule: str | None = None  # schedule anchor, both sets
    parameters: Mapping[str, Any] = field(default_factory=dict)  # both sets'
    aws_parameters: Mapping[str, Any] = field(default_factory=dict)  # the ecs set's changes to them
    triggers: tuple[Mapping[str, Any], ...] = ()  # both sets' (beside a listener's supervision)
    maintenance_service: bool = False  # in AWS, a process of the always-on maintenance service (no image build)

    @property
    def flow(self) -> str:
        """The flow's name."""
        return self.entrypoint.rpartition(":")[2].replace("_", "-")


@dataclass(frozen=True)
class Pipeline:
    """What the shared machinery needs from one pipeline (hooks are ``"module:attribute"`` import paths)."""

    name: str
    seed: int  # the seed document's number: the order in which pipelines are visited
    tables: Mapping[str, Table] = field(default_factory=dict)  # logical name -> table
    landing: Landing | None = None
    flows: tuple[str, ...] = ()  # flows whose failed runs are the pipeline's failures (health's run alarms)
    maintenance_flows: tuple[str, ...] = ()  # scheduled upkeep: one run at a time, MAINTENANCE_TIMEOUT_S each
    flow_timeouts: Mapping[str, float] = field(default_factory=dict)  # other flows' timeouts, in seconds
    task_timeouts: Mapping[str, float] = field(default_factory=dict)  # task name -> timeout (duration alarm)
    health_checks: str | None = None  # hook: Mapping[check, alarm names] of checks reading its records
    service_checks: str | None = None  # hook: the same, of checks reading the orchestrator (runs, events, metrics)
    severities: Mapping[str, str] = field(default_factory=dict)  # alarm name -> CRITICAL / WARNING
    retention_rules: str | None = None  # hook: Sequence[tasks.retention.sweep.Rule]
    object_retention: str | None = None  # hook: (RetentionWindow) -> {area: objects deleted}
    reconcile_adapters: str | None = None  # hook: Sequence[tasks.reconcile.Adapter]
    dashboard: str | None = None  # hook: (DashboardWindow) -> tasks.health.dashboard.Figures
    aws: str | None = None  # hook: tasks.core.aws_template.AwsParts, its own parts of the CloudFormation template
    deployments: tuple[Deployment, ...] = ()  # its flows' deployments (prefect.yaml)
    record_flows: tuple[str, ...] = ()  # flows whose crashed or failed runs records-prefect-state reconciles

    def hook(self, attribute: str) -> Any:
        """The object a hook field names, imported on first use; None when the pipeline declares none."""
        path = getattr(self, attribute)
        return None if path is None else pkgutil.resolve_name(path)


_EXTRA: dict[str, Pipeline] = {}  # declared in-process (tests), beside the packages' own


@functools.cache
def _declared() -> tuple[Pipeline, ...]:
    import tasks

    found = []
    for package in pkgutil.iter_modules(tasks.__path__):
        if package.ispkg and importlib.util.find_spec(f"tasks.{package.name}.{DECLARATION}") is not None:
            found.append(importlib.import_module(f"tasks.{package.name}.{DECLARATION}").PIPELINE)
    return tuple(found)


def pipelines() -> tuple[Pipeline, ...]:
    """Every declared pipeline, in seed order."""
    merged = {p.name: p for p in _declared()} | _EXTRA
    return tuple(sorted(merged.values(), key=lambda p: (p.seed, p.name)))


def pipeline(name: str) -> Pipeline:
    """The pipeline called ``name``; ValueError naming the known ones otherwise."""
    by_name = {p.name: p for p in pipelines()}
    if name not in by_name:
        raise ValueError(f"unknown pipeline {name!r}: one of {', '.join(sorted(by_name))}")
    return by_name[name]


@contextlib.contextmanager
def registered(*extra: Pipeline) -> Iterator[None]:
    """``extra`` pipelines declared while the block runs (a test's own pipeline)."""
    before = dict(_EXTRA)
    _EXTRA.update({p.name: p for p in extra})
    try:
        yield
    finally:
        _EXTRA.clear()
        _EXTRA.update(before)


def table_specs() -> dict[str, TableSpec]:
    """Logical table name -> its keys, over every pipeline."""
    return {logical: table.spec for p in pipelines() for logical, table in p.tables.items()}


def default_table_names(env: str = "dev") -> dict[str, str]:
    """Logical table name -> the seed's name for it in ``env``."""
    return {logical: table.default_name.format(env=env) for p in pipelines() for logical, table in p.tables.items()}


def landings() -> dict[str, Landing]:
    """Pipeline name -> where its data lands, for every pipeline that has a landing."""
    return {p.name: p.landing for p in pipelines() if p.landing is not None}


def run_trigger(expect: Sequence[str], related: Any, **extra: Any) -> dict[str, Any]:
    """A deployment trigger: one run for each flow-run event ``expect`` of a run related to ``related``."""
    return {
        "type": "event",
        "enabled": True,
        "match": {"prefect.resource.id": "prefect.flow-run.*"},
        "match_related": related,
        "expect": list(expect),
        "posture": "Reactive",
        "threshold": 1,
        **extra,
    }


def record_flows() -> list[str]:
    """Every pipeline's flows whose ended runs ``records-prefect-state`` reconciles, in seed order."""
    return [flow for p in pipelines() for flow in p.record_flows]


def hooks(attribute: str) -> list[tuple[Pipeline, Any]]:
    """(pipeline, hooked object) for every pipeline that declares the hook ``attribute``."""
    return [(p, p.hook(attribute)) for p in pipelines() if getattr(p, attribute) is not None]
