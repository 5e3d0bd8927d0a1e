"""Configuration of the video pipeline's inference backend (seed 003)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, SecretStr, field_validator

from blocks.base import ConfigBlock

__all__ = ["VideoInference"]


class VideoInference(ConfigBlock):
    """Which inference backend processes segments, and how to reach it (env ``VIDEO_INFERENCE_<FIELD>``)."""

    _block_type_name = "Video Inference Backend"
    _env_scope: ClassVar[str] = "video_inference"  # VIDEO_ is the video package's own settings

    backend: Literal["ffmpeg", "http", "gpu", "text-redact", "sagemaker"] = Field(
        default="ffmpeg",
        description=(
            "ffmpeg: filter chain on CPU; http: POST each segment to endpoint_url; gpu: NVENC; text-redact: a text "
            "detector (ONNX, CUDA when available) blacks out text in every frame; sagemaker: async endpoint_name."
        ),
    )
    endpoint_url: str | None = Field(
        default=None,
        description="http backend: URL that receives a segment's bytes; "
        "sagemaker backend: the runtime API (empty: AWS's).",
    )
    endpoint_name: str | None = Field(default=None, description="sagemaker backend: the asynchronous endpoint's name.")
    batch_size: int = Field(default=8, ge=1, description="text-redact backend: frames per run of the detector.")
    timeout_s: float = Field(
        default=60.0, description="http / sagemaker backend: seconds to wait for one segment's output."
    )
    api_key: SecretStr | None = Field(default=None, description="http backend: sent as 'Authorization: Bearer'.")
    segment_seconds: float = Field(default=4.0, description="Default segment length in seconds.")
    mode: str = Field(default="identity", description="Default mode: identity, grayscale, scale or denoise.")
    source_prefixes: list[str] = Field(
        default_factory=list,
        description=(
            "Allow-list for video-process's source_url: URL prefixes it may import from (file:///…/ or s3://bucket/"
            "prefix/). Empty: any (the local default). In AWS set it to the upload buckets, e.g. "
            "VIDEO_INFERENCE_SOURCE_PREFIXES=s3://my-uploads/incoming/ (comma-separated)."
        ),
    )

    @field_validator("source_prefixes", mode="before")
    @classmethod
    def _split_prefixes(cls, value: object) -> object:
        """A comma-separated string (the environment variable) becomes a list."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
