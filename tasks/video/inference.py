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
import urllib.parse
import urllib.request
from pathlib import Path

from tasks.core.redact import public_url, redact, url_secrets
from tasks.video import ffmpeg as video_ffmpeg

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


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(parts.scheme)


class _RedirectRefused(Exception):
    """A redirect that would lose the segment (the POST turned into a GET)."""


class _KeepCredentialsHome(urllib.request.HTTPRedirectHandler):
    """Follow 307/308 with the same POST body; send ``Authorization`` only back to the endpoint's own origin."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 - urllib's hook
        """Follow only 307/308 (they keep the POST), and drop the credentials when the host changes."""
        if code not in (307, 308):  # 301/302/303 turn the POST into a GET without the segment
            raise _RedirectRefused(f"redirected ({code}) to {public_url(newurl)}; only 307/308 keep the segment")
        new = urllib.request.Request(
            newurl, data=req.data, method=req.get_method(), origin_req_host=req.origin_req_host, unverifiable=True,
            headers={k: v for k, v in req.headers.items() if k.lower() != "authorization"},
        )
        token = req.get_header("Authorization")
        if token and _origin(newurl) == _origin(req.full_url):  # never send credentials to another host
            new.add_header("Authorization", token)
        return new


_opener = urllib.request.build_opener(_KeepCredentialsHome)


def infer_http(source: Path, target: Path, mode: str, endpoint_url: str | None, timeout_s: float,
               api_key: str | None = None) -> None:
    """POST the segment's bytes to ``endpoint_url`` (``?mode=``) and store the response body as the output.

    Messages name the endpoint without its query values or user info, and never hold ``api_key``.
    """
    if not endpoint_url:
        raise InferenceError("http backend: no endpoint_url configured (VideoInference block / VIDEO_INFERENCE_ENDPOINT_URL)")
    where = public_url(endpoint_url)
    secrets = [api_key, *url_secrets(endpoint_url)]
    separator = "&" if "?" in endpoint_url else "?"
    request = urllib.request.Request(
        f"{endpoint_url}{separator}mode={mode}", data=source.read_bytes(), method="POST",
        headers={"Content-Type": "video/mp4"},
    )
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")

    def fail(what: str) -> InferenceError:
        """The error for ``what`` went wrong, with the endpoint and secrets redacted."""
        return InferenceError(redact(f"http backend: {where} {what}", secrets))

    try:
        with _opener.open(request, timeout=timeout_s) as response:
            body = response.read()
    except _RedirectRefused as error:
        raise fail(str(error)) from None
    except urllib.error.HTTPError as error:
        raise fail(f"answered {error.code} {error.reason}") from None
    except (TimeoutError, socket.timeout):
        raise fail(f"timed out after {timeout_s:g} s") from None
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise fail(f"timed out after {timeout_s:g} s") from None
        raise fail(f"unreachable ({reason})") from None
    if not body:
        raise fail("returned an empty body")
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
