"""The blocks every pipeline shares: table names and object storage."""

from __future__ import annotations

from typing import ClassVar, Optional

from prefect_aws import AwsCredentials
from pydantic import Field

from blocks.base import ConfigBlock
from tasks.core.tables import TABLE_SPECS, default_names


class DynamoTables(ConfigBlock):
    """DynamoDB table names (the seeds' names by default) and, in AWS, the credentials to reach them."""

    _block_type_name = "Pipeline DynamoDB Tables"
    _env_prefix: ClassVar[str] = "TABLE_"

    env: str = Field(default="dev", description="Environment suffix of the seed table names ({env}).")
    phspectra_runs: Optional[str] = None
    etl_file_tracking: Optional[str] = None
    etl_metrics: Optional[str] = None
    ecs_task: Optional[str] = None
    ecs_job: Optional[str] = None
    ecs_node: Optional[str] = None
    video_jobs: Optional[str] = None
    video_segment_completions: Optional[str] = None
    video_reassembly_locks: Optional[str] = None
    granules: Optional[str] = None
    executions: Optional[str] = None
    pdrs: Optional[str] = None
    health_incidents: Optional[str] = None
    aws_credentials: Optional[AwsCredentials] = Field(
        default=None, description="Credentials for DynamoDB in AWS; unset: boto3's default chain (env, role)."
    )

    def names(self) -> dict[str, str]:
        """Logical -> physical table name, seed defaults filled in."""
        defaults = default_names(self.env)
        return {logical: getattr(self, logical) or defaults[logical] for logical in TABLE_SPECS}

    def name(self, logical: str) -> str:
        """The physical name of one logical table."""
        return self.names()[logical]


class ObjectStorage(ConfigBlock):
    """Where pipelines keep objects: ``file:///…`` locally, ``s3://bucket/prefix`` in AWS."""

    _block_type_name = "Pipeline Object Storage"
    _env_prefix: ClassVar[str] = "OBJECT_STORE_"

    base_url: str = Field(default="", description="Root URL; empty: .data/objects/ at the repository root.")
    aws_credentials: Optional[AwsCredentials] = None
