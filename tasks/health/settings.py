"""The health pass's settings beyond its thresholds (those are the ``HealthThresholds`` block's)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from blocks.settings import EnvSettings


class MetricsSettings(EnvSettings):
    """Whether the health pass publishes its readings to CloudWatch."""

    _env_scope: ClassVar[str] = "pipelines"

    metrics_env: str | None = Field(
        default=None, description="CloudWatch 'Env' dimension of the readings the health pass puts; unset: none put."
    )
