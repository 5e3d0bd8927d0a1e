"""Seed 002 configuration: the GPU compute backend, health checks, retries and the node wait policy."""

from __future__ import annotations

from typing import Literal

from prefect_aws import AwsCredentials
from pydantic import Field, field_validator

from blocks.base import ConfigBlock

__all__ = ["GpuCompute"]


class GpuCompute(ConfigBlock):
    """Where GPU job tasks run (local slots or ECS container instances) and how nodes are checked."""

    _block_type_name = "Pipeline GPU Compute"

    backend: Literal["local", "ecs"] = Field(default="local", description="'local' (subprocess slots) or 'ecs'.")
    cluster_name: str = Field(default="local", description="ECS cluster name (the local backend uses it as a label).")
    health_check: Literal["nvml", "dcgmi", "command"] = Field(
        default="nvml", description="Node health check: NVML readings, `dcgmi diag -r N`, or health_command."
    )
    health_command: str = Field(default="", description="Command for health_check='command' (exit 0 = healthy).")
    dcgm_level: int = Field(default=1, description="`dcgmi diag -r` level (1 quick, 2 medium, 3 long).")
    health_timeout_s: float = Field(default=900.0, description="Health check time limit.")
    unknown_is_unhealthy: bool | None = Field(
        default=None,
        description=(
            "A task failed and the check could not tell (no GPU, no dcgmi): treat the node as unhealthy. Unset: yes on "
            "ECS (its nodes have GPUs, so 'unknown' means a broken driver), no on the local backend (no GPU there)."
        ),
    )
    max_retries: int = Field(default=1, description="Restarts of a job after a node fault (seed: 1).")
    local_nodes: int = Field(default=4, description="Local backend: node slots registered (local-0..local-{n-1}).")
    local_state_dir: str = Field(default=".data/gpu-local", description="Local backend: slot state folder.")
    local_reboot_s: float = Field(default=2.0, description="Local backend: seconds a 'reboot' keeps a slot down.")
    node_wait: Literal["wait", "fail"] = Field(
        default="fail", description="Not enough AVAILABLE nodes: 'wait' (poll until node_wait_timeout_s) or 'fail'."
    )
    node_wait_timeout_s: float = Field(default=300.0, description="How long to wait for nodes (start or restart).")
    poll_interval_s: float = Field(default=1.0, description="Task watch interval.")
    takeover_after_s: float = Field(
        default=3600.0,
        description=(
            "A job step (health check, restart) whose driver's Prefect run has not ended but which has not moved for "
            "this long is taken over by the sweep; keep it above health_timeout_s + node_wait_timeout_s."
        ),
    )
    env_passthrough: list[str] = Field(
        default=[
            "PATH",
            "HOME",
            "LANG",
            "LC_ALL",
            "TZ",
            "TMPDIR",
            "USER",
            "LOGNAME",
            "LD_LIBRARY_PATH",
            "CUDA_VISIBLE_DEVICES",
            "NVIDIA_VISIBLE_DEVICES",
        ],
        description="Local backend: the only variables of the worker's environment a job command sees "
        "(plus the job's).",
    )
    # ECS backend
    task_definition: str = Field(default="", description="ECS task definition of job tasks (family[:revision] or ARN).")
    container_name: str = Field(default="main", description="Container of the task definition to override.")
    health_task_definition: str = Field(default="", description="ECS task definition that runs `dcgmi diag`.")
    region_name: str | None = Field(default=None, description="ECS backend: the cluster's region; unset: boto3's.")
    aws_credentials: AwsCredentials | None = Field(
        default=None, description="ECS backend: credentials; unset: boto3's default chain (env, role)."
    )
    notification_block: str = Field(
        default="", description="Name of a saved Prefect notification block (e.g. slack-webhook/ops) for failed jobs."
    )

    @field_validator("env_passthrough", mode="before")
    @classmethod
    def _names(cls, value):
        """``GPU_ENV_PASSTHROUGH=PATH,HOME``: a comma-separated list from the environment."""
        return [name.strip() for name in value.split(",") if name.strip()] if isinstance(value, str) else value
