"""Resolved configuration for code that runs inside flows and tasks."""

from __future__ import annotations

from blocks import DynamoTables, ObjectStorage, load_config
from tasks.core import registry, state_store
from tasks.core.object_store import ObjectStore


def table_names() -> dict[str, str]:
    """Logical -> physical DynamoDB table names; switches the state store to the block's credentials if set."""
    config = load_config(DynamoTables)
    if config.aws_credentials is not None:
        state_store.use_session(config.aws_credentials.get_boto3_session())
    return {
        logical: config.name_of(logical, default)
        for logical, default in registry.default_table_names(config.env).items()
    }


def table_name(logical: str) -> str:
    """The physical DynamoDB table name of one logical table."""
    return table_names()[logical]


def object_store(url: str | None = None) -> ObjectStore:
    """The store at ``url``, or the configured one (``OBJECT_STORE_BASE_URL`` / block), default ``.data/objects/``."""
    config = load_config(ObjectStorage)
    session = config.aws_credentials.get_boto3_session() if config.aws_credentials is not None else None
    return ObjectStore.from_url(url or config.base_url, session=session)
