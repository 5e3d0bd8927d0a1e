"""Inference backends for one video segment: ffmpeg filter chain, HTTP endpoint, NVENC on a GPU, a text
detector that blacks out text (``tasks.video.model``), or a SageMaker-style asynchronous endpoint.

Each backend reads a local input file and writes a local output file; the caller moves bytes to and from
the object store (the async endpoint is given the segment's object URL instead and its output is fetched).
Failures raise ``InferenceError`` (retried by the task) with a message that says why.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from blocks.video import VideoInference
from tasks.core.errors import PipelineError, RefusedInput, Unavailable
from tasks.core.redact import public_url, redact, url_secrets
from tasks.video import ffmpeg as video_ffmpeg

BACKENDS = ("ffmpeg", "http", "gpu", "text-redact", "sagemaker")
REMOTE_BACKENDS = ("http", "sagemaker")  # they wait on the network: no CPU slot of this machine is held for them


class InferenceError(PipelineError, RuntimeError):
    """The backend failed on a segment (error status, timeout, unreachable, bad output)."""


class InferenceRefused(InferenceError, RefusedInput):
    """ffmpeg refused the segment or the options: the same call fails the same way, so it is not retried."""


def _ffmpeg_failure(backend: str, error: video_ffmpeg.FfmpegError) -> InferenceError:
    """The backend's error for an ffmpeg failure, InferenceRefused when ffmpeg refused (not worth a retry)."""
    kind = InferenceRefused if isinstance(error, video_ffmpeg.FfmpegRefused) else InferenceError
    return kind(f"{backend} backend: {error}")


class GpuUnavailable(InferenceError, Unavailable):
    """The gpu backend was asked for on a machine without an NVIDIA GPU / NVENC."""


def infer_ffmpeg(source: Path, target: Path, mode: str) -> None:
    """The mode's real filter chain on the CPU (libx264); identity is a stream copy."""
    try:
        video_ffmpeg.transform(source, target, mode)
    except video_ffmpeg.FfmpegError as error:
        raise _ffmpeg_failure("ffmpeg", error) from None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    return (
        parts.scheme.lower(),
        (parts.hostname or "").lower(),
        parts.port or {"http": 80, "https": 443}.get(parts.scheme),
    )


class _RedirectRefused(PipelineError):
    """A redirect that would lose the segment (the POST turned into a GET)."""


class _KeepCredentialsHome(urllib.request.HTTPRedirectHandler):
    """Follow 307/308 with the same POST body; send ``Authorization`` only back to the endpoint's own origin."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # urllib's hook
        """Follow only 307/308 (they keep the POST), and drop the credentials when the host changes."""
        if code not in (307, 308):  # 301/302/303 turn the POST into a GET without the segment
            raise _RedirectRefused(f"redirected ({code}) to {public_url(newurl)}; only 307/308 keep the segment")
        new = urllib.request.Request(
            newurl,
            data=req.data,
            method=req.get_method(),
            origin_req_host=req.origin_req_host,
            unverifiable=True,
            headers={k: v for k, v in req.headers.items() if k.lower() != "authorization"},
        )
        token = req.get_header("Authorization")
        if token and _origin(newurl) == _origin(req.full_url):  # never send credentials to another host
            new.add_header("Authorization", token)
        return new


_opener = urllib.request.build_opener(_KeepCredentialsHome)


def infer_http(
    source: Path, target: Path, mode: str, endpoint_url: str | None, timeout_s: float, api_key: str | None = None
) -> None:
    """POST the segment's bytes to ``endpoint_url`` (``?mode=``) and store the response body as the output.

    Messages name the endpoint without its query values or user info, and never hold ``api_key``.
    """
    if not endpoint_url:
        raise InferenceError(
            "http backend: no endpoint_url configured (VideoInference block / VIDEO_INFERENCE_ENDPOINT_URL)"
        )
    where = public_url(endpoint_url)
    secrets = [api_key, *url_secrets(endpoint_url)]
    separator = "&" if "?" in endpoint_url else "?"
    request = urllib.request.Request(
        f"{endpoint_url}{separator}mode={mode}",
        data=source.read_bytes(),
        method="POST",
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
    except TimeoutError:
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
    except Exception as error:  # noqa: BLE001 - no driver / library: any NVML failure means no NVENC here
        return f"no NVIDIA driver ({type(error).__name__})"
    if count == 0:
        return "no NVIDIA GPU"
    probe = subprocess.run(
        [
            video_ffmpeg.ffmpeg_exe(),
            "-hide_banner",
            "-loglevel",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=256x256:rate=10:duration=0.5",
            "-c:v",
            "h264_nvenc",
            "-f",
            "null",
            "-",
        ],
        capture_output=True,
        text=True,
        timeout=60,
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
        raise _ffmpeg_failure("gpu", error) from None


def detections_file(target: Path) -> Path:
    """Where the text-redact backend leaves a segment's detections (JSON) beside its output file."""
    return target.with_name(target.stem + ".detections.json")


def infer_text_redact(source: Path, target: Path, mode: str, batch_size: int) -> None:
    """Black out the text the detector finds in every frame, then the mode's filters; detections beside ``target``."""
    import av

    from tasks.video import model

    video_ffmpeg.libav_errors_reported()
    try:
        found = model.redact_text(source, target, mode, batch_size)
    except (av.error.FFmpegError, OSError, RuntimeError) as error:  # PyAV's and onnxruntime's errors
        message = str(error).replace(str(source), source.name).replace(str(target), target.name)
        raise InferenceError(f"text-redact backend: {type(error).__name__}: {message}") from None
    detections_file(target).write_text(json.dumps(found))


def infer_sagemaker(
    source_url: str | None,
    target: Path,
    mode: str,
    endpoint_name: str | None,
    endpoint_url: str | None,
    timeout_s: float,
    poll_s: float = 0.5,
) -> None:
    """Invoke an asynchronous endpoint with the segment's object URL (and ``mode=`` as its custom attributes),
    wait for its output object, fetch it.

    The endpoint writes its answer to the OutputLocation it returns, or an error to its FailureLocation; the
    wait ends at whichever appears first, or fails after ``timeout_s``. ``endpoint_url``: the runtime API (None:
    AWS's, or ``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``).
    """
    import boto3
    import botocore.exceptions

    from tasks.core.object_store import ObjectNotFound, open_url
    from tasks.core.state_store import BOTO_CONFIG
    from tasks.landing.sqs import aws_session

    if not endpoint_name or not source_url:
        raise InferenceError("sagemaker backend: needs an endpoint_name (VideoInference block) and the segment's URL")
    secrets = url_secrets(endpoint_url) if endpoint_url else []
    where = f"endpoint {endpoint_name}" + (f" at {public_url(endpoint_url)}" if endpoint_url else "")
    session = (
        aws_session()
    )  # the object storage block's credentials: the endpoint reads and writes that account's buckets
    runtime = (session or boto3).client("sagemaker-runtime", endpoint_url=endpoint_url, config=BOTO_CONFIG)
    try:
        answer = runtime.invoke_endpoint_async(
            EndpointName=endpoint_name,
            InputLocation=source_url,
            ContentType="video/mp4",
            CustomAttributes=f"mode={mode}",
            InvocationTimeoutSeconds=max(1, min(3600, int(timeout_s))),
        )
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
        raise InferenceError(redact(f"sagemaker backend: {where} refused the invocation: {error}", secrets)) from None
    output, failure = answer["OutputLocation"], answer.get("FailureLocation")
    deadline = time.monotonic() + timeout_s
    while True:
        store, key = open_url(output, session)
        with contextlib.suppress(ObjectNotFound):
            store.download(key, target)
            return
        if failure:
            store, key = open_url(failure, session)
            with contextlib.suppress(ObjectNotFound):
                reason = store.get_bytes(key).decode(errors="replace").strip()[:500]
                raise InferenceError(redact(f"sagemaker backend: {where} failed: {reason}", secrets))
        if time.monotonic() >= deadline:
            raise InferenceError(f"sagemaker backend: {where} wrote no output within {timeout_s:g} s ({output})")
        time.sleep(poll_s)


def infer(
    backend: str,
    source: Path,
    target: Path,
    mode: str,
    *,
    endpoint_url: str | None = None,
    timeout_s: float = 60.0,
    api_key: str | None = None,
    source_url: str | None = None,
    endpoint_name: str | None = None,
    batch_size: int = 8,
) -> None:
    """Run ``backend`` on one segment file (``source_url``: the same segment in the object store)."""
    if backend == "ffmpeg":
        infer_ffmpeg(source, target, mode)
    elif backend == "http":
        infer_http(source, target, mode, endpoint_url, timeout_s, api_key or VideoInference.env_raw("api_key"))
    elif backend == "gpu":
        infer_gpu(source, target, mode)
    elif backend == "text-redact":
        infer_text_redact(source, target, mode, batch_size)
    elif backend == "sagemaker":
        infer_sagemaker(source_url, target, mode, endpoint_name, endpoint_url, timeout_s)
    else:
        raise ValueError(f"unknown inference backend {backend!r}: choose one of {BACKENDS}")
    if not target.is_file() or target.stat().st_size == 0:
        raise InferenceError(f"{backend} backend wrote no output for {source.name}")
