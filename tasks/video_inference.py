"""Inference backends for one video segment: ffmpeg filter chain, HTTP endpoint, or NVENC on a GPU.

Each backend reads a local input file and writes a local output file; the caller moves bytes to and from
the object store. Failures raise ``InferenceError`` (retried by the task) with a message that says why.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from tasks import video_ffmpeg

BACKENDS = ("ffmpeg", "http", "gpu")


class InferenceError(RuntimeError):
    """The backend failed on a segment (error status, timeout, unreachable, bad output)."""


class GpuUnavailable(InferenceError):
    """The gpu backend was asked for on a machine without an NVIDIA GPU / NVENC."""


def infer_ffmpeg(source: Path, target: Path, mode: str) -> None:
    """The mode's real filter chain on the CPU (libx264); identity is a stream copy."""
    try:
        video_ffmpeg.transform(source, target, mode)
    except video_ffmpeg.FfmpegError as error:
        raise InferenceError(f"ffmpeg backend: {error}") from None


def infer_http(source: Path, target: Path, mode: str, endpoint_url: str | None, timeout_s: float,
               api_key: str | None = None) -> None:
    """POST the segment's bytes to ``endpoint_url`` (``?mode=``) and store the response body as the output."""
    if not endpoint_url:
        raise InferenceError("http backend: no endpoint_url configured (VideoInference block / VIDEO_INFERENCE_ENDPOINT_URL)")
    separator = "&" if "?" in endpoint_url else "?"
    request = urllib.request.Request(
        f"{endpoint_url}{separator}mode={mode}", data=source.read_bytes(), method="POST",
        headers={"Content-Type": "video/mp4"},
    )
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        raise InferenceError(f"http backend: {endpoint_url} answered {error.code} {error.reason}") from None
    except (TimeoutError, socket.timeout):
        raise InferenceError(f"http backend: {endpoint_url} timed out after {timeout_s:g} s") from None
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise InferenceError(f"http backend: {endpoint_url} timed out after {timeout_s:g} s") from None
        raise InferenceError(f"http backend: {endpoint_url} unreachable ({reason})") from None
    if not body:
        raise InferenceError(f"http backend: {endpoint_url} returned an empty body")
    target.write_bytes(body)


@functools.lru_cache(maxsize=1)
def gpu_available() -> str | None:
    """None when NVENC can encode here, else why not (no driver, no GPU, no encoder)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as error:  # no driver / library
        return f"no NVIDIA driver ({type(error).__name__})"
    if count == 0:
        return "no NVIDIA GPU"
    probe = subprocess.run(
        [video_ffmpeg.ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i",
         "testsrc=size=256x256:rate=10:duration=0.5", "-c:v", "h264_nvenc", "-f", "null", "-"],
        capture_output=True, text=True, timeout=60,
    )
    if probe.returncode != 0:
        return "h264_nvenc cannot encode: " + (probe.stderr.strip().splitlines() or ["?"])[-1]
    return None


def infer_gpu(source: Path, target: Path, mode: str) -> None:
    """The mode's filter chain with the video encoded by h264_nvenc on the GPU."""
    reason = gpu_available()
    if reason is not None:
        raise GpuUnavailable(f"gpu backend: {reason}")
    try:
        video_ffmpeg.transform(source, target, mode, encoder="h264_nvenc")
    except video_ffmpeg.FfmpegError as error:
        raise InferenceError(f"gpu backend: {error}") from None


def infer(backend: str, source: Path, target: Path, mode: str, *, endpoint_url: str | None = None,
          timeout_s: float = 60.0, api_key: str | None = None) -> None:
    """Run ``backend`` on one segment file."""
    if backend == "ffmpeg":
        infer_ffmpeg(source, target, mode)
    elif backend == "http":
        infer_http(source, target, mode, endpoint_url, timeout_s, api_key or os.environ.get("VIDEO_INFERENCE_API_KEY"))
    elif backend == "gpu":
        infer_gpu(source, target, mode)
    else:
        raise ValueError(f"unknown inference backend {backend!r}: choose one of {BACKENDS}")
    if not target.is_file() or target.stat().st_size == 0:
        raise InferenceError(f"{backend} backend wrote no output for {source.name}")
