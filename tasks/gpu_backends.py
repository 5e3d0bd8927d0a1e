"""Compute backends for GPU jobs: ``local`` (node slots, tasks are real subprocesses) and ``ecs``.

A backend starts one task on one node, reports whether it stopped (and its exit code), stops it, runs a
node health check, reboots a node and says when it is back. It never writes DynamoDB: tasks/gpu.py does,
through the state store, so a backend call can be repeated without moving a status twice.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tasks import keys
from tasks.gpu_health import UNKNOWN, HealthResult, command_check, run_check


class BackendError(RuntimeError):
    """The backend could not do what was asked (command cannot start, API unreachable): a clear reason."""


@dataclass(frozen=True)
class StartedTask:
    """What the backend says about a task it started."""

    task_id: str
    task_def_arn: str
    task_def_name: str
    task_def_revision: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskExit:
    """A stopped task: its exit code (None when unknown) and why it stopped."""

    exit_code: int | None
    reason: str


@dataclass(frozen=True)
class TaskSpec:
    """One task of one job attempt on one node."""

    job_id: str
    retry: int
    node: dict[str, Any]  # the node row
    node_index: int
    num_nodes: int
    command: str


class ComputeBackend(Protocol):
    name: str

    def discover_nodes(self) -> list[dict[str, Any]]: ...
    def start_task(self, spec: TaskSpec) -> StartedTask: ...
    def poll(self, task_id: str) -> TaskExit | None: ...
    def stop(self, task_id: str, reason: str) -> None: ...
    def health_check(self, node: dict[str, Any]) -> HealthResult: ...
    def reboot(self, node: dict[str, Any]) -> None: ...
    def node_ready(self, node: dict[str, Any]) -> bool: ...


def task_env(spec: TaskSpec) -> dict[str, str]:
    """The variables every task sees: its node, index, job, attempt and job size."""
    return {
        "NODE_NAME": spec.node["node_name"],
        "NODE_INDEX": str(spec.node_index),
        "GPU_JOB_ID": spec.job_id,
        "GPU_JOB_RETRY": str(spec.retry),
        "GPU_JOB_NUM_NODES": str(spec.num_nodes),
    }


# --------------------------------------------------------------------------- local


class LocalBackend:
    """Node slots on this machine; a task is a subprocess (no shell), a reboot resets the slot.

    Slot state lives in files under ``state_dir`` so the CLI, the scheduled node check and the job flow
    (separate processes) agree: ``<node>.health.json`` is an injected health command (tests, demos) and
    ``<node>.reboot`` holds the time the slot comes back. Processes are tracked in this process.
    """

    name = "local"
    _processes: dict[str, subprocess.Popen] = {}
    _task_nodes: dict[str, str] = {}
    _lock = threading.Lock()

    def __init__(self, config) -> None:
        self.config = config
        self.state_dir = Path(config.local_state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    # nodes
    def discover_nodes(self) -> list[dict[str, Any]]:
        return [
            {
                "node_name": keys.gpu_local_node_name(i),
                "container_instance_id": keys.gpu_local_node_name(i),
                "container_instance_arn": f"local:{self.config.cluster_name}:{keys.gpu_local_node_name(i)}",
                "ip": "127.0.0.1",
                "ibdev": "none",
            }
            for i in range(self.config.local_nodes)
        ]

    def _file(self, node_name: str, suffix: str) -> Path:
        return self.state_dir / f"{keys.gpu_node_name(node_name)}.{suffix}"

    def inject_health_command(self, node_name: str, command: list[str] | str) -> None:
        """Make this slot's health check run ``command`` (e.g. one that exits 1) until it is rebooted."""
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        self._file(node_name, "health.json").write_text(json.dumps(argv))

    # tasks
    def start_task(self, spec: TaskSpec) -> StartedTask:
        task_id = keys.gpu_local_task_id(spec.job_id, spec.retry, spec.node_index)
        try:
            argv = shlex.split(spec.command)
        except ValueError as error:
            raise BackendError(f"command cannot be parsed: {error}") from None
        if not argv:
            raise BackendError("command is empty")
        logs = self.state_dir / "logs"
        logs.mkdir(exist_ok=True)
        with self._lock:
            old = self._processes.get(task_id)
            if old is not None and old.poll() is None:  # a retried start: the task is already running
                return self._started(task_id, old)
            try:
                with open(logs / f"{task_id}.log", "ab") as log:
                    process = subprocess.Popen(
                        argv,
                        env={**os.environ, **task_env(spec)},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
            except OSError as error:
                raise BackendError(f"command cannot start on {spec.node['node_name']}: {error}") from None
            self._processes[task_id] = process
            self._task_nodes[task_id] = spec.node["node_name"]
            self._pid_file(task_id).write_text(str(process.pid))
        return self._started(task_id, process)

    def _started(self, task_id: str, process: subprocess.Popen) -> StartedTask:
        return StartedTask(task_id, "local:subprocess", "local", "0", {"pid": str(process.pid)})

    def _pid_file(self, task_id: str) -> Path:
        folder = self.state_dir / "pids"
        folder.mkdir(exist_ok=True)
        return folder / keys.gpu_task_id(task_id)

    def _foreign_pid(self, task_id: str) -> int | None:
        """The pid of a task started by another process (e.g. the flow run, seen from a cancellation hook)."""
        try:
            pid = int(self._pid_file(task_id).read_text())
            os.kill(pid, 0)
        except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
            return None
        return pid

    def poll(self, task_id: str) -> TaskExit | None:
        process = self._processes.get(task_id)
        if process is None:
            if self._foreign_pid(task_id) is not None:
                return None
            return TaskExit(None, "task process is gone and its exit code is unknown (the flow run was restarted?)")
        code = process.poll()
        if code is None:
            return None
        if code < 0:
            return TaskExit(code, f"killed by signal {signal.Signals(-code).name}")
        return TaskExit(code, f"exited with code {code}")

    def stop(self, task_id: str, reason: str) -> None:
        process = self._processes.get(task_id)
        if process is None:
            pid = self._foreign_pid(task_id)
            if pid is not None:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        if process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    # health and reboots
    def health_check(self, node: dict[str, Any]) -> HealthResult:
        injected = self._file(node["node_name"], "health.json")
        if injected.exists():
            return command_check(json.loads(injected.read_text()), self.config.health_timeout_s, {"NODE_NAME": node["node_name"]})
        return run_check(
            self.config.health_check, self.config.health_command, self.config.dcgm_level, self.config.health_timeout_s
        )

    def reboot(self, node: dict[str, Any]) -> None:
        name = node["node_name"]
        for task_id, node_name in list(self._task_nodes.items()):  # a reboot kills what still runs on the slot
            if node_name == name:
                self.stop(task_id, "node rebooted")
        self._file(name, "health.json").unlink(missing_ok=True)
        self._file(name, "reboot").write_text(str(time.time() + self.config.local_reboot_s))

    def node_ready(self, node: dict[str, Any]) -> bool:
        marker = self._file(node["node_name"], "reboot")
        try:
            back_at = float(marker.read_text())
        except FileNotFoundError:
            return True
        if time.time() < back_at:
            return False
        marker.unlink(missing_ok=True)
        return True


# --------------------------------------------------------------------------- ECS


class EcsBackend:
    """ECS container instances as nodes: ``start_task`` pins a task to one instance, ``describe_tasks``
    polls it, ``stop_task`` stops it; the health check is a DCGM task; a reboot is EC2 ``reboot_instances``."""

    name = "ecs"

    def __init__(self, config, session=None) -> None:
        import boto3

        self.config = config
        if session is None and config.aws_credentials is not None:
            session = config.aws_credentials.get_boto3_session()
        session = session or boto3.Session(region_name=config.region_name)
        self.ecs = session.client("ecs", region_name=config.region_name)
        self.ec2 = session.client("ec2", region_name=config.region_name)

    def _call(self, what: str, fn, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except (ClientError, BotoCoreError) as error:
            raise BackendError(f"ECS {what} failed: {error}") from None

    def discover_nodes(self) -> list[dict[str, Any]]:
        cluster = self.config.cluster_name
        arns = self._call("list_container_instances", self.ecs.list_container_instances, cluster=cluster)[
            "containerInstanceArns"
        ]
        if not arns:
            return []
        described = self._call(
            "describe_container_instances", self.ecs.describe_container_instances, cluster=cluster, containerInstances=arns
        )["containerInstances"]
        nodes = []
        for instance in described:
            arn = instance["containerInstanceArn"]
            attributes = {a["name"]: a.get("value", "") for a in instance.get("attributes", [])}
            nodes.append(
                {
                    "node_name": keys.gpu_node_name(instance.get("ec2InstanceId") or arn.rsplit("/", 1)[-1]),
                    "container_instance_id": arn.rsplit("/", 1)[-1],
                    "container_instance_arn": arn,
                    "ip": attributes.get("ip", ""),
                    "ibdev": attributes.get("ibdev", ""),
                }
            )
        return nodes

    def _start(self, task_definition: str, node: dict[str, Any], command: list[str] | None, env: dict[str, str]):
        override: dict[str, Any] = {"name": self.config.container_name, "environment": [{"name": k, "value": v} for k, v in env.items()]}
        if command is not None:
            override["command"] = command
        response = self._call(
            "start_task",
            self.ecs.start_task,
            cluster=self.config.cluster_name,
            taskDefinition=task_definition,
            containerInstances=[node["container_instance_arn"]],
            overrides={"containerOverrides": [override]},
            startedBy="prefect-gpu",
        )
        if response.get("failures") or not response.get("tasks"):
            raise BackendError(f"ECS start_task on {node['node_name']} failed: {response.get('failures')}")
        return response["tasks"][0]

    def start_task(self, spec: TaskSpec) -> StartedTask:
        if not self.config.task_definition:
            raise BackendError("GpuCompute.task_definition is not set for the ecs backend")
        try:
            argv = shlex.split(spec.command)
        except ValueError as error:
            raise BackendError(f"command cannot be parsed: {error}") from None
        task = self._start(self.config.task_definition, spec.node, argv or None, task_env(spec))
        definition_arn = task["taskDefinitionArn"]
        family_revision = definition_arn.rsplit("/", 1)[-1]
        family, _, revision = family_revision.partition(":")
        return StartedTask(keys.gpu_task_id(task["taskArn"].rsplit("/", 1)[-1]), definition_arn, family, revision or "0", {"task_arn": task["taskArn"]})

    def _describe(self, task_id: str) -> dict[str, Any] | None:
        tasks = self._call("describe_tasks", self.ecs.describe_tasks, cluster=self.config.cluster_name, tasks=[task_id])["tasks"]
        return tasks[0] if tasks else None

    def poll(self, task_id: str) -> TaskExit | None:
        task = self._describe(task_id)
        if task is None:
            return TaskExit(None, "ECS no longer knows the task")
        if task.get("lastStatus") != "STOPPED":
            return None
        containers = task.get("containers") or [{}]
        main = next((c for c in containers if c.get("name") == self.config.container_name), containers[0])
        reason = main.get("reason") or task.get("stoppedReason") or "stopped"
        return TaskExit(main.get("exitCode"), reason)

    def stop(self, task_id: str, reason: str) -> None:
        self._call("stop_task", self.ecs.stop_task, cluster=self.config.cluster_name, task=task_id, reason=reason[:255])

    def health_check(self, node: dict[str, Any]) -> HealthResult:
        """Run the DCGM task definition on the node and wait for its exit code."""
        if not self.config.health_task_definition:
            return HealthResult(UNKNOWN, "dcgmi", "GpuCompute.health_task_definition is not set for the ecs backend")
        started, checked_at = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        command = ["dcgmi", "diag", "-r", str(self.config.dcgm_level)]
        task = self._start(self.config.health_task_definition, node, command, {"NODE_NAME": node["node_name"]})
        task_id = task["taskArn"].rsplit("/", 1)[-1]
        deadline = started + self.config.health_timeout_s
        while (result := self.poll(task_id)) is None:
            if time.monotonic() > deadline:
                self.stop(task_id, "health check timed out")
                return HealthResult("unhealthy", "dcgmi", "DCGM task timed out", {"task_id": task_id}, checked_at)
            time.sleep(min(5.0, self.config.poll_interval_s))
        status = "healthy" if result.exit_code == 0 else ("unknown" if result.exit_code is None else "unhealthy")
        return HealthResult(
            status, "dcgmi", f"DCGM task {result.reason} (exit {result.exit_code})",
            {"task_id": task_id, "exit_code": result.exit_code}, checked_at, round(time.monotonic() - started, 3),
        )

    def reboot(self, node: dict[str, Any]) -> None:
        if not node["node_name"].startswith("i-"):
            raise BackendError(f"node {node['node_name']} has no EC2 instance id to reboot")
        self._call("reboot_instances", self.ec2.reboot_instances, InstanceIds=[node["node_name"]])

    def node_ready(self, node: dict[str, Any]) -> bool:
        described = self._call(
            "describe_container_instances",
            self.ecs.describe_container_instances,
            cluster=self.config.cluster_name,
            containerInstances=[node["container_instance_arn"]],
        )["containerInstances"]
        return bool(described) and described[0].get("status") == "ACTIVE" and described[0].get("agentConnected", False)


def make_backend(config) -> ComputeBackend:
    """The backend named by ``config.backend``."""
    if config.backend == "local":
        return LocalBackend(config)
    if config.backend == "ecs":
        return EcsBackend(config)
    raise ValueError(f"unknown GPU backend {config.backend!r}: use 'local' or 'ecs'")
