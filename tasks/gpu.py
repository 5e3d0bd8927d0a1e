"""Seed 002: GPU jobs on nodes — assign, start, watch, react to task stops, health-check, restart.

Every status change is a guarded transition through ``tasks.state_store`` (expected current status), so a
duplicated or late task-stop event cannot start a second restart or revive a finished job. Numbers the seed
stores as strings (retry, num_nodes, node_index_in_job, job_num_nodes) are strings here too.

``handle_task_stopped`` is the seed's ECS task-stop event: exit 0 completes, non-zero stops the job's other
tasks, health-checks the node(s), reboots bad ones and restarts the job (at most ``max_retries`` times).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tasks import keys, state_store
from tasks.config import table_name
from tasks.gpu_backends import BackendError, ComputeBackend, TaskSpec, make_backend
from tasks.gpu_health import HEALTHY, UNHEALTHY, UNKNOWN, HealthResult
from tasks.state_store import Condition

# task_status
TASK_IN_PROGRESS, TASK_COMPLETE, TASK_TERMINATED = "IN_PROGRESS", "COMPLETE", "TERMINATED"
# job_status
JOB_IN_PROGRESS = "IN_PROGRESS"
JOB_PENDING_HEALTHCHECK = "PENDING_HEALTHCHECK"
JOB_PENDING_RESTART = "PENDING_RESTART"
JOB_RESTARTING = "RESTARTING"
JOB_COMPLETE, JOB_FAILED, JOB_USER_STOPPED = "COMPLETE", "FAILED", "USER_STOPPED"
JOB_ACTIVE = (JOB_IN_PROGRESS, JOB_PENDING_HEALTHCHECK, JOB_PENDING_RESTART, JOB_RESTARTING)
JOB_TERMINAL = (JOB_COMPLETE, JOB_FAILED, JOB_USER_STOPPED)
# node_status
NODE_AVAILABLE, NODE_UNKNOWN, NODE_ASSIGNED, NODE_IN_PROGRESS = "AVAILABLE", "UNKNOWN", "ASSIGNED", "IN_PROGRESS"
NODE_PENDING, NODE_PENDING_HEALTHCHECK = "PENDING", "PENDING_HEALTHCHECK"
NODE_REBOOTING, NODE_FAILED = "REBOOTING", "FAILED"
NODE_HELD = (NODE_ASSIGNED, NODE_IN_PROGRESS, NODE_PENDING, NODE_PENDING_HEALTHCHECK)  # held by a job

log = logging.getLogger("gpu")


class NotEnoughNodes(RuntimeError):
    """Fewer AVAILABLE nodes than the job needs (and no waiting, or the wait timed out)."""


def logger():
    """The Prefect run logger inside a run, else this module's logger."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:
        return log


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def prefect_ids() -> dict[str, str]:
    """``prefect_flow_run_id`` / ``prefect_task_run_id`` of the current run, as strings, None skipped."""
    from prefect.runtime import flow_run, task_run

    ids = {"prefect_flow_run_id": flow_run.id, "prefect_task_run_id": task_run.id}
    return {k: str(v) for k, v in ids.items() if v is not None}


def _tables() -> tuple[str, str, str]:
    return table_name("ecs_task"), table_name("ecs_job"), table_name("ecs_node")


def _owned_by(job_id: str) -> Condition:
    return Condition("#owner = :owner", {"#owner": "job_id"}, {":owner": job_id})


@dataclass
class Runner:
    """What recovery needs: the backend, the settings, and the steps a flow may wrap as Prefect runs."""

    backend: ComputeBackend
    config: Any  # blocks.gpu.GpuCompute
    health_check: Callable[[str], HealthResult] | None = None  # node_name -> result (stored on the node row)
    notify: Callable[[str], None] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    def check(self, node_name: str) -> HealthResult:
        return (self.health_check or (lambda n: check_node(n, self)))(node_name)

    def alert(self, message: str) -> None:
        (self.notify or (lambda m: notify(m, self.config)))(message)


def make_runner(config=None, **kwargs) -> Runner:
    from blocks import load_config
    from blocks.gpu import GpuCompute

    config = config or load_config(GpuCompute)
    return Runner(make_backend(config), config, **kwargs)


def notify(message: str, config) -> None:
    """Send ``message`` through the configured notification block, else log it (tasks.notify)."""
    from tasks.notify import notify as send

    send("GPU job failed", message, config.notification_block or None)


# --------------------------------------------------------------------------- reads


def get_job(job_id: str) -> dict[str, Any] | None:
    return state_store.get_item(_tables()[1], {"job_id": keys.gpu_job_id(job_id)})


def get_task(task_id: str) -> dict[str, Any] | None:
    return state_store.get_item(_tables()[0], {"ecs_task_id": keys.gpu_task_id(task_id)})


def get_node(node_name: str) -> dict[str, Any] | None:
    return state_store.get_item(_tables()[2], {"node_name": keys.gpu_node_name(node_name)})


def list_nodes(cluster_name: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
    """Nodes (of a cluster, in a status), sorted by name. The seed has no node index: a small table's scan."""

    def keep(item: dict[str, Any]) -> bool:
        return (cluster_name is None or item.get("cluster_name") == cluster_name) and (
            status is None or item.get("node_status") == status
        )

    return sorted(state_store.scan_all(_tables()[2], keep=keep), key=lambda n: n["node_name"])


def list_jobs(status: str | None = None) -> list[dict[str, Any]]:
    keep = None if status is None else (lambda item: item.get("job_status") == status)
    return sorted(state_store.scan_all(_tables()[1], keep=keep), key=lambda j: j.get("created_at", ""))


def job_tasks(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The tasks of the job's current attempt (the job row lists their ids)."""
    return [t for t in (get_task(i) for i in job.get("submitted_ecs_task_ids") or []) if t is not None]


# --------------------------------------------------------------------------- nodes


def register_nodes(backend: ComputeBackend, cluster_name: str) -> dict[str, str]:
    """Create a node row (AVAILABLE) for every node the backend knows; existing rows are left alone."""
    stamp = now()
    results = {}
    for node in backend.discover_nodes():
        item = {**node, "cluster_name": cluster_name, "node_status": NODE_AVAILABLE, "created_at": stamp, "updated_at": stamp}
        result = state_store.create_if_absent(_tables()[2], item, ["node_name"])
        results[node["node_name"]] = "registered" if result.applied else f"exists ({result.item.get('node_status')})"
    return results


def claim_node(node_name: str, job_id: str) -> bool:
    """AVAILABLE -> ASSIGNED for ``job_id``; False when someone else got it first (or it is not AVAILABLE)."""
    return state_store.transition(
        _tables()[2], {"node_name": node_name}, NODE_AVAILABLE, NODE_ASSIGNED,
        status_attr="node_status", set={"job_id": job_id, "updated_at": now()},
    ).applied


def move_node(node_name: str, job_id: str | None, expected, new: str, **extra: Any) -> bool:
    """A guarded node transition; with ``job_id``, only while the node is still that job's."""
    attrs = {"updated_at": now(), **extra}
    remove = ["job_id"] if new == NODE_AVAILABLE else []
    return state_store.transition(
        _tables()[2], {"node_name": node_name}, expected, new, status_attr="node_status",
        set=attrs, remove=remove, condition=_owned_by(job_id) if job_id else None,
    ).applied


def release_nodes(job_id: str, node_names, expected=NODE_HELD) -> list[str]:
    """Give the job's held nodes back (-> AVAILABLE); returns the names released."""
    return [n for n in node_names if move_node(n, job_id, expected, NODE_AVAILABLE)]


def assign_nodes(
    job_id: str,
    num_nodes: int,
    cluster_name: str,
    nodes: list[str] | None = None,
    wait: bool = False,
    timeout_s: float = 300.0,
    poll_s: float = 0.5,
) -> list[str]:
    """Claim ``num_nodes`` AVAILABLE nodes for the job, all or none (conditional per node).

    Not enough: release what was claimed, then wait and try again (``wait``) or raise NotEnoughNodes.
    """
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be at least 1, got {num_nodes}")
    cluster = list_nodes(cluster_name)
    known = {n["node_name"] for n in cluster}
    if nodes:
        nodes = [keys.gpu_node_name(n) for n in nodes]
        unknown = sorted(set(nodes) - known)
        if unknown:
            raise LookupError(f"unknown node(s) {unknown} in cluster {cluster_name!r}; known: {sorted(known)}")
        if len(set(nodes)) != num_nodes:
            raise ValueError(f"{num_nodes} nodes requested but {len(set(nodes))} distinct node names given")
    if len(known) < num_nodes:
        raise NotEnoughNodes(f"job needs {num_nodes} nodes but cluster {cluster_name!r} has only {len(known)}")
    deadline = time.monotonic() + timeout_s
    while True:
        candidates = nodes or [n["node_name"] for n in list_nodes(cluster_name, NODE_AVAILABLE)]
        claimed: list[str] = []
        for name in candidates:
            if len(claimed) == num_nodes:
                break
            if claim_node(name, job_id):
                claimed.append(name)
        if len(claimed) == num_nodes:
            return claimed
        release_nodes(job_id, claimed, NODE_ASSIGNED)
        if not wait or time.monotonic() >= deadline:
            free = len(list_nodes(cluster_name, NODE_AVAILABLE))
            waited = f" after waiting {timeout_s:g} s" if wait else " (node_wait='fail')"
            raise NotEnoughNodes(f"job needs {num_nodes} nodes, {free} AVAILABLE in cluster {cluster_name!r}{waited}")
        time.sleep(poll_s * (0.5 + random.random()))


# --------------------------------------------------------------------------- jobs and tasks


def create_failed_job(job_id: str, cluster_name: str, num_nodes: int, command: str, reason: str) -> dict[str, Any]:
    """A job that never started: a FAILED row with the reason (kept if the row exists already)."""
    stamp = now()
    item = {
        "job_id": job_id, "job_timestamp": stamp, "cluster_name": cluster_name, "num_nodes": str(num_nodes),
        "assigned_nodes": [], "submitted_container_inst_ids": [], "submitted_ecs_task_ids": [],
        "created_at": stamp, "updated_at": stamp, "retry": "0", "job_status": JOB_FAILED,
        "command": command, "failure_reason": reason, **prefect_ids(),
    }
    result = state_store.create_if_absent(_tables()[1], item, ["job_id"])
    return result.item if result.item else item


def start_one_task(runner: Runner, job: dict[str, Any], node_name: str, index: int, retry: int) -> dict[str, Any]:
    """Start the job's task on one node and record it IN_PROGRESS (node ASSIGNED -> IN_PROGRESS)."""
    node = get_node(node_name)
    spec = TaskSpec(job["job_id"], retry, node, index, int(job["num_nodes"]), job["command"])
    started = runner.backend.start_task(spec)
    stamp = now()
    item = {
        "ecs_task_id": started.task_id, "node_name": node_name, "node_index_in_job": str(index),
        "job_id": job["job_id"], "job_timestamp": job["job_timestamp"], "job_num_nodes": str(job["num_nodes"]),
        "task_def_arn": started.task_def_arn, "task_def_name": started.task_def_name,
        "task_def_revision": started.task_def_revision, "cluster_name": job["cluster_name"],
        "container_inst_id": node.get("container_instance_id", ""),
        "container_instance_arn": node.get("container_instance_arn", ""),
        "retry": str(retry), "task_status": TASK_IN_PROGRESS, "created_at": stamp, "updated_at": stamp,
        **started.extra, **prefect_ids(),
    }
    result = state_store.create_if_absent(_tables()[0], item, ["ecs_task_id"])
    move_node(node_name, job["job_id"], NODE_ASSIGNED, NODE_IN_PROGRESS)
    return item if result.applied else result.item


def terminate_tasks(runner: Runner, task_ids, reason: str) -> dict[str, dict[str, Any]]:
    """IN_PROGRESS -> TERMINATED, then stop; returns the tasks that had already stopped (with their rows)."""
    ended = {}
    task_ids = list(task_ids)
    results = state_store.transition_many(  # one round trip for all the job's tasks
        _tables()[0],
        [({"ecs_task_id": t}, TASK_IN_PROGRESS, TASK_TERMINATED, {"stop_reason": reason, "updated_at": now()}) for t in task_ids],
        status_attr="task_status",
    )
    for task_id, result in zip(task_ids, results):
        if result.applied:
            try:
                runner.backend.stop(task_id, reason)
            except BackendError as error:
                logger().warning("could not stop task %s: %s", task_id, error)
        elif result.item is not None:
            ended[task_id] = result.item
    return ended


def start_tasks(runner: Runner, job_id: str, expected: str, start_task=None) -> dict[str, Any]:
    """Start one task per assigned node for the job's current retry, then record their ids on the job.

    ``expected`` is the job status this attempt starts from (IN_PROGRESS or RESTARTING); the job row must
    still be there, or the tasks are stopped again. A task that cannot start fails the job with the reason.
    """
    start_task = start_task or start_one_task
    job = get_job(job_id)
    retry = int(job["retry"])
    started: list[dict[str, Any]] = []
    try:
        for index, node_name in enumerate(job["assigned_nodes"]):
            started.append(start_task(runner, job, node_name, index, retry))
    except BackendError as error:
        reason = f"task cannot start: {error}"
        terminate_tasks(runner, [t["ecs_task_id"] for t in started], reason)
        fail_job(runner, job_id, expected, reason, notify_user=False)
        raise
    result = state_store.transition(
        _tables()[1], {"job_id": job_id}, expected, JOB_IN_PROGRESS, status_attr="job_status",
        set={
            "submitted_ecs_task_ids": [t["ecs_task_id"] for t in started],
            "submitted_container_inst_ids": [t["container_inst_id"] for t in started],
            "updated_at": now(), **prefect_ids(),
        },
    )
    if not result.applied:  # stopped or failed while we were starting: undo
        terminate_tasks(runner, [t["ecs_task_id"] for t in started], f"job is {result.item and result.item.get('job_status')}")
        release_nodes(job_id, job["assigned_nodes"])
    return result.item or job


def launch_job(
    runner: Runner,
    job_id: str,
    num_nodes: int,
    command: str,
    nodes: list[str] | None = None,
    wait: bool | None = None,
    timeout_s: float | None = None,
    start_task=None,
) -> dict[str, Any]:
    """Assign nodes, create the job IN_PROGRESS, start one task per node. Bad input: a FAILED job row."""
    config = runner.config
    job_id = keys.gpu_job_id(job_id)
    if get_job(job_id) is not None:
        raise ValueError(f"job {job_id} exists already (job ids are used once)")
    wait = config.node_wait == "wait" if wait is None else wait
    timeout_s = config.node_wait_timeout_s if timeout_s is None else timeout_s
    try:
        assigned = assign_nodes(job_id, num_nodes, config.cluster_name, nodes, wait, timeout_s, config.poll_interval_s)
    except (NotEnoughNodes, LookupError, ValueError) as error:
        create_failed_job(job_id, config.cluster_name, num_nodes, command, str(error))
        raise
    stamp = now()
    item = {
        "job_id": job_id, "job_timestamp": stamp, "cluster_name": config.cluster_name, "num_nodes": str(num_nodes),
        "assigned_nodes": assigned, "submitted_container_inst_ids": [], "submitted_ecs_task_ids": [],
        "created_at": stamp, "updated_at": stamp, "retry": "0", "job_status": JOB_IN_PROGRESS,
        "command": command, "max_retries": str(config.max_retries), **prefect_ids(),
    }
    if not state_store.create_if_absent(_tables()[1], item, ["job_id"]).applied:
        release_nodes(job_id, assigned)
        raise ValueError(f"job {job_id} exists already (job ids are used once)")
    logger().info("job %s: nodes %s assigned", job_id, assigned)
    return start_tasks(runner, job_id, JOB_IN_PROGRESS, start_task)


def fail_job(runner: Runner, job_id: str, expected, reason: str, notify_user: bool = True) -> bool:
    """Job ``expected`` -> FAILED with the reason; its held nodes go back AVAILABLE; optionally notify."""
    result = state_store.transition(
        _tables()[1], {"job_id": job_id}, expected, JOB_FAILED, status_attr="job_status",
        set={"failure_reason": reason, "updated_at": now()},
    )
    if result.applied:
        release_nodes(job_id, result.item.get("assigned_nodes") or [])
        logger().warning("job %s FAILED: %s", job_id, reason)
        if notify_user:
            runner.alert(f"GPU job {job_id} FAILED: {reason}")
    return result.applied


# --------------------------------------------------------------------------- events


def handle_task_stopped(task_id: str, exit_code: int | None, reason: str, runner: Runner) -> dict[str, Any]:
    """The seed's ECS task-stop event, idempotent: only the first delivery of a stop moves anything.

    exit 0: the task COMPLETE, and the job COMPLETE when all its tasks are. Otherwise: the task TERMINATED,
    and if the job was IN_PROGRESS with this task (one winner), recovery runs (see ``recover``).
    """
    task_id = keys.gpu_task_id(task_id)
    ok = exit_code == 0
    result = state_store.transition(
        _tables()[0], {"ecs_task_id": task_id}, TASK_IN_PROGRESS, TASK_COMPLETE if ok else TASK_TERMINATED,
        status_attr="task_status",
        set={"exit_code": str(exit_code), "stop_reason": reason, "updated_at": now()},
    )
    if not result.applied:
        status = result.item.get("task_status") if result.item else None
        return {"action": "unknown_task" if status is None else "duplicate", "task_id": task_id, "task_status": status}
    task = result.item
    if ok:
        return complete_if_done(task["job_id"], task_id)
    return recover(task, runner)


def complete_if_done(job_id: str, task_id: str) -> dict[str, Any]:
    """Job IN_PROGRESS -> COMPLETE once every task of the current attempt is COMPLETE; nodes AVAILABLE."""
    job = get_job(job_id)
    tasks = job_tasks(job)
    if not all(t["task_status"] == TASK_COMPLETE for t in tasks):
        return {"action": "task_complete", "task_id": task_id, "job_id": job_id}
    done = state_store.transition(
        _tables()[1], {"job_id": job_id}, JOB_IN_PROGRESS, JOB_COMPLETE, status_attr="job_status",
        set={"updated_at": now()},
        condition=Condition("contains(#ids, :tid)", {"#ids": "submitted_ecs_task_ids"}, {":tid": task_id}),
    )
    if not done.applied:
        return {"action": "late", "task_id": task_id, "job_id": job_id}
    release_nodes(job_id, job["assigned_nodes"], NODE_IN_PROGRESS)
    logger().info("job %s COMPLETE", job_id)
    return {"action": "job_complete", "task_id": task_id, "job_id": job_id}


def recover(task: dict[str, Any], runner: Runner) -> dict[str, Any]:
    """A task failed: stop the others, health-check the failed node(s), then fail or restart the job.

    Healthy node: the application failed (job FAILED, nodes AVAILABLE). Unhealthy: node FAILED ->
    REBOOTING, job PENDING_RESTART, then restart on a spare or the rebooted node, unless retries are spent.
    """
    job_id, task_id = task["job_id"], task["ecs_task_id"]
    moved = state_store.transition(
        _tables()[1], {"job_id": job_id}, JOB_IN_PROGRESS, JOB_PENDING_HEALTHCHECK, status_attr="job_status",
        set={"updated_at": now(), "last_failure": f"task {task_id} on {task['node_name']}: {task['stop_reason']}"},
        condition=Condition("contains(#ids, :tid)", {"#ids": "submitted_ecs_task_ids"}, {":tid": task_id}),
    )
    if not moved.applied:  # another failure is being handled, or the job ended: nothing to do
        return {"action": "late", "task_id": task_id, "job_id": job_id}
    job = moved.item
    others = [t for t in job["submitted_ecs_task_ids"] if t != task_id]
    already = terminate_tasks(runner, others, f"stopped: task {task_id} of the job failed")
    failed_nodes = [task["node_name"]] + [
        t["node_name"] for t in already.values() if t.get("task_status") == TASK_TERMINATED and t.get("exit_code") != "0"
    ]
    logger().warning("job %s: task %s failed (%s); health-checking %s", job_id, task_id, task["stop_reason"], failed_nodes)
    for name in job["assigned_nodes"]:
        if name in failed_nodes:
            move_node(name, job_id, (NODE_IN_PROGRESS, NODE_ASSIGNED), NODE_PENDING)
        else:
            move_node(name, job_id, (NODE_IN_PROGRESS,), NODE_ASSIGNED)
    verdicts = {}
    for name in failed_nodes:
        move_node(name, job_id, NODE_PENDING, NODE_PENDING_HEALTHCHECK)
        verdicts[name] = runner.check(name)
    bad = [
        name for name, r in verdicts.items()
        if r.status == UNHEALTHY or (r.status == UNKNOWN and runner.config.unknown_is_unhealthy)
    ]
    summary = {name: f"{r.status}: {r.reason}" for name, r in verdicts.items()}
    if not bad:
        fail_job(runner, job_id, JOB_PENDING_HEALTHCHECK, f"application failure: task {task_id} {task['stop_reason']}; node(s) healthy {summary}")
        return {"action": "application_failure", "task_id": task_id, "job_id": job_id, "health": summary}
    for name in failed_nodes:
        if name not in bad:
            move_node(name, job_id, NODE_PENDING_HEALTHCHECK, NODE_ASSIGNED)
    for name in bad:
        take_out_of_service(runner, name, job_id, NODE_PENDING_HEALTHCHECK)
    retry = int(job["retry"])
    if retry >= runner.config.max_retries:
        fail_job(runner, job_id, JOB_PENDING_HEALTHCHECK,
                 f"retries exhausted (retry {retry} of max {runner.config.max_retries}); unhealthy node(s) {summary}")
        return {"action": "retries_exhausted", "task_id": task_id, "job_id": job_id, "health": summary}
    if not state_store.transition(
        _tables()[1], {"job_id": job_id}, JOB_PENDING_HEALTHCHECK, JOB_PENDING_RESTART, status_attr="job_status",
        set={"updated_at": now()},
    ).applied:
        return {"action": "late", "task_id": task_id, "job_id": job_id}
    return restart_job(runner, job_id, bad) | {"task_id": task_id, "health": summary}


def take_out_of_service(runner: Runner, node_name: str, job_id: str | None, expected) -> None:
    """Unhealthy node: ``expected`` -> FAILED, backend reboot, FAILED -> REBOOTING (the job lets go of it)."""
    if not move_node(node_name, job_id, expected, NODE_FAILED):
        return
    try:
        runner.backend.reboot(get_node(node_name))
    except BackendError as error:
        logger().error("node %s FAILED and could not be rebooted: %s", node_name, error)
        return
    move_node(node_name, None, NODE_FAILED, NODE_REBOOTING, rebooted_at=now())
    logger().warning("node %s unhealthy: FAILED -> REBOOTING", node_name)


def node_back(runner: Runner, node_name: str) -> bool:
    """REBOOTING -> AVAILABLE once the backend says the node is up again."""
    node = get_node(node_name)
    if node is None or node["node_status"] != NODE_REBOOTING or not runner.backend.node_ready(node):
        return False
    return move_node(node_name, None, NODE_REBOOTING, NODE_AVAILABLE)


def restart_job(runner: Runner, job_id: str, bad_nodes: list[str], start_task=None) -> dict[str, Any]:
    """PENDING_RESTART: replace each bad node by a spare AVAILABLE node at once, or by the rebooted node
    when it is back; then RESTARTING with retry + 1 and new tasks -> IN_PROGRESS."""
    config = runner.config
    job = get_job(job_id)
    lineup = list(job["assigned_nodes"])
    deadline = time.monotonic() + config.node_wait_timeout_s
    missing = [i for i, n in enumerate(lineup) if n in bad_nodes]
    while missing:
        current = get_job(job_id)
        if current.get("stop_requested") == "true":
            user_stop(runner, job_id)
            current = get_job(job_id)
        if current["job_status"] != JOB_PENDING_RESTART:  # stopped meanwhile
            release_nodes(job_id, [n for i, n in enumerate(lineup) if i not in missing])
            return {"action": "restart_abandoned", "job_id": job_id, "job_status": current["job_status"]}
        for name in bad_nodes:
            node_back(runner, name)
        spares = [n["node_name"] for n in list_nodes(config.cluster_name, NODE_AVAILABLE) if n["node_name"] not in lineup]
        spares += [n for n in bad_nodes if n not in spares]  # the rebooted node, once it is AVAILABLE again
        for name in spares:
            if missing and claim_node(name, job_id):
                lineup[missing.pop(0)] = name
        if not missing:
            break
        if time.monotonic() >= deadline:
            fail_job(runner, job_id, JOB_PENDING_RESTART, f"no replacement node within {config.node_wait_timeout_s:g} s")
            release_nodes(job_id, lineup)
            return {"action": "restart_timed_out", "job_id": job_id}
        time.sleep(min(config.poll_interval_s, 0.5))
    retry = int(job["retry"]) + 1
    moved = state_store.transition(
        _tables()[1], {"job_id": job_id}, JOB_PENDING_RESTART, JOB_RESTARTING, status_attr="job_status",
        set={"retry": str(retry), "assigned_nodes": lineup, "updated_at": now(), **prefect_ids()},
    )
    if not moved.applied:
        release_nodes(job_id, lineup)
        return {"action": "restart_abandoned", "job_id": job_id}
    logger().info("job %s RESTARTING (retry %d) on %s", job_id, retry, lineup)
    try:
        started = start_tasks(runner, job_id, JOB_RESTARTING, start_task)
    except BackendError as error:
        return {"action": "restart_failed", "job_id": job_id, "reason": str(error)}
    return {"action": "restarted", "job_id": job_id, "retry": retry, "nodes": lineup,
            "job_status": started.get("job_status")}


# --------------------------------------------------------------------------- user stop and watching


def request_stop(job_id: str) -> dict[str, Any]:
    """Record a user stop request on an active job; the job's watcher sees it and stops the job."""
    result = state_store.transition(
        _tables()[1], {"job_id": keys.gpu_job_id(job_id)}, JOB_ACTIVE, None, status_attr="job_status",
        set={"stop_requested": "true", "stop_requested_at": now()},
    )
    if result.applied:
        return result.item
    if result.item is None:
        raise LookupError(f"no job {job_id}")
    raise ValueError(f"job {job_id} is {result.item['job_status']}: nothing to stop")


def user_stop(runner: Runner, job_id: str, reason: str = "stopped by user") -> bool:
    """Job (any active status) -> USER_STOPPED; its tasks TERMINATED and stopped; its nodes AVAILABLE."""
    result = state_store.transition(
        _tables()[1], {"job_id": job_id}, JOB_ACTIVE, JOB_USER_STOPPED, status_attr="job_status",
        set={"stop_reason": reason, "updated_at": now()},
    )
    if not result.applied:
        return False
    job = result.item
    terminate_tasks(runner, job.get("submitted_ecs_task_ids") or [], reason)
    release_nodes(job_id, job.get("assigned_nodes") or [])
    logger().info("job %s USER_STOPPED", job_id)
    return True


def watch_job(runner: Runner, job_id: str, on_stopped=None, timeout_s: float | None = None) -> dict[str, Any]:
    """Poll the job's running tasks until the job ends; each stop goes to ``on_stopped`` (the event handler).

    A stop request on the job row ends it USER_STOPPED.
    """
    on_stopped = on_stopped or (lambda tid, code, why: handle_task_stopped(tid, code, why, runner))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        job = get_job(job_id)
        if job["job_status"] in JOB_TERMINAL:
            return job
        if job.get("stop_requested") == "true":
            user_stop(runner, job_id)
            continue
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {job['job_status']} after {timeout_s} s")
        if job["job_status"] == JOB_IN_PROGRESS:
            for task in job_tasks(job):
                if task["task_status"] != TASK_IN_PROGRESS:
                    continue
                try:
                    stopped = runner.backend.poll(task["ecs_task_id"])
                except BackendError as error:
                    logger().warning("cannot poll task %s: %s", task["ecs_task_id"], error)
                    continue
                if stopped is not None:
                    runner.events.append(on_stopped(task["ecs_task_id"], stopped.exit_code, stopped.reason))
        time.sleep(runner.config.poll_interval_s)


# --------------------------------------------------------------------------- health checks


def check_node(node_name: str, runner: Runner) -> HealthResult:
    """Run the backend's health check on a node and store the result and readings on the node row."""
    node = get_node(node_name)
    if node is None:
        raise LookupError(f"unknown node {node_name}")
    result = runner.backend.health_check(node)
    state_store.transition(
        _tables()[2], {"node_name": node_name}, None, None, status_attr="node_status",
        set={"health_status": result.status, "last_health_check": result.to_json(), "health_checked_at": now()},
    )
    logger().info("node %s health %s (%s): %s", node_name, result.status, result.method, result.reason)
    return result


def sweep_nodes(runner: Runner) -> dict[str, str]:
    """Scheduled check: each idle AVAILABLE node is checked (PENDING_HEALTHCHECK meanwhile, so no job takes
    it); unhealthy -> FAILED -> REBOOTING; REBOOTING nodes that are back -> AVAILABLE. Unknown stays in service."""
    outcome = {}
    for node in list_nodes(runner.config.cluster_name):
        name = node["node_name"]
        if node["node_status"] == NODE_REBOOTING:
            outcome[name] = "back: AVAILABLE" if node_back(runner, name) else "still rebooting"
            continue
        if node["node_status"] != NODE_AVAILABLE or not move_node(name, None, NODE_AVAILABLE, NODE_PENDING_HEALTHCHECK):
            continue
        result = runner.check(name)
        if result.status == UNHEALTHY:
            take_out_of_service(runner, name, None, NODE_PENDING_HEALTHCHECK)
            outcome[name] = f"unhealthy: {result.reason}"
        else:
            move_node(name, None, NODE_PENDING_HEALTHCHECK, NODE_AVAILABLE)
            outcome[name] = f"{result.status}: {result.reason}"
            if result.status != HEALTHY:
                logger().warning("node %s kept in service, health %s: %s", name, result.status, result.reason)
    return outcome
