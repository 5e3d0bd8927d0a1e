"""The listeners' settings: their heartbeat file and, per pipeline, the queue a deployment names outright."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from blocks.settings import EnvSettings


class ListenerSettings(EnvSettings):
    """Where a listener shows it is alive, and which queue it receives from."""

    _env_scope: ClassVar[str] = "pipelines"
    _env_patterns: ClassVar[Mapping[str, str]] = {
        "<PIPELINE>_QUEUE_URL": "The SQS queue a pipeline's listener receives from; unset: its seed queue's name, "
        "looked up in the object storage's account.",
    }

    listener_heartbeat: str | None = Field(
        default=None,
        description="File the listener touches as it receives (a container health check reads its age); unset: none.",
    )
