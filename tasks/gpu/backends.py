"""Compute backends for GPU jobs: ``local`` (node slots, tasks are real subprocesses) and ``ecs``.

A backend starts one task on one node, reports whether it stopped (and its exit code), stops it, runs a
node health check, reboots a node and says when it is back. It never writes DynamoDB: tasks/gpu.py does,
through the state store, so a backend call can be repeated without moving a status twice.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tasks.core.errors import RefusedInput, Unavailable
from tasks.core.processes import pid_alive, pid_reused, process_identity
from tasks.gpu import keys
from tasks.gpu.health import UNKNOWN, HealthResult, command_check, run_check

LAUNCHER = Path(__file__).resolve().with_name("launcher.py")
_CHILDREN: dict[str, subprocess.Popen] = {}  # launchers started by this process, so poll() can reap them


class BackendError(Unavailable, RuntimeError):
    """The backend could not do what was asked (command cannot start, API unreachable): a clear reason."""


class CommandRefused(RefusedInput):
    """The job's command cannot be run as given: it does not parse as a shell command line, or is empty where the
    backend has no command of its own."""


def command_argv(command: str) -> list[str]:
    """The command line as argv, split as a shell would; CommandRefused if it does not parse (an open quote)."""
    try:
        return shlex.split(command)
    except ValueError as error:
        raise CommandRefused(f"command cannot be parsed: {error}") from None


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
    env: dict[str, str] = field(default_factory=dict)  # the job's own variables
    rendezvous: dict[str, str] = field(default_factory=dict)  # MASTER_ADDR, RANK, … (jobs.rendezvous_env)


class ComputeBackend(Protocol):
    name: str

    def discover_nodes(self) -> list[dict[str, Any]]:
        """The backend's nodes as node rows (name, container instance id and ARN, ip, ibdev; ``unknown_reason``
        when the node's instance cannot be described)."""

    def master_port(self, node: dict[str, Any], retry: int) -> int:
        """The rendezvous port for a job attempt whose rank 0 runs on ``node``."""

    def start_task(self, spec: TaskSpec) -> StartedTask:
        """Start ``spec``'s task on its node; BackendError if it cannot start, CommandRefused if its command cannot
        run as given."""

    def poll(self, task_id: str) -> TaskExit | None:
        """How the task stopped, or None while it still runs (any process may ask: the sweep, the reconciler)."""

    def stop(self, task_id: str, reason: str) -> None:
        """Stop the task (nothing if it already stopped)."""

    def health_check(self, node: dict[str, Any]) -> HealthResult:
        """Run the node health check on ``node``."""

    def reboot(self, node: dict[str, Any]) -> None:
        """Reboot ``node``; ``node_ready`` says when it is back."""

    def node_ready(self, node: dict[str, Any]) -> bool:
        """Whether ``node`` is back and usable after a reboot."""


def task_env(spec: TaskSpec) -> dict[str, str]:
    """The variables every task sees: the job's own, its rendezvous, then its node, index, job, attempt and size."""
    return {
        **spec.env,
        **spec.rendezvous,
        "NODE_NAME": spec.node["node_name"],
        "NODE_INDEX": str(spec.node_index),
        "GPU_JOB_ID": spec.job_id,
        "GPU_JOB_RETRY": str(spec.retry),
        "GPU_JOB_NUM_NODES": str(spec.num_nodes),
    }


# --------------------------------------------------------------------------- local


def _recorded_process(record: dict[str, Any]) -> tuple[int, str | None]:
    """(pid, process identity) of a ``pids/<task>`` record; records written before identities have none."""
    return int(record["pid"]), record.get("process")


class LocalBackend:
    """Node slots on this machine; a task is a subprocess (no shell) under ``launcher.py``; a reboot resets the slot.

    Everything lives in files under ``state_dir`` so the flow run, the scheduled sweep, the CLI and the
    reconciler (separate processes) agree: ``pids/<task>`` (pid and node), ``exits/<task>`` (the exit code,
    written by the launcher when the command ends, whoever started it), ``<node>.health.json`` (an injected
    health command: tests, demos) and ``<node>.reboot`` (when the slot comes back).
    """

    name = "local"
    _lock = threading.Lock()

    def __init__(self, config) -> None:
        self.config = config
        self.state_dir = Path(config.local_state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    # nodes
    def discover_nodes(self) -> list[dict[str, Any]]:
        """One node row per local slot (``local-0`` … ``local-{local_nodes - 1}``), slot i on loopback 127.0.0.{i+1}
        (Linux routes all of 127/8 to lo: each slot has its own address, as nodes do)."""
        return [
            {
                "node_name": keys.gpu_local_node_name(i),
                "container_instance_id": keys.gpu_local_node_name(i),
                "container_instance_arn": f"local:{self.config.cluster_name}:{keys.gpu_local_node_name(i)}",
                "ip": f"127.0.0.{i + 1}",
                "ibdev": "none",
            }
            for i in range(self.config.local_nodes)
        ]

    def master_port(self, node: dict[str, Any], retry: int) -> int:
        """A port free on the slot's address now (the kernel picks it)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((node["ip"], 0))
            return probe.getsockname()[1]

    def _file(self, node_name: str, suffix: str) -> Path:
        return self.state_dir / f"{keys.gpu_node_name(node_name)}.{suffix}"

    def _task_file(self, folder: str, task_id: str) -> Path:
        path = self.state_dir / folder
        path.mkdir(exist_ok=True)
        return path / keys.gpu_task_id(task_id)

    def inject_health_command(self, node_name: str, command: list[str] | str) -> None:
        """Make this slot's health check run ``command`` (e.g. one that exits 1) until it is rebooted."""
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        self._file(node_name, "health.json").write_text(json.dumps(argv))

    def command_env(self, spec: TaskSpec) -> dict[str, str]:
        """The task's whole environment: what the command needs from ours (PATH, HOME, …), then the job's and
        the task's variables; never the rest of ours (AWS keys, PREFECT_API_KEY, …)."""
        passed = {name: os.environ[name] for name in self.config.env_passthrough if name in os.environ}
        return {**passed, **task_env(spec)}

    # tasks
    def start_task(self, spec: TaskSpec) -> StartedTask:
        """Start the command under the launcher (reused if this attempt's task was started before); BackendError if it
        cannot, CommandRefused if the command is empty or does not parse."""
        task_id = keys.gpu_local_task_id(spec.job_id, spec.retry, spec.node_index)
        argv = command_argv(spec.command)
        if not argv:
            raise CommandRefused("command is empty (the local backend has no default command)")
        env = self.command_env(spec)
        if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
            raise BackendError(
                f"command cannot start on {spec.node['node_name']}: No such file or executable {argv[0]!r}"
            )
        with self._lock:
            known = self._started_process(task_id)
            if known is not None:  # a retried or resumed start: this attempt's task exists already
                return self._started(task_id, known[0])
            logs = self.state_dir / "logs"
            logs.mkdir(exist_ok=True)
            launcher = [sys.executable, "-I", "-S", str(LAUNCHER), str(self._task_file("exits", task_id)), "--"]
            try:
                with open(logs / f"{task_id}.log", "ab") as log:
                    process = subprocess.Popen(
                        launcher + argv,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
            except OSError as error:
                raise BackendError(f"command cannot start on {spec.node['node_name']}: {error}") from None
            _CHILDREN[task_id] = process  # reaped by poll(): no zombie in a long-lived process
            record = {"pid": process.pid, "node": spec.node["node_name"], "process": process_identity(process.pid)}
            self._task_file("pids", task_id).write_text(json.dumps(record))
        return self._started(task_id, process.pid)

    def _started(self, task_id: str, pid: int) -> StartedTask:
        return StartedTask(task_id, "local:subprocess", "local", "0", {"pid": str(pid)})

    def _started_process(self, task_id: str) -> tuple[int, str | None] | None:
        """The pid and process identity recorded for a task started before (running or not), else None."""
        try:
            return _recorded_process(json.loads(self._task_file("pids", task_id).read_text()))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def _running(self, task_id: str) -> bool:
        """Whether the task's own launcher still runs (not merely some later process that got its pid)."""
        started = self._started_process(task_id)
        return started is not None and pid_alive(*started)

    def poll(self, task_id: str) -> TaskExit | None:
        """How the task ended (its launcher's exit file), or None while it runs; any process may ask."""
        child = _CHILDREN.get(task_id)
        if child is not None and child.poll() is not None:
            _CHILDREN.pop(task_id, None)
        try:
            code = int(self._task_file("exits", task_id).read_text())
        except (FileNotFoundError, ValueError):
            if self._running(task_id):
                return None
            # read again: the launcher may have written the file just before it exited
            try:
                code = int(self._task_file("exits", task_id).read_text())
            except (FileNotFoundError, ValueError):
                started = self._started_process(task_id) is not None
                what = "was killed before it could record its exit code" if started else "was never started here"
                return TaskExit(None, f"task process {what}")
        if code < 0:
            return TaskExit(code, f"killed by signal {signal.Signals(-code).name}")
        return TaskExit(code, f"exited with code {code}")

    def stop(self, task_id: str, reason: str) -> None:
        """SIGTERM the task's process group, SIGKILL after 5 s (whichever process started it)."""
        started = self._started_process(task_id)
        if started is None or pid_reused(*started):  # never signal the group of a process that got the pid since
            return
        pid = started[0]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                child = _CHILDREN.get(task_id)
                if child is not None:
                    child.poll()
                if not self._running(task_id):
                    return
                time.sleep(0.02)

    def running_on(self, node_name: str) -> list[str]:
        """Ids of the tasks still running on the slot."""
        tasks = []
        for path in sorted((self.state_dir / "pids").glob("*")) if (self.state_dir / "pids").is_dir() else []:
            try:
                record = json.loads(path.read_text())
                process = _recorded_process(record)
            except (ValueError, KeyError, TypeError):
                continue
            if record.get("node") == node_name and pid_alive(*process):
                tasks.append(path.name)
        return tasks

    # health and reboots
    def health_check(self, node: dict[str, Any]) -> HealthResult:
        """Run the slot's injected health command if there is one, else the configured check."""
        injected = self._file(node["node_name"], "health.json")
        if injected.exists():
            return command_check(
                json.loads(injected.read_text()), self.config.health_timeout_s, {"NODE_NAME": node["node_name"]}
            )
        return run_check(
            self.config.health_check, self.config.health_command, self.config.dcgm_level, self.config.health_timeout_s
        )

    def reboot(self, node: dict[str, Any]) -> None:
        """Kill the slot's tasks, clear its injected health command and mark it down for ``local_reboot_s``."""
        name = node["node_name"]
        for task_id in self.running_on(name):  # a reboot kills what still runs on the slot
            self.stop(task_id, "node rebooted")
        self._file(name, "health.json").unlink(missing_ok=True)
        self._file(name, "reboot").write_text(str(time.time() + self.config.local_reboot_s))

    def node_ready(self, node: dict[str, Any]) -> bool:
        """Whether the slot's reboot time has passed (clearing the marker once it has)."""
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


RENDEZVOUS_PORT = 29500  # torch.distributed's default MASTER_PORT; ECS jobs use it + retry
# the tag every EC2 instance of your GPU cluster carries, its value the cluster's name (GpuCompute.cluster_name):
# a container instance's EC2 instance names nothing of its cluster, so the task role may reboot only those tagged
GPU_CLUSTER_TAG = "pipelines:gpu-cluster"


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
        """The cluster's container instances as node rows, named by EC2 instance id, with the instance's private
        IP (else the container instance's ``ip`` attribute); one ECS or EC2 cannot describe gets ``unknown_reason``."""
        cluster = self.config.cluster_name
        arns = self._call("list_container_instances", self.ecs.list_container_instances, cluster=cluster)[
            "containerInstanceArns"
        ]
        if not arns:
            return []
        response = self._call(
            "describe_container_instances",
            self.ecs.describe_container_instances,
            cluster=cluster,
            containerInstances=arns,
        )
        described = response["containerInstances"]
        addresses = self._private_ips([i["ec2InstanceId"] for i in described if i.get("ec2InstanceId")])
        nodes = []
        for instance in described:
            arn, ec2_id = instance["containerInstanceArn"], instance.get("ec2InstanceId")
            attributes = {a["name"]: a.get("value", "") for a in instance.get("attributes", [])}
            node = {
                "node_name": keys.gpu_node_name(ec2_id or arn.rsplit("/", 1)[-1]),
                "container_instance_id": arn.rsplit("/", 1)[-1],
                "container_instance_arn": arn,
                "ip": addresses.get(ec2_id) or attributes.get("ip", ""),
                "ibdev": attributes.get("ibdev", ""),
            }
            if ec2_id not in addresses:
                node["unknown_reason"] = f"EC2 cannot describe instance {ec2_id or '(none)'}"
            nodes.append(node)
        for failure in response.get("failures") or []:  # listed, then gone or unreadable
            arn = failure.get("arn", "")
            nodes.append(
                {
                    "node_name": keys.gpu_node_name(arn.rsplit("/", 1)[-1]),
                    "container_instance_id": arn.rsplit("/", 1)[-1],
                    "container_instance_arn": arn,
                    "ip": "",
                    "ibdev": "",
                    "unknown_reason": f"ECS cannot describe container instance: {failure.get('reason')}",
                }
            )
        return nodes

    def _private_ips(self, instance_ids: list[str]) -> dict[str, str]:
        """EC2 instance id -> private IP, for the instances EC2 describes (a filter: a missing id is no error)."""
        if not instance_ids:
            return {}
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-id", "Values": instance_ids}]
        )
        reservations = self._call("describe_instances", lambda: [r for page in pages for r in page["Reservations"]])
        return {
            i["InstanceId"]: i.get("PrivateIpAddress", "")
            for r in reservations
            for i in r["Instances"]
            if i.get("State", {}).get("Name") != "terminated"
        }

    def master_port(self, node: dict[str, Any], retry: int) -> int:
        """``RENDEZVOUS_PORT`` + retry: a port of its own per attempt on the job's dedicated node 0, so a restart
        never meets the socket of the attempt before."""
        return RENDEZVOUS_PORT + retry % 1000

    def _start(
        self,
        task_definition: str,
        node: dict[str, Any],
        command: list[str] | None,
        env: dict[str, str],
        attempt: str | None = None,
    ):
        override: dict[str, Any] = {
            "name": self.config.container_name,
            "environment": [{"name": k, "value": v} for k, v in env.items()],
        }
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
            **({"tags": [{"key": "gpu-task", "value": attempt}]} if attempt else {}),
        )
        if response.get("failures") or not response.get("tasks"):
            raise BackendError(f"ECS start_task on {node['node_name']} failed: {response.get('failures')}")
        return response["tasks"][0]

    def start_task(self, spec: TaskSpec) -> StartedTask:
        """Start ``task_definition`` pinned to the node's container instance, with the spec's command and env."""
        if not self.config.task_definition:
            raise BackendError("GpuCompute.task_definition is not set for the ecs backend")
        argv = command_argv(spec.command)
        attempt = keys.gpu_local_task_id(spec.job_id, spec.retry, spec.node_index)
        task = self._started_before(spec.node, attempt) or self._start(
            self.config.task_definition, spec.node, argv or None, task_env(spec), attempt
        )
        definition_arn = task["taskDefinitionArn"]
        family_revision = definition_arn.rsplit("/", 1)[-1]
        family, _, revision = family_revision.partition(":")
        return StartedTask(
            keys.gpu_task_id(task["taskArn"].rsplit("/", 1)[-1]),
            definition_arn,
            family,
            revision or "0",
            {"task_arn": task["taskArn"]},
        )

    def _started_before(self, node: dict[str, Any], attempt: str) -> dict[str, Any] | None:
        """This attempt's task if it was started on the node already (a start resumed after a crash), else None."""
        for desired in ("RUNNING", "STOPPED"):
            arns = self._call(
                "list_tasks",
                self.ecs.list_tasks,
                cluster=self.config.cluster_name,
                startedBy="prefect-gpu",
                containerInstance=node["container_instance_arn"],
                desiredStatus=desired,
            )["taskArns"]
            if not arns:
                continue
            described = self._call(
                "describe_tasks",
                self.ecs.describe_tasks,
                cluster=self.config.cluster_name,
                tasks=arns[:100],
                include=["TAGS"],
            )["tasks"]
            for task in described:
                if {"key": "gpu-task", "value": attempt} in (task.get("tags") or []):
                    return task
        return None

    def _describe(self, task_id: str) -> dict[str, Any] | None:
        tasks = self._call(
            "describe_tasks", self.ecs.describe_tasks, cluster=self.config.cluster_name, tasks=[task_id]
        )["tasks"]
        return tasks[0] if tasks else None

    def poll(self, task_id: str) -> TaskExit | None:
        """The main container's exit once ECS reports the task STOPPED, else None."""
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
        """ECS ``stop_task`` with ``reason`` (cut to 255 characters)."""
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
            status,
            "dcgmi",
            f"DCGM task {result.reason} (exit {result.exit_code})",
            {"task_id": task_id, "exit_code": result.exit_code},
            checked_at,
            round(time.monotonic() - started, 3),
        )

    def reboot(self, node: dict[str, Any]) -> None:
        """EC2 ``reboot_instances`` on the node's instance; BackendError if it has no instance id."""
        if not node["node_name"].startswith("i-"):
            raise BackendError(f"node {node['node_name']} has no EC2 instance id to reboot")
        self._call("reboot_instances", self.ec2.reboot_instances, InstanceIds=[node["node_name"]])

    def node_ready(self, node: dict[str, Any]) -> bool:
        """Whether the node's container instance is ACTIVE with its agent connected."""
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
