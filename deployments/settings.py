"""The local stack's settings: where it keeps its data, its ports, its work pools and its DynamoDB keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from blocks.settings import EnvSettings


class StackSettings(EnvSettings):
    """The local stack (`make up`) and the work pools it and the AWS stack create."""

    _env_scope: ClassVar[str] = "pipelines"
    # the work pools' names before the rule: Makefiles and shells set these
    _env_aliases: ClassVar[Mapping[str, str]] = {
        "LOCAL_WORK_POOL": "local_work_pool",
        "ECS_WORK_POOL": "ecs_work_pool",
        "MAINTENANCE_WORK_POOL": "maintenance_work_pool",
    }

    api_client_port: int | None = Field(
        default=None,
        description="Port the stack's clients call instead of the server's (a counting proxy); unset: the server's.",
    )
    prefect_retention_days: float | None = Field(
        default=None, description="Days the server keeps ended flow runs and events; unset: 3 (seed 001's logs)."
    )
    dynamodb_key_grace_s: float = Field(
        default=3600.0, description="Seconds the previous DynamoDB Local key stays accepted after a rotation."
    )
    dynamodb_keys: str | None = Field(
        default=None, description="The DynamoDB relay's key file (set by the stack for the relay, never by hand)."
    )
    local_work_pool: str = Field(default="local-process", description="The local process work pool.")
    ecs_work_pool: str = Field(default="aws-ecs", description="The ECS work pool of the AWS deployments.")
    maintenance_work_pool: str = Field(
        default="aws-maintenance", description="The AWS stack's process pool of the frequent maintenance flows."
    )


class DynamoDbLocal(EnvSettings):
    """The stack's DynamoDB Local."""

    _env_scope: ClassVar[str] = "dynamodb_local"

    port: int = Field(default=8000, description="Port of DynamoDB Local.")
    isolate: bool = Field(
        default=True, description="Reachable from this machine only where it can be; 0: every interface, on purpose."
    )


class PrefectServer(EnvSettings):
    """The stack's Prefect server (names of this project's, not Prefect's own settings)."""

    _env_scope: ClassVar[str] = "prefect_server"

    port: int = Field(default=4200, description="Port of the Prefect server.")
    db: str = Field(
        default="", description="The server's database: postgres or sqlite; empty: postgres where its binaries are."
    )


class PrefectPostgres(EnvSettings):
    """The PostgreSQL the stack runs for the Prefect server."""

    _env_scope: ClassVar[str] = "prefect_postgres"

    port: int = Field(default=5433, description="Port of the server's PostgreSQL.")
