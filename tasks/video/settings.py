"""The video pipeline's process settings (``VIDEO_<FIELD>``; the backend's are the ``VideoInference`` block's)."""

from __future__ import annotations

from pydantic import Field

from blocks.settings import EnvSettings


class VideoSettings(EnvSettings):
    """How the text detector runs in this process."""

    model_threads: int | None = Field(
        default=None, description="Threads of the text-redact detector's one pool; unset: every core."
    )
