"""The seeds' service alarms that read the orchestrator rather than the records: errors, timeouts, throttles,
concurrency and duration of every pipeline's flow runs from the Prefect API, and the landing queues' dead letters.
Each returns an ``Alarm``; a pipeline's own service alarms (failure rates, throttles) are among its checks.

Seed 001's 15 CloudWatch alarms and where each one went: docs/operations.md, "Alarms (`pipeline-health`)".
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3

from blocks.health import HealthThresholds
from tasks.core import limits, registry
from tasks.health.checks import Alarm, Check, count_alarm

WINDOW_S = 5 * 60  # the seed's alarm period


def pipeline_flows() -> tuple[str, ...]:
    """The flows whose runs count: every pipeline's work and maintenance flows (never a listener's, whose run is
    rerun by its trigger, nor a failure counted twice)."""
    return tuple(f for p in registry.pipelines() for f in p.flows) + limits.maintenance_flows()


def flow_runs(
    *,
    states: Iterable[str] = (),
    ended_within_s: float | None = None,
    names: Iterable[str] = (),
    flows: Iterable[str] | None = None,
) -> list[Any]:
    """Flow runs of ``flows`` (default: ``pipeline_flows()``) in these state types (or state names), optionally ended
    in the last seconds."""
    flows = pipeline_flows() if flows is None else flows
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterEndTime,
        FlowRunFilterState,
        FlowRunFilterStateName,
        FlowRunFilterStateType,
    )

    state = FlowRunFilterState(
        type=FlowRunFilterStateType(any_=list(states)) if states else None,
        name=FlowRunFilterStateName(any_=list(names)) if names else None,
    )
    end = FlowRunFilterEndTime(after_=datetime.now(UTC) - timedelta(seconds=ended_within_s)) if ended_within_s else None
    runs, offset = [], 0
    with get_client(sync_client=True) as client:
        while page := client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=list(flows))),
            flow_run_filter=FlowRunFilter(state=state, end_time=end),
            limit=200,
            offset=offset,
        ):
            runs += page
            offset += len(page)
            if len(page) < 200:
                break
    return runs


def run_names(runs: Iterable[Any]) -> list[str]:
    """Each run as `name (state)`, for an alarm's detail."""
    return [f"{run.name} ({run.state.name})" if run.state else run.name for run in runs]


def flow_runs_failed(limits_: HealthThresholds) -> Alarm:
    """Lambda-Errors and StepFunctions-ExecutionFailed: runs that ended Failed/Crashed in the last 5 minutes."""
    failed = flow_runs(states=("FAILED", "CRASHED"), ended_within_s=WINDOW_S)
    return count_alarm(
        "flow-runs-failed",
        "all",
        run_names(failed),
        limits_.failed_runs_5min_max,
        "flow run(s) failed or crashed in 5 min",
    )


def flow_runs_timed_out(limits_: HealthThresholds) -> Alarm:
    """StepFunctions-ExecutionTimeout: runs that ended TimedOut in the last 5 minutes."""
    timed_out = flow_runs(names=("TimedOut",), ended_within_s=WINDOW_S)
    return count_alarm("flow-runs-timed-out", "all", run_names(timed_out), 0, "flow run(s) timed out in 5 min")


def flow_runs_waiting(limits_: HealthThresholds) -> Alarm:
    """Lambda-Throttles / StepFunctions-ExecutionThrottled: runs a concurrency limit holds back right now."""
    waiting = flow_runs(names=("AwaitingConcurrencySlot",))
    return count_alarm(
        "flow-runs-waiting-for-a-slot",
        "all",
        run_names(waiting),
        limits_.waiting_runs_max,
        "flow run(s) waiting for a concurrency slot",
    )


def flow_runs_active(limits_: HealthThresholds) -> Alarm:
    """Lambda-ConcurrentExecutions: pipeline flow runs running right now."""
    running = flow_runs(states=("RUNNING",))
    return count_alarm("flow-runs-active", "all", run_names(running), limits_.active_runs_max, "flow run(s) running")


def _running_task_runs(names: Iterable[str]) -> list[tuple[str, Any]]:
    """(task name, run) of the task runs of ``names`` running right now (a run is named ``{task}-{suffix}``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterState, TaskRunFilterStateType

    wanted = set(names)
    running = TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(any_=["RUNNING"])))
    found, offset = [], 0
    with get_client(sync_client=True) as client:
        while page := client.read_task_runs(task_run_filter=running, limit=200, offset=offset):
            found += [(run.name.rsplit("-", 1)[0], run) for run in page if run.name.rsplit("-", 1)[0] in wanted]
            offset += len(page)
            if len(page) < 200:
                break
    return found


def flow_runs_near_timeout(limits_: HealthThresholds) -> Alarm:
    """Lambda-DurationHigh: running runs past ``duration_alarm_fraction`` of their flow's timeout, and the ingest's
    steps (the seed's manifest builder, 180 s) and the status update past that share of their task timeout."""
    now = datetime.now(UTC)
    late = []
    for flow_name, timeout in limits.flow_timeouts().items():
        for run in flow_runs(states=("RUNNING",), flows=(flow_name,)):
            ran = (now - run.start_time).total_seconds() if run.start_time else 0
            if ran > limits_.duration_alarm_fraction * timeout:
                late.append(f"{run.name} ({flow_name}, {ran:.0f} s of {timeout:.0f})")
    task_timeouts = limits.task_timeouts()
    for task_name, run in _running_task_runs(task_timeouts):
        timeout = task_timeouts[task_name]
        ran = (now - run.start_time).total_seconds() if run.start_time else 0
        if ran > limits_.duration_alarm_fraction * timeout:
            late.append(f"{run.name} ({task_name}, {ran:.0f} s of {timeout:.0f})")
    return count_alarm(
        "flow-runs-near-timeout", "all", late, 0, f"run(s) past {limits_.duration_alarm_fraction:.0%} of their timeout"
    )


def landing_dead_letter_queues(limits_: HealthThresholds) -> list[Alarm]:
    """DLQ-Messages (AWS): messages in each landing queue's dead-letter queue, found by the name `aws-events setup`
    gives it; none where the landing is a file watch (a file:// store) or the queue was never set up."""
    from tasks.landing.sqs import aws_session, landing_store_url, queue_names, queue_url_set

    alarms = []
    for pipeline in registry.landings():
        if not landing_store_url(pipeline).startswith("s3://") and not queue_url_set(pipeline):
            continue  # the local stack has no queues: its landing is a file watch
        sqs = (aws_session() or boto3.Session()).client("sqs")
        try:
            url = sqs.get_queue_url(QueueName=queue_names(pipeline)[1])["QueueUrl"]
        except sqs.exceptions.QueueDoesNotExist:
            continue  # this pipeline's landing was not set up here (`aws-events setup --pipeline` makes it)
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
            "Attributes"
        ]
        depth = int(attributes["ApproximateNumberOfMessages"])
        alarms.append(
            Alarm(
                f"landing-dead-letter-queue-{pipeline}",
                pipeline,
                depth,
                limits_.dlq_messages_max,
                f"{depth} message(s) in the {pipeline} landing dead-letter queue",
            )
        )
    return alarms


CHECKS: dict[Check, tuple[str, ...]] = {
    flow_runs_failed: ("flow-runs-failed",),
    flow_runs_timed_out: ("flow-runs-timed-out",),
    flow_runs_waiting: ("flow-runs-waiting-for-a-slot",),
    flow_runs_active: ("flow-runs-active",),
    flow_runs_near_timeout: ("flow-runs-near-timeout",),
    landing_dead_letter_queues: ("landing-dead-letter-queue",),
}
