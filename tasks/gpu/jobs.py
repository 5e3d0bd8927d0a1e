"""Seed 002: GPU jobs on nodes — the records and guarded transitions below the flow's steps.

Every status change is a guarded transition through ``tasks.core.state_store`` (expected current status), so a
duplicated or late task stop cannot start a second restart or revive a finished job, whoever sees it: the
job's watcher, the scheduled sweep, ``gpu stop`` or the reconciler. Numbers the seed stores as strings
(retry, num_nodes, node_index_in_job, job_num_nodes) are strings here too.

The steps (``flows/gpu.py`` runs them in the seed's order): ``launch_job`` (run), ``detect_failure``,
``isolate_failure`` + ``health_check_nodes`` (health check), ``reboot_unhealthy`` (reboot), ``restart_job``
(restart). A job in a step between two statuses (PENDING_HEALTHCHECK, PENDING_RESTART, RESTARTING, or
IN_PROGRESS while its tasks start) has an *owner* (the runner that moved it there); when the owner is gone
(its process died, its Prefect run ended, or the step has not moved for ``takeover_after_s``) the sweep takes
the job over with one guarded write and resumes the step: every step can be run again after a crash.
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tasks.core import state_store
from tasks.core.config import table_name
from tasks.core.errors import RefusedInput, Unavailable
from tasks.core.runtime import iso_ago, now_iso, prefect_ids, run_logger
from tasks.core.state_store import Condition
from tasks.gpu import keys, sealing
from tasks.gpu.backends import (
    BackendError,
    CommandRefused,
    ComputeBackend,
    TaskExit,
    TaskSpec,
    command_argv,
    make_backend,
    pid_alive,
)
from tasks.gpu.health import HEALTHY, UNHEALTHY, UNKNOWN, HealthResult

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
RUN_IDS = ("prefect_flow_run_id", "prefect_task_run_id")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
IB_DEVICES = re.compile(r"^[\^=]?[A-Za-z0-9_.:,-]{0,255}$")  # NCCL_IB_HCA's syntax: devices, ports, ^ and = prefixes
# why a task does not start: the backend, its command as given, or a row that is not as its launch sealed it
CANNOT_START = (BackendError, CommandRefused, sealing.SealBroken)


class NotEnoughNodes(Unavailable, RuntimeError):
    """Fewer AVAILABLE nodes than the job needs (and no waiting, or the wait timed out)."""


def _tables() -> tuple[str, str, str]:
    return table_name("ecs_task"), table_name("ecs_job"), table_name("ecs_node")


def _owned_by(job_id: str) -> Condition:
    return Condition("#owner = :owner", {"#owner": "job_id"}, {":owner": job_id})


@dataclass
class Runner:
    """What the steps need: the backend, the settings, hooks a flow may wrap as Prefect runs, and who we are."""

    backend: ComputeBackend
    config: Any  # blocks.gpu.GpuCompute
    health_check: Callable[[str], HealthResult] | None = None  # node_name -> result (stored on the node row)
    notify: Callable[[str], None] | None = None
    run_ended: Callable[[str], bool] | None = None  # Prefect flow run id -> whether it ended (flows pass one)
    events: list[dict[str, Any]] = field(default_factory=list)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def check(self, node_name: str) -> HealthResult:
        """Health-check the node with the configured step, else ``check_node``."""
        return (self.health_check or (lambda n: check_node(n, self)))(node_name)

    def alert(self, message: str) -> None:
        """Send ``message`` with the configured step, else ``notify``."""
        (self.notify or (lambda m: notify(m, self.config)))(message)

    @property
    def unknown_is_unhealthy(self) -> bool:
        """Whether an "unknown" verdict takes a node out of service: as configured, else only on ECS, whose
        nodes have GPUs (there "unknown" means a broken driver); a local slot has no GPU to find."""
        setting = self.config.unknown_is_unhealthy
        return self.backend.name == "ecs" if setting is None else bool(setting)

    def owner(self) -> tuple[dict[str, str], list[str]]:
        """(attributes, attributes to remove) that make this runner the owner of a job step or node claim."""
        ids = prefect_ids()
        attrs = {"owner_token": self.token, "owner_pid": str(os.getpid()), "owner_host": socket.gethostname(), **ids}
        return attrs, [k for k in RUN_IDS if k not in ids]

    def owner_gone(self, item: dict[str, Any]) -> bool:
        """Whether the owner of ``item`` can no longer move it: its process died (same host), its Prefect
        flow run ended, or it has not moved for ``takeover_after_s``. Never true for our own items."""
        if item.get("owner_token") == self.token:
            return False
        if item.get("owner_host") == socket.gethostname() and str(item.get("owner_pid", "")).isdigit():
            if not pid_alive(int(item["owner_pid"])):
                return True
        run_id = item.get("prefect_flow_run_id")
        if run_id and self.run_ended is not None and self.run_ended(str(run_id)):
            return True
        return str(item.get("updated_at", "")) < iso_ago(self.config.takeover_after_s)


def make_runner(config=None, **kwargs) -> Runner:
    """A Runner on the backend of ``config`` (default: the GpuCompute block)."""
    from blocks import load_config
    from blocks.gpu import GpuCompute

    config = config or load_config(GpuCompute)
    return Runner(make_backend(config), config, **kwargs)


def notify(message: str, config) -> None:
    """Send ``message`` through the configured notification block, else log it (tasks.core.notify)."""
    from tasks.core.notify import notify as send

    send("GPU job failed", message, config.notification_block or None)


# --------------------------------------------------------------------------- reads


def get_job(job_id: str) -> dict[str, Any] | None:
    """One job row by id, or None."""
    return state_store.get_item(_tables()[1], {"job_id": keys.gpu_job_id(job_id)})


def get_task(task_id: str) -> dict[str, Any] | None:
    """One task row by ECS task id, or None."""
    return state_store.get_item(_tables()[0], {"ecs_task_id": keys.gpu_task_id(task_id)})


def get_node(node_name: str) -> dict[str, Any] | None:
    """One node row by name, or None."""
    return state_store.get_item(_tables()[2], {"node_name": keys.gpu_node_name(node_name)})


def list_nodes(cluster_name: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
    """Nodes (of a cluster, in a status), sorted by name. The seed has no node index: a small table's scan."""

    def keep(item: dict[str, Any]) -> bool:
        """Whether the node matches the cluster and status asked for."""
        return (cluster_name is None or item.get("cluster_name") == cluster_name) and (
            status is None or item.get("node_status") == status
        )

    return sorted(state_store.scan_all(_tables()[2], keep=keep), key=lambda n: n["node_name"])


def list_jobs(status: str | tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Jobs (in a status or any of several), oldest first by ``created_at``."""
    wanted = (status,) if isinstance(status, str) else status
    keep = None if wanted is None else (lambda item: item.get("job_status") in wanted)
    return sorted(state_store.scan_all(_tables()[1], keep=keep), key=lambda j: j.get("created_at", ""))


def job_tasks(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The tasks of the job's current attempt (the job row lists their ids)."""
    return [t for t in (get_task(i) for i in job.get("submitted_ecs_task_ids") or []) if t is not None]


# --------------------------------------------------------------------------- nodes


def register_nodes(backend: ComputeBackend, cluster_name: str) -> dict[str, str]:
    """Create a node row for every node the backend knows: AVAILABLE, or UNKNOWN when its instance cannot be
    described (no job claims it). Existing rows: an idle node that cannot be described any more -> UNKNOWN, an
    UNKNOWN one described again -> AVAILABLE with its new address; others are left alone."""
    stamp = now_iso()
    items = [
        {
            **node,
            "cluster_name": cluster_name,
            "created_at": stamp,
            "updated_at": stamp,
            "node_status": NODE_UNKNOWN if node.get("unknown_reason") else NODE_AVAILABLE,
        }
        for node in backend.discover_nodes()
    ]
    results = state_store.create_many_if_absent(_tables()[2], items, ["node_name"])
    outcome = {}
    for item, result in zip(items, results):
        name, reason = item["node_name"], item.get("unknown_reason")
        if result.applied:
            outcome[name] = f"registered UNKNOWN: {reason}" if reason else "registered"
        elif reason and move_node(name, None, NODE_AVAILABLE, NODE_UNKNOWN, unknown_reason=reason):
            outcome[name] = f"UNKNOWN: {reason}"
        elif (
            not reason
            and state_store.transition(
                _tables()[2],
                {"node_name": name},
                NODE_UNKNOWN,
                NODE_AVAILABLE,
                status_attr="node_status",
                set={"ip": item["ip"], "ibdev": item["ibdev"], "updated_at": stamp},
                remove=["unknown_reason"],
            ).applied
        ):
            outcome[name] = "described again: AVAILABLE"
        else:
            outcome[name] = f"exists ({(result.item or {}).get('node_status')})"
    return outcome


def claim_node(node_name: str, job_id: str, runner: Runner | None = None) -> bool:
    """AVAILABLE -> ASSIGNED for ``job_id`` (owned by ``runner`` until the job row holds it); False if taken."""
    attrs, remove = runner.owner() if runner else ({}, [])
    return state_store.transition(
        _tables()[2],
        {"node_name": node_name},
        NODE_AVAILABLE,
        NODE_ASSIGNED,
        status_attr="node_status",
        set={"job_id": job_id, "updated_at": now_iso(), **attrs},
        remove=remove,
    ).applied


def move_node(node_name: str, job_id: str | None, expected, new: str, **extra: Any) -> bool:
    """A guarded node transition; with ``job_id``, only while the node is still that job's."""
    attrs = {"updated_at": now_iso(), **extra}
    remove = ["job_id"] if new == NODE_AVAILABLE else []
    return state_store.transition(
        _tables()[2],
        {"node_name": node_name},
        expected,
        new,
        status_attr="node_status",
        set=attrs,
        remove=remove,
        condition=_owned_by(job_id) if job_id else None,
    ).applied


def release_nodes(job_id: str, node_names, expected=NODE_HELD) -> list[str]:
    """Give the job's held nodes back (-> AVAILABLE); returns the names released."""
    return [n for n in node_names if move_node(n, job_id, expected, NODE_AVAILABLE)]


def node_back(runner: Runner, node_name: str) -> bool:
    """REBOOTING -> AVAILABLE once the backend says the node is up again."""
    node = get_node(node_name)
    if node is None or node["node_status"] != NODE_REBOOTING:
        return False
    try:
        if not runner.backend.node_ready(node):
            return False
    except BackendError as error:
        run_logger(__name__).warning("cannot ask whether node %s is back: %s", node_name, error)
        return False
    return move_node(node_name, None, NODE_REBOOTING, NODE_AVAILABLE)


def bring_back_nodes(runner: Runner) -> list[str]:
    """Every REBOOTING node of the cluster that the backend says is up again -> AVAILABLE; their names."""
    return [
        n["node_name"]
        for n in list_nodes(runner.config.cluster_name, NODE_REBOOTING)
        if node_back(runner, n["node_name"])
    ]


def assign_nodes(
    job_id: str,
    num_nodes: int,
    cluster_name: str,
    nodes: list[str] | None = None,
    wait: bool = False,
    timeout_s: float = 300.0,
    poll_s: float = 0.5,
    runner: Runner | None = None,
) -> list[str]:
    """Claim ``num_nodes`` AVAILABLE nodes for the job, all or none (conditional per node).

    With a ``runner``, rebooted nodes that are up again count as AVAILABLE (checked before each round). Not
    enough: release what was claimed, then wait and try again (``wait``) or raise NotEnoughNodes.
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
        if runner is not None:
            bring_back_nodes(runner)
        candidates = nodes or [n["node_name"] for n in list_nodes(cluster_name, NODE_AVAILABLE)]
        claimed: list[str] = []
        for name in candidates:
            if len(claimed) == num_nodes:
                break
            if claim_node(name, job_id, runner):
                claimed.append(name)
        if len(claimed) == num_nodes:
            return claimed
        release_nodes(job_id, claimed, NODE_ASSIGNED)
        if not wait or time.monotonic() >= deadline:
            free = len(list_nodes(cluster_name, NODE_AVAILABLE))
            waited = f" after waiting {timeout_s:g} s" if wait else " (node_wait='fail')"
            raise NotEnoughNodes(f"job needs {num_nodes} nodes, {free} AVAILABLE in cluster {cluster_name!r}{waited}")
        time.sleep(poll_s * (0.5 + random.random()))


# --------------------------------------------------------------------------- run: jobs and tasks


def check_env(env: dict[str, Any] | None) -> dict[str, str]:
    """The job's own variables, validated: names like ``[A-Za-z_][A-Za-z0-9_]*``, values text."""
    env = env or {}
    if not isinstance(env, dict):
        raise ValueError(f"env must be a mapping of variable names to values, got {type(env).__name__}")
    bad = sorted(str(k) for k in env if not isinstance(k, str) or not ENV_NAME.match(k))
    if bad:
        raise ValueError(f"invalid environment variable name(s) {bad}: use letters, digits and _ (not first a digit)")
    wrong = sorted(k for k, v in env.items() if not isinstance(v, (str, int, float)) or isinstance(v, bool))
    if wrong:
        raise ValueError(f"environment variable(s) {wrong} must have text values")
    return {k: str(v) for k, v in env.items()}


def create_failed_job(job_id: str, cluster_name: str, num_nodes: int, command: str, reason: str) -> dict[str, Any]:
    """A job that never started: a FAILED row with the reason (kept if the row exists already)."""
    stamp = now_iso()
    item = {
        "job_id": job_id,
        "job_timestamp": stamp,
        "cluster_name": cluster_name,
        "num_nodes": str(num_nodes),
        "assigned_nodes": [],
        "submitted_container_inst_ids": [],
        "submitted_ecs_task_ids": [],
        "created_at": stamp,
        "updated_at": stamp,
        "retry": "0",
        "job_status": JOB_FAILED,
        "command": command,
        "failure_reason": reason,
        **prefect_ids(),
    }
    result = state_store.create_if_absent(_tables()[1], item, ["job_id"])
    return result.item if result.item else item


def rendezvous_env(nodes: list[dict[str, Any]], index: int, master_port: int | str) -> dict[str, str]:
    """The variables a task of a multi-node job needs to find the others (torch.distributed's names): node 0's
    address and the attempt's port, world size, this node's rank, every peer's address in rank order, and the
    node's InfiniBand device for NCCL (none: NCCL_IB_DISABLE, NCCL uses sockets)."""
    missing = [n["node_name"] for n in nodes if not n.get("ip")]
    if missing and len(nodes) > 1:
        raise BackendError(f"node(s) {missing} have no address for the job's rendezvous")
    # a node row is data: its address and device reach every task's env only as an address and a device name
    odd = [n["node_name"] for n in nodes if n.get("ip") and not _is_address(n["ip"])]
    odd += [n["node_name"] for n in nodes if not IB_DEVICES.match(str(n.get("ibdev") or ""))]
    if odd:
        raise BackendError(f"node(s) {sorted(set(odd))} have an address or InfiniBand device that is not one")
    ibdev = nodes[index].get("ibdev") or "none"
    return {
        "MASTER_ADDR": nodes[0].get("ip", ""),
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(len(nodes)),
        "RANK": str(index),
        "NODE_RANK": str(index),
        "PIPELINES_PEERS": ",".join(n.get("ip", "") for n in nodes),
        **({"NCCL_IB_DISABLE": "1"} if ibdev == "none" else {"NCCL_IB_HCA": ibdev}),
    }


def _is_address(value: Any) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def node_rows(node_names: list[str]) -> list[dict[str, Any]]:
    """The node rows of ``node_names``, in that order; LookupError if one is missing."""
    found = {
        n["node_name"]: n for n in state_store.get_many(_tables()[2], [{"node_name": name} for name in node_names])
    }
    missing = [name for name in node_names if name not in found]
    if missing:
        raise LookupError(f"unknown node(s) {missing}")
    return [found[name] for name in node_names]


def with_master_port(runner: Runner, job_id: str, expected: str) -> dict[str, Any]:
    """The job row with a rendezvous port for its current retry: chosen once per attempt (on node 0) and stored
    with a conditional write, so every task of the attempt, and a start resumed after a crash, gets the same."""
    job = get_job(job_id)
    if job.get("master_port_retry") == job["retry"] or job["job_status"] != expected:
        return job
    port = runner.backend.master_port(get_node(job["assigned_nodes"][0]), int(job["retry"]))
    moved = state_store.transition(
        _tables()[1],
        {"job_id": job_id},
        expected,
        None,
        status_attr="job_status",
        set={"master_port": str(port), "master_port_retry": job["retry"], "updated_at": now_iso()},
        condition=Condition(
            "#r = :r AND (attribute_not_exists(#pr) OR #pr <> :r)",
            {"#r": "retry", "#pr": "master_port_retry"},
            {":r": job["retry"]},
        ),
    )
    return moved.item if moved.applied else get_job(job_id)  # else another starter chose it, or the job moved on


def start_one_task(runner: Runner, job: dict[str, Any], node_name: str, index: int, retry: int) -> dict[str, Any]:
    """Start the job's task on one node, with the job's rendezvous, and record it IN_PROGRESS (node ASSIGNED ->
    IN_PROGRESS)."""
    nodes = node_rows(job["assigned_nodes"])
    node = nodes[index]
    spec = TaskSpec(
        job["job_id"],
        retry,
        node,
        index,
        int(job["num_nodes"]),
        job["command"],
        dict(job.get("env") or {}),
        rendezvous_env(nodes, index, job.get("master_port", "")),
    )
    started = runner.backend.start_task(spec)
    stamp = now_iso()
    item = {
        "ecs_task_id": started.task_id,
        "node_name": node_name,
        "node_index_in_job": str(index),
        "job_id": job["job_id"],
        "job_timestamp": job["job_timestamp"],
        "job_num_nodes": str(job["num_nodes"]),
        "task_def_arn": started.task_def_arn,
        "task_def_name": started.task_def_name,
        "task_def_revision": started.task_def_revision,
        "cluster_name": job["cluster_name"],
        "container_inst_id": node.get("container_instance_id", ""),
        "container_instance_arn": node.get("container_instance_arn", ""),
        "retry": str(retry),
        "task_status": TASK_IN_PROGRESS,
        "created_at": stamp,
        "updated_at": stamp,
        **started.extra,
        **prefect_ids(),
    }
    result = state_store.create_if_absent(_tables()[0], item, ["ecs_task_id"])
    move_node(node_name, job["job_id"], NODE_ASSIGNED, NODE_IN_PROGRESS)
    return item if result.applied else result.item


def terminate_tasks(runner: Runner, task_ids, reason: str) -> dict[str, dict[str, Any]]:
    """IN_PROGRESS -> TERMINATED (stopped by the job, not failed), then stop; returns the tasks that had
    already ended (with their rows)."""
    ended = {}
    task_ids = list(task_ids)
    results = state_store.transition_many(  # one round trip for all the job's tasks
        _tables()[0],
        [
            (
                {"ecs_task_id": t},
                TASK_IN_PROGRESS,
                TASK_TERMINATED,
                {"stop_reason": reason, "terminated_by": "job", "updated_at": now_iso()},
            )
            for t in task_ids
        ],
        status_attr="task_status",
    )
    for task_id, result in zip(task_ids, results):
        if result.applied:
            stop_task(runner, task_id, reason)
        elif result.item is not None:
            ended[task_id] = result.item
    return ended


def stop_task(runner: Runner, task_id: str, reason: str) -> None:
    """Ask the backend to stop a task whose record says it ended; a failure is logged (the sweep retries)."""
    try:
        runner.backend.stop(task_id, reason)
    except BackendError as error:
        run_logger(__name__).warning("could not stop task %s: %s", task_id, error)


def start_tasks(runner: Runner, job_id: str, expected: str, start_task=None) -> dict[str, Any]:
    """Start one task per assigned node for the job's current retry, then record their ids on the job.

    ``expected`` is the job status this attempt starts from (IN_PROGRESS or RESTARTING). Run again after a
    crash it resumes: the backend reuses a task of this attempt that was started already. A task that cannot
    start fails the job with the reason. If the job ended meanwhile, the tasks are stopped again.
    """
    start_task = start_task or start_one_task
    job = with_master_port(runner, job_id, expected)
    retry = int(job["retry"])
    started: list[dict[str, Any]] = []
    try:
        sealing.check_job(job, runner.backend.name)  # what runs is what the launch sealed, read where it starts
        for index, node_name in enumerate(job["assigned_nodes"]):
            started.append(start_task(runner, job, node_name, index, retry))
    except CANNOT_START as error:
        reason = f"task cannot start: {error}"
        terminate_tasks(runner, [t["ecs_task_id"] for t in started], reason)
        fail_job(runner, job_id, expected, reason, notify_user=False)
        raise
    result = state_store.transition(
        _tables()[1],
        {"job_id": job_id},
        expected,
        JOB_IN_PROGRESS,
        status_attr="job_status",
        set={
            "submitted_ecs_task_ids": [t["ecs_task_id"] for t in started],
            "submitted_container_inst_ids": [t["container_inst_id"] for t in started],
            "updated_at": now_iso(),
            **prefect_ids(),
        },
        condition=None
        if expected != JOB_IN_PROGRESS
        else Condition("size(#ids) = :zero", {"#ids": "submitted_ecs_task_ids"}, {":zero": 0}),
    )
    if not result.applied and result.item is not None:  # ended, or someone else finished the start: undo ours
        theirs = (
            set(result.item.get("submitted_ecs_task_ids") or []) if result.item["job_status"] in JOB_ACTIVE else set()
        )
        terminate_tasks(
            runner,
            [t["ecs_task_id"] for t in started if t["ecs_task_id"] not in theirs],
            f"job is {result.item.get('job_status')}",
        )
        if result.item["job_status"] in JOB_TERMINAL:
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
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run: assign nodes, create the job IN_PROGRESS, start one task per node. Bad input: a FAILED job row."""
    config = runner.config
    job_id = keys.gpu_job_id(job_id)
    if get_job(job_id) is not None:
        raise ValueError(f"job {job_id} exists already (job ids are used once)")
    wait = config.node_wait == "wait" if wait is None else wait
    timeout_s = config.node_wait_timeout_s if timeout_s is None else timeout_s
    try:
        env = check_env(env)
        command_argv(command)  # a command that cannot parse is refused before any node is held or waited for
        what_runs = {"command": command, "env": env, "num_nodes": str(num_nodes), "cluster_name": config.cluster_name}
        what_runs["backend"] = runner.backend.name
        launch_seal = sealing.seal_job({"job_id": job_id, **what_runs})  # no launch key: nothing is held or written
        assigned = assign_nodes(
            job_id, num_nodes, config.cluster_name, nodes, wait, timeout_s, config.poll_interval_s, runner
        )
    except (NotEnoughNodes, LookupError, ValueError) as error:
        create_failed_job(job_id, config.cluster_name, num_nodes, command, str(error))
        raise
    stamp = now_iso()
    owner, _ = runner.owner()
    item = {
        "job_id": job_id,
        "job_timestamp": stamp,
        "assigned_nodes": assigned,
        "submitted_container_inst_ids": [],
        "submitted_ecs_task_ids": [],
        "created_at": stamp,
        "updated_at": stamp,
        "retry": "0",
        "job_status": JOB_IN_PROGRESS,
        **what_runs,
        **launch_seal,
        "max_retries": str(config.max_retries),
        **owner,
    }
    if not state_store.create_if_absent(_tables()[1], item, ["job_id"]).applied:
        release_nodes(job_id, assigned)
        raise ValueError(f"job {job_id} exists already (job ids are used once)")
    run_logger(__name__).info("job %s: nodes %s assigned", job_id, assigned)
    return start_tasks(runner, job_id, JOB_IN_PROGRESS, start_task)


def fail_job(runner: Runner, job_id: str, expected, reason: str, notify_user: bool = True) -> bool:
    """Job ``expected`` -> FAILED with the reason; its held nodes go back AVAILABLE; optionally notify."""
    result = state_store.transition(
        _tables()[1],
        {"job_id": job_id},
        expected,
        JOB_FAILED,
        status_attr="job_status",
        set={"failure_reason": reason, "updated_at": now_iso()},
    )
    if result.applied:
        release_nodes(job_id, result.item.get("assigned_nodes") or [])
        run_logger(__name__).warning("job %s FAILED: %s", job_id, reason)
        if notify_user:
            runner.alert(f"GPU job {job_id} FAILED: {reason}")
    return result.applied


def seal_holds(runner: Runner, job: dict[str, Any]) -> bool:
    """Whether the job row is as its launch sealed it (``tasks.gpu.sealing``). If not, it is refused input: the job
    FAILED with the reason, its nodes released and the tasks started for it stopped, and nothing of it runs again
    (only tasks whose own row names this job: a forged row may list another job's tasks)."""
    try:
        sealing.check_job(job, runner.backend.name)
    except sealing.SealBroken as error:
        if fail_job(runner, job["job_id"], job["job_status"], str(error)):
            try:
                mine = [t["ecs_task_id"] for t in job_tasks(job) if t.get("job_id") == job["job_id"]]
            except RefusedInput:  # a task id no launch made: none of them is this job's
                mine = []
            terminate_tasks(runner, mine, f"job refused: {error}")
        return False
    return True


# --------------------------------------------------------------------------- detect failure


def record_stop(task_id: str, exit_code: int | None, reason: str, **extra: Any) -> state_store.WriteResult:
    """Task IN_PROGRESS -> COMPLETE (exit 0) or TERMINATED, with its exit code: the one guarded write of a stop."""
    ok = exit_code == 0
    return state_store.transition(
        _tables()[0],
        {"ecs_task_id": keys.gpu_task_id(task_id)},
        TASK_IN_PROGRESS,
        TASK_COMPLETE if ok else TASK_TERMINATED,
        status_attr="task_status",
        set={"exit_code": str(exit_code), "stop_reason": reason, "updated_at": now_iso(), **extra},
    )


def handle_task_stopped(task_id: str, exit_code: int | None, reason: str, runner: Runner) -> dict[str, Any]:
    """The seed's ECS task-stop event, idempotent: only the first delivery of a stop moves anything.

    exit 0: the task COMPLETE, and the job COMPLETE when all its tasks are. Otherwise: the task TERMINATED,
    and if the job was IN_PROGRESS with this task (one winner), the job PENDING_HEALTHCHECK, owned by
    ``runner`` (the flow's next steps: health check, reboot, restart).
    """
    task_id = keys.gpu_task_id(task_id)
    result = record_stop(task_id, exit_code, reason)
    if not result.applied:
        status = result.item.get("task_status") if result.item else None
        return {"action": "unknown_task" if status is None else "duplicate", "task_id": task_id, "task_status": status}
    task = result.item
    if exit_code == 0:
        return complete_if_done(task["job_id"], task_id)
    job = begin_recovery(runner, task)
    return {"action": "late" if job is None else "recovery_started", "task_id": task_id, "job_id": task["job_id"]}


def complete_if_done(job_id: str, task_id: str | None = None) -> dict[str, Any]:
    """Job IN_PROGRESS -> COMPLETE once every task of the current attempt is COMPLETE; nodes AVAILABLE."""
    job = get_job(job_id)
    ids = job.get("submitted_ecs_task_ids") or []
    tasks = job_tasks(job)
    if not ids or len(tasks) != len(ids) or not all(t["task_status"] == TASK_COMPLETE for t in tasks):
        return {"action": "task_complete", "task_id": task_id, "job_id": job_id}
    done = state_store.transition(
        _tables()[1],
        {"job_id": job_id},
        JOB_IN_PROGRESS,
        JOB_COMPLETE,
        status_attr="job_status",
        set={"updated_at": now_iso()},
        condition=Condition("contains(#ids, :tid)", {"#ids": "submitted_ecs_task_ids"}, {":tid": ids[0]}),
    )
    if not done.applied:
        return {"action": "late", "task_id": task_id, "job_id": job_id}
    release_nodes(job_id, job["assigned_nodes"], NODE_HELD)
    run_logger(__name__).info("job %s COMPLETE", job_id)
    return {"action": "job_complete", "task_id": task_id, "job_id": job_id}


def _failed(task: dict[str, Any]) -> bool:
    """A task that ended TERMINATED on its own (not stopped by its job)."""
    return task.get("task_status") == TASK_TERMINATED and task.get("terminated_by") != "job"


def detect_failure(runner: Runner, job: dict[str, Any]) -> dict[str, Any] | None:
    """Detect failure: ask the backend about each running task of an IN_PROGRESS job and record the stops.

    Returns the job once a task failed and this runner moved the job to PENDING_HEALTHCHECK (it drives the
    recovery); None otherwise (still running, COMPLETE, or someone else handles the failure). A stop recorded
    by someone who died before acting on it (watcher, reconciler) is acted on here.
    """
    if job["job_status"] != JOB_IN_PROGRESS:
        return None
    for task in job_tasks(job):
        if task["task_status"] != TASK_IN_PROGRESS:
            continue
        try:
            stopped = runner.backend.poll(task["ecs_task_id"])
        except BackendError as error:
            run_logger(__name__).warning("cannot poll task %s: %s", task["ecs_task_id"], error)
            continue
        if stopped is not None:
            runner.events.append(handle_stop_seen(runner, task["ecs_task_id"], stopped))
    tasks = job_tasks(job)
    failed = [t for t in tasks if _failed(t)]
    if failed:
        return begin_recovery(runner, failed[0])
    if tasks and all(t["task_status"] == TASK_COMPLETE for t in tasks):
        complete_if_done(job["job_id"])
    return None


def handle_stop_seen(runner: Runner, task_id: str, stopped: TaskExit) -> dict[str, Any]:
    """Record a stop the backend reported (the recovery itself is the caller's next step)."""
    result = record_stop(task_id, stopped.exit_code, stopped.reason)
    run_logger(__name__).info(
        "task %s stopped: %s (%s)", task_id, stopped.reason, "recorded" if result.applied else "seen before"
    )
    return {
        "action": "stop_recorded" if result.applied else "duplicate",
        "task_id": task_id,
        "exit_code": stopped.exit_code,
    }


def begin_recovery(runner: Runner, task: dict[str, Any]) -> dict[str, Any] | None:
    """Job IN_PROGRESS -> PENDING_HEALTHCHECK for a failed task of its current attempt, owned by ``runner``;
    None when the job moved on (another failure is handled, or it ended): exactly one recovery per attempt."""
    owner, remove = runner.owner()
    moved = state_store.transition(
        _tables()[1],
        {"job_id": task["job_id"]},
        JOB_IN_PROGRESS,
        JOB_PENDING_HEALTHCHECK,
        status_attr="job_status",
        set={
            "updated_at": now_iso(),
            "failed_task_id": task["ecs_task_id"],
            **owner,
            "last_failure": f"task {task['ecs_task_id']} on {task['node_name']}: {task.get('stop_reason')}",
        },
        remove=remove,
        condition=Condition("contains(#ids, :tid)", {"#ids": "submitted_ecs_task_ids"}, {":tid": task["ecs_task_id"]}),
    )
    if moved.applied:
        run_logger(__name__).warning(
            "job %s: task %s failed (%s)", task["job_id"], task["ecs_task_id"], task.get("stop_reason")
        )
    return moved.item if moved.applied else None


def isolate_failure(runner: Runner, job: dict[str, Any]) -> list[str]:
    """Stop the job's other tasks; its failed nodes -> PENDING, the others -> ASSIGNED. Returns the failed nodes.

    Safe to run again (a resumed recovery): nodes already further on are left where they are.
    """
    job_id, failed_id = job["job_id"], job["failed_task_id"]
    others = [t for t in job["submitted_ecs_task_ids"] if t != failed_id]
    terminate_tasks(runner, others, f"stopped: task {failed_id} of the job failed")
    failed_nodes = [t["node_name"] for t in job_tasks(job) if _failed(t)]
    for name in job["assigned_nodes"]:
        if name in failed_nodes:
            move_node(name, job_id, (NODE_IN_PROGRESS, NODE_ASSIGNED), NODE_PENDING)
        else:
            move_node(name, job_id, (NODE_IN_PROGRESS,), NODE_ASSIGNED)
    return failed_nodes


# --------------------------------------------------------------------------- health check and reboot


def health_check_nodes(runner: Runner, job: dict[str, Any], failed_nodes: list[str]) -> dict[str, HealthResult | None]:
    """Health check: each failed node still the job's -> PENDING_HEALTHCHECK and checked. A node already out of
    service or no longer the job's (a resumed recovery) gets None: it must be replaced."""
    verdicts: dict[str, HealthResult | None] = {}
    for name in failed_nodes:
        move_node(name, job["job_id"], NODE_PENDING, NODE_PENDING_HEALTHCHECK)
        node = get_node(name)
        mine = node is not None and node.get("job_id") == job["job_id"]
        verdicts[name] = runner.check(name) if mine and node["node_status"] == NODE_PENDING_HEALTHCHECK else None
    return verdicts


def _unhealthy(runner: Runner, result: HealthResult | None) -> bool:
    return result is None or result.status == UNHEALTHY or (result.status == UNKNOWN and runner.unknown_is_unhealthy)


def reboot_unhealthy(runner: Runner, job: dict[str, Any], verdicts: dict[str, HealthResult | None]) -> list[str]:
    """Reboot: unhealthy nodes FAILED -> REBOOTING and the job PENDING_RESTART (returns them); all healthy:
    the application failed (job FAILED, nodes AVAILABLE, returns []); retries spent: job FAILED."""
    job_id, config = job["job_id"], runner.config
    summary = {n: "out of service" if r is None else f"{r.status}: {r.reason}" for n, r in verdicts.items()}
    bad = [n for n, r in verdicts.items() if _unhealthy(runner, r)]
    if not bad:
        fail_job(
            runner,
            job_id,
            JOB_PENDING_HEALTHCHECK,
            f"application failure: task {job['failed_task_id']} {job.get('last_failure', '').split(': ', 1)[-1]}; "
            f"node(s) healthy {summary}",
        )
        return []
    for name in verdicts:
        if name not in bad:
            move_node(name, job_id, NODE_PENDING_HEALTHCHECK, NODE_ASSIGNED)
    for name in bad:
        take_out_of_service(runner, name, job_id, (NODE_PENDING_HEALTHCHECK, NODE_FAILED))
    retry = int(job["retry"])
    if retry >= config.max_retries:
        fail_job(
            runner,
            job_id,
            JOB_PENDING_HEALTHCHECK,
            f"retries exhausted (retry {retry} of max {config.max_retries}); unhealthy node(s) {summary}",
        )
        return []
    moved = state_store.transition(
        _tables()[1],
        {"job_id": job_id},
        JOB_PENDING_HEALTHCHECK,
        JOB_PENDING_RESTART,
        status_attr="job_status",
        set={"updated_at": now_iso(), "pending_restart_at": now_iso(), "bad_nodes": bad, "health": summary},
        condition=Condition("#t = :t", {"#t": "owner_token"}, {":t": runner.token}),
    )
    return bad if moved.applied else []


def take_out_of_service(runner: Runner, node_name: str, job_id: str | None, expected) -> None:
    """Unhealthy node: ``expected`` -> FAILED, backend reboot, FAILED -> REBOOTING (the job lets go of it)."""
    if not move_node(node_name, job_id, expected, NODE_FAILED):
        return
    try:
        runner.backend.reboot(get_node(node_name))
    except BackendError as error:
        run_logger(__name__).error(
            "node %s FAILED and could not be rebooted (the sweep tries again): %s", node_name, error
        )
        return
    move_node(node_name, None, NODE_FAILED, NODE_REBOOTING, rebooted_at=now_iso())
    run_logger(__name__).warning("node %s unhealthy: FAILED -> REBOOTING", node_name)


# --------------------------------------------------------------------------- restart


def restart_job(runner: Runner, job: dict[str, Any], wait: bool = True) -> dict[str, Any]:
    """Restart a PENDING_RESTART job: replace each bad node by a spare (or the rebooted node once it is back),
    then RESTARTING with retry + 1 and new tasks -> IN_PROGRESS.

    ``wait``: poll until ``node_wait_timeout_s`` (the job's own flow); else one try (the sweep comes back).
    """
    config, job_id = runner.config, job["job_id"]
    if not seal_holds(runner, job):  # FAILED before it claims a replacement node
        return {"action": "restart_refused", "job_id": job_id, "reason": get_job(job_id).get("failure_reason")}
    bad_nodes = list(job.get("bad_nodes") or [])
    lineup = list(job["assigned_nodes"])
    missing = [i for i, n in enumerate(lineup) if n in bad_nodes]
    deadline = time.monotonic() + config.node_wait_timeout_s
    while missing:
        current = get_job(job_id)
        if current["job_status"] != JOB_PENDING_RESTART:  # stopped meanwhile
            return {"action": "restart_abandoned", "job_id": job_id, "job_status": current["job_status"]}
        bring_back_nodes(runner)
        # nodes this job claimed before a crash come first, then spares, then the rebooted nodes
        mine = [
            n["node_name"]
            for n in list_nodes(config.cluster_name, NODE_ASSIGNED)
            if n.get("job_id") == job_id and n["node_name"] not in lineup
        ]
        available = [n["node_name"] for n in list_nodes(config.cluster_name, NODE_AVAILABLE)]
        spares = [n for n in available if n not in lineup] + [n for n in bad_nodes if n in available]
        for name in mine + spares:
            if missing and (name in mine or claim_node(name, job_id, runner)):
                lineup[missing.pop(0)] = name
        if not missing:
            break
        waited_out = str(current.get("pending_restart_at", "")) < iso_ago(config.node_wait_timeout_s)
        if (wait and time.monotonic() >= deadline) or (not wait and waited_out):
            fail_job(
                runner, job_id, JOB_PENDING_RESTART, f"no replacement node within {config.node_wait_timeout_s:g} s"
            )
            release_nodes(job_id, lineup)
            return {"action": "restart_timed_out", "job_id": job_id}
        if not wait:
            release_nodes(job_id, [n for i, n in enumerate(lineup) if n not in job["assigned_nodes"]], NODE_ASSIGNED)
            return {"action": "waiting_for_nodes", "job_id": job_id}
        time.sleep(min(config.poll_interval_s, 0.5))
    retry = int(job["retry"]) + 1
    moved = state_store.transition(
        _tables()[1],
        {"job_id": job_id},
        JOB_PENDING_RESTART,
        JOB_RESTARTING,
        status_attr="job_status",
        set={"retry": str(retry), "assigned_nodes": lineup, "updated_at": now_iso(), **prefect_ids()},
        condition=Condition("#t = :t", {"#t": "owner_token"}, {":t": runner.token}),
    )
    if not moved.applied:
        if moved.item is None or moved.item["job_status"] in JOB_TERMINAL:
            release_nodes(job_id, lineup)
        return {"action": "restart_abandoned", "job_id": job_id}
    run_logger(__name__).info("job %s RESTARTING (retry %d) on %s", job_id, retry, lineup)
    return resume_start(runner, moved.item) | {"retry": retry, "nodes": lineup}


def resume_start(runner: Runner, job: dict[str, Any], start_task=None) -> dict[str, Any]:
    """Start the tasks of a RESTARTING job (or of an IN_PROGRESS job whose start was cut short) -> IN_PROGRESS."""
    expected = JOB_RESTARTING if job["job_status"] == JOB_RESTARTING else JOB_IN_PROGRESS
    try:
        started = start_tasks(runner, job["job_id"], expected, start_task)
    except CANNOT_START as error:
        return {"action": "restart_failed", "job_id": job["job_id"], "reason": str(error)}
    return {
        "action": "restarted" if expected == JOB_RESTARTING else "started",
        "job_id": job["job_id"],
        "job_status": started.get("job_status"),
    }


# --------------------------------------------------------------------------- owners, takeover, user stop


def needs_owner(job: dict[str, Any]) -> bool:
    """Whether the job is between two statuses (a step someone is running), not just running or ended."""
    status = job["job_status"]
    return status in (JOB_PENDING_HEALTHCHECK, JOB_PENDING_RESTART, JOB_RESTARTING) or (
        status == JOB_IN_PROGRESS and not job.get("submitted_ecs_task_ids")
    )


def take_over(runner: Runner, job: dict[str, Any]) -> dict[str, Any] | None:
    """Become the owner of a job step whose owner is gone: one guarded write (status and old owner unchanged),
    so of two sweeps one resumes it. Returns the job row, or None (not gone, or someone else took it)."""
    if job.get("owner_token") == runner.token:
        return job
    if not runner.owner_gone(job):
        return None
    owner, remove = runner.owner()
    old = job.get("owner_token")
    condition = (
        Condition("#t = :t", {"#t": "owner_token"}, {":t": old})
        if old
        else Condition("attribute_not_exists(#t)", {"#t": "owner_token"}, {})
    )
    moved = state_store.transition(
        _tables()[1],
        {"job_id": job["job_id"]},
        job["job_status"],
        None,
        status_attr="job_status",
        set={**owner, "updated_at": now_iso(), "taken_over_at": now_iso()},
        remove=remove,
        condition=condition,
    )
    if moved.applied:
        run_logger(__name__).warning("job %s: its %s step was abandoned; resuming it", job["job_id"], job["job_status"])
    return moved.item if moved.applied else None


def user_stop(runner: Runner, job_id: str, reason: str = "stopped by user") -> bool:
    """Job (any active status) -> USER_STOPPED; its tasks TERMINATED and stopped; its nodes AVAILABLE."""
    result = state_store.transition(
        _tables()[1],
        {"job_id": job_id},
        JOB_ACTIVE,
        JOB_USER_STOPPED,
        status_attr="job_status",
        set={"stop_reason": reason, "stop_requested": "true", "stop_requested_at": now_iso(), "updated_at": now_iso()},
    )
    if not result.applied:
        return False
    job = result.item
    terminate_tasks(runner, job.get("submitted_ecs_task_ids") or [], reason)
    release_nodes(job_id, job.get("assigned_nodes") or [])
    run_logger(__name__).info("job %s USER_STOPPED", job_id)
    return True


def stop_job(runner: Runner, job_id: str, reason: str = "stopped by user") -> dict[str, Any]:
    """``gpu stop``: end an active job USER_STOPPED now (no watcher needed); LookupError / ValueError otherwise."""
    job_id = keys.gpu_job_id(job_id)
    if user_stop(runner, job_id, reason):
        return get_job(job_id)
    job = get_job(job_id)
    if job is None:
        raise LookupError(f"no job {job_id}")
    raise ValueError(f"job {job_id} is {job['job_status']}: nothing to stop")


# --------------------------------------------------------------------------- health checks and stranded nodes


def check_node(node_name: str, runner: Runner) -> HealthResult:
    """Run the backend's health check on a node and store the result and readings on the node row."""
    node = get_node(node_name)
    if node is None:
        raise LookupError(f"unknown node {node_name}")
    result = runner.backend.health_check(node)
    state_store.transition(
        _tables()[2],
        {"node_name": node_name},
        None,
        None,
        status_attr="node_status",
        set={"health_status": result.status, "last_health_check": result.to_json(), "health_checked_at": now_iso()},
    )
    run_logger(__name__).info("node %s health %s (%s): %s", node_name, result.status, result.method, result.reason)
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
        owner, _ = runner.owner()
        if node["node_status"] != NODE_AVAILABLE or not move_node(
            name, None, NODE_AVAILABLE, NODE_PENDING_HEALTHCHECK, **owner
        ):
            continue
        result = runner.check(name)
        if result.status == UNHEALTHY:
            take_out_of_service(runner, name, None, NODE_PENDING_HEALTHCHECK)
            outcome[name] = f"unhealthy: {result.reason}"
        else:
            move_node(name, None, NODE_PENDING_HEALTHCHECK, NODE_AVAILABLE)
            outcome[name] = f"{result.status}: {result.reason}"
            if result.status != HEALTHY:
                run_logger(__name__).warning(
                    "node %s kept in service, health %s: %s", name, result.status, result.reason
                )
    return outcome


def free_stranded_nodes(runner: Runner) -> dict[str, str]:
    """Nodes nobody will move any more -> back in service: held by an ended job (or, claimed for a job that was
    never created, by an owner that is gone) -> AVAILABLE; FAILED and not rebooted -> reboot; a scheduled
    check's PENDING_HEALTHCHECK whose checker is gone -> AVAILABLE; REBOOTING and up again -> AVAILABLE."""
    outcome = {}
    for node in list_nodes(runner.config.cluster_name):
        name, status, job_id = node["node_name"], node["node_status"], node.get("job_id")
        job = get_job(job_id) if job_id else None
        active = job is not None and job["job_status"] in JOB_ACTIVE
        if status == NODE_REBOOTING:
            if node_back(runner, name):
                outcome[name] = "back: AVAILABLE"
        elif status == NODE_FAILED and not active:
            take_out_of_service(runner, name, None, NODE_FAILED)
            outcome[name] = "FAILED: rebooted again"
        elif status in NODE_HELD and job_id and not active:
            if job is not None or runner.owner_gone(node):
                if move_node(name, job_id, NODE_HELD, NODE_AVAILABLE):
                    outcome[name] = f"released: job {job_id} is {job['job_status'] if job else 'gone'}"
        elif status == NODE_PENDING_HEALTHCHECK and not job_id and runner.owner_gone(node):
            if move_node(name, None, NODE_PENDING_HEALTHCHECK, NODE_AVAILABLE):
                outcome[name] = "released: its scheduled check is gone"
    return outcome


def stop_terminated_tasks(runner: Runner, within_s: float = 3600.0) -> list[str]:
    """Tasks their job stopped (TERMINATED) within ``within_s`` whose process still runs, e.g. after a crash
    between the record and the backend's stop: stop them now. Returns their ids."""
    since = iso_ago(within_s)

    def keep(item: dict[str, Any]) -> bool:
        """A task stopped by its job, recently."""
        return (
            item.get("task_status") == TASK_TERMINATED
            and item.get("terminated_by") == "job"
            and item.get("updated_at", "") >= since
        )

    stopped = []
    for task in state_store.scan_all(_tables()[0], keep=keep):
        try:
            running = runner.backend.poll(task["ecs_task_id"]) is None
        except BackendError:
            continue
        if running:
            stop_task(runner, task["ecs_task_id"], task.get("stop_reason", "stopped by the job"))
            stopped.append(task["ecs_task_id"])
    return stopped
