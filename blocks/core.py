"""The blocks every pipeline shares: table names and object storage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from prefect_aws import AwsCredentials
from pydantic import Field

from blocks.base import ConfigBlock


class DynamoTables(ConfigBlock):
    """DynamoDB table names (the seeds' names by default) and, in AWS, the credentials to reach them."""

    _block_type_name = "Pipeline DynamoDB Tables"
    _env_scope: ClassVar[str] = "table"
    _env_patterns: ClassVar[Mapping[str, str]] = {
        "<LOGICAL>": "The physical name of one logical table, e.g. TABLE_PHSPECTRA_RUNS=runs (wins over the block)."
    }

    env: str = Field(default="dev", description="Environment suffix of the seed table names ({env}).")
    names: dict[str, str] = Field(
        default_factory=dict,
        description="Logical table -> physical name where it is not the seed's, "
        'e.g. {"etl_file_tracking": "tracking"}.',
    )
    aws_credentials: AwsCredentials | None = Field(
        default=None, description="Credentials for DynamoDB in AWS; unset: boto3's default chain (env, role)."
    )

    def name_of(self, logical: str, default: str) -> str:
        """The physical name of one logical table: env ``TABLE_<LOGICAL>``, else this block's, else ``default``.

        A block saved with one field per table keeps them as extra fields, read here too."""
        saved = self.names.get(logical) or (self.model_extra or {}).get(logical)
        return self.read_pattern(logical) or saved or default


class ObjectStorage(ConfigBlock):
    """Where pipelines keep objects: ``file:///…`` locally, ``s3://bucket/prefix`` in AWS."""

    _block_type_name = "Pipeline Object Storage"
    _env_scope: ClassVar[str] = "object_store"

    base_url: str = Field(default="", description="Root URL; empty: .data/objects/ at the repository root.")
    aws_credentials: AwsCredentials | None = Field(
        default=None, description="Credentials for S3; unset: boto3's default chain (env, role)."
    )
