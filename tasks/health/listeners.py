"""The landing listeners' alarms: every listener deployment has a live run, and none falls behind what lands.

    listener deployments (Prefect) ──> no Scheduled/Pending/Running run ──> landing-listener-not-running
    each landing place ──> local: what its catch-up listing would take, there longer than LISTENER_BACKLOG_S
                       └─> AWS: its queue's oldest message older than that (CloudWatch) ──> landing-listener-behind

A listener that crashed is rerun by its deployment's trigger within seconds; these alarms say when that did not
happen (no worker, a listener that fails at once) or when one runs but does not keep up.
"""

from __future__ import annotations

from pathlib import Path

import boto3

from blocks.health import HealthThresholds
from tasks.core import registry
from tasks.core.object_store import LocalStore, ObjectStore
from tasks.core.registry import Landing
from tasks.health.checks import Alarm, Check, count_alarm

# a file the listener has not acked this long after it changed is a backlog (its watermark moves every minute)
LISTENER_BACKLOG_S = 5 * 60
LISTENER_BACKLOG_MAX = 0  # files or messages waiting longer than that, before the alarm fires


def places() -> dict[str, Landing]:
    """Pipeline name -> where its listener takes arrivals from, for every pipeline with a landing."""
    return registry.landings()


def listeners_not_running(limits: HealthThresholds) -> Alarm:
    """Listener deployments on this server without a Scheduled, Pending or Running run (nothing listens there)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    live = FlowRunFilter(
        state=FlowRunFilterState(
            type=FlowRunFilterStateType(any_=[StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING])
        )
    )
    silent = []
    with get_client(sync_client=True) as client:
        flows = {
            flow.id: flow.name
            for flow in client.read_flows(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[p.flow for p in places().values()]))
            )
        }
        deployments = client.read_deployments(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[p.flow for p in places().values()]))
        )
        for deployment in deployments:
            only = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
            if not client.read_flow_runs(deployment_filter=only, flow_run_filter=live, limit=1):
                silent.append(f"{flows.get(deployment.flow_id, '?')}/{deployment.name}")
    return count_alarm("landing-listener-not-running", "all", silent, 0, "listener deployment(s) with no live run")


def local_backlog(store: LocalStore, place: Landing, older_than_s: float, now: float | None = None) -> list[str]:
    """What its listener has still to take under ``place`` (the catch-up listing's own rule: files changed or come
    in since its watermark, links and bad folder names it has to quarantine), there longer than ``older_than_s``
    by the file system's clock (``now``: another "now")."""
    from tasks.landing.watch import changed_files, fs_now, ignored_name, read_watermark

    folder = store.root / place.prefix
    if not folder.is_dir():
        return []
    clock = fs_now(folder)
    cutoff = (clock if now is None else now) - older_than_s

    def counted(path: Path) -> bool:
        return not ignored_name(path.name) and (not place.suffixes or path.name.endswith(tuple(place.suffixes)))

    return [
        listed.path.relative_to(store.root).as_posix()
        for listed in changed_files(folder, read_watermark(folder), clock, counted)
        if listed.landed < cutoff
    ]


def oldest_message_age(pipeline: str) -> float | None:
    """Seconds the oldest message of ``pipeline``'s landing queue has waited (CloudWatch's
    ApproximateAgeOfOldestMessage, the last 5 minutes' maximum); None when the queue does not exist, 0 when
    CloudWatch has no figure yet."""
    from datetime import UTC, datetime, timedelta

    from tasks.landing.sqs import aws_session, queue_names

    session = aws_session() or boto3.Session()
    sqs, name = session.client("sqs"), queue_names(pipeline)[0]
    try:
        sqs.get_queue_url(QueueName=name)
    except sqs.exceptions.QueueDoesNotExist:
        return None
    now = datetime.now(UTC)
    points = session.client("cloudwatch").get_metric_statistics(
        Namespace="AWS/SQS",
        MetricName="ApproximateAgeOfOldestMessage",
        Dimensions=[{"Name": "QueueName", "Value": name}],
        StartTime=now - timedelta(minutes=5),
        EndTime=now,
        Period=60,
        Statistics=["Maximum"],
    )["Datapoints"]
    return max((float(p["Maximum"]) for p in points), default=0.0)


def listeners_behind(limits: HealthThresholds) -> Alarm:
    """Arrivals no listener took in LISTENER_BACKLOG_S: files past a local watermark, or a queue's oldest message."""
    from tasks.landing.sqs import landing_store_url

    waiting: list[str] = []
    for pipeline, place in places().items():
        store = ObjectStore.from_url(landing_store_url(pipeline))
        if isinstance(store, LocalStore):
            waiting += local_backlog(store, place, LISTENER_BACKLOG_S)
        elif (age := oldest_message_age(pipeline) or 0) > LISTENER_BACKLOG_S:
            waiting.append(f"{pipeline} queue (oldest message {age:.0f} s)")
    return count_alarm(
        "landing-listener-behind",
        "all",
        waiting,
        LISTENER_BACKLOG_MAX,
        f"arrival(s) or queue(s) waiting for a listener over {LISTENER_BACKLOG_S // 60} min",
    )


CHECKS: dict[Check, tuple[str, ...]] = {
    listeners_not_running: ("landing-listener-not-running",),
    listeners_behind: ("landing-listener-behind",),
}
