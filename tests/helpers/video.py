"""Video test helpers: inference endpoints on loopback (an echoing HTTP one, two for redirects, the SageMaker-style
stand-in), clips as devices write them, and a job uploaded and run through the flow's steps."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import ffmpeg
import pytest

from tasks.video import ffmpeg as video_ffmpeg
from tasks.video import jobs as v
from tasks.video.ffmpeg import probe, run
from tests.helpers.sagemaker_standin import AsyncEndpoint

SEGMENT = 1.0  # seconds per segment of the jobs made here


class _Backend(http.server.BaseHTTPRequestHandler):
    """A local inference endpoint: echoes the segment (``ok``), answers 500 (``error``) or stalls (``slow``)."""

    behaviour = "ok"
    requests: list[str] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests.append(self.path)
        if self.behaviour == "error":
            self.send_error(500, "model crashed")
            return
        if self.behaviour == "slow":
            time.sleep(1.5)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_backend(monkeypatch):
    """An inference endpoint on 127.0.0.1 in a thread; returns its handler class to set the behaviour."""
    handler = type("Handler", (_Backend,), {"behaviour": "ok", "requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("VIDEO_INFERENCE_ENDPOINT_URL", f"http://127.0.0.1:{server.server_address[1]}/infer")
    monkeypatch.setenv("VIDEO_INFERENCE_TIMEOUT_S", "30")  # generous: a loaded CI machine must not time out
    yield handler
    server.shutdown()
    server.server_close()


class _Endpoint(http.server.BaseHTTPRequestHandler):
    """``ok``: echo; ``json``: 200 with a JSON error body; ``redirect-NNN``: to ``target``; ``echo-key``: 500 naming
    the URL; ``hold-after-first``: echo the first request, hold later ones until the behaviour changes."""

    behaviour, target = "ok", ""
    seen: list[dict] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append(
            {"path": self.path, "authorization": self.headers.get("Authorization"), "size": len(body)}
        )
        while self.behaviour == "hold-after-first" and len(self.seen) > 1:  # one answer, then hang until told
            time.sleep(0.1)
        if self.behaviour.startswith("redirect-"):
            self.send_response(int(self.behaviour.split("-")[1]))
            self.send_header("Location", self.target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.behaviour == "echo-key":
            self.send_error(500, f"bad request {self.path} from {self.headers.get('Authorization')}")
            return
        answer = b'{"error": "model overloaded, try later"}' if self.behaviour == "json" else body
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_POST  # a 302 turns the POST into a GET

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoints():
    """Two endpoints on 127.0.0.1 (two origins: different ports); yields their handler classes and URLs."""
    started = []
    for _ in range(2):
        handler = type("Handler", (_Endpoint,), {"behaviour": "ok", "target": "", "seen": []})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append((server, handler, f"http://127.0.0.1:{server.server_address[1]}"))
    yield [(handler, url) for _, handler, url in started]
    for server, _, _ in started:
        server.shutdown()
        server.server_close()


@pytest.fixture
def endpoint(tmp_path, monkeypatch):
    """The stand-in endpoint named text-redact, configured as the VideoInference block's sagemaker backend."""
    standin = AsyncEndpoint((tmp_path / "sagemaker").as_uri())
    monkeypatch.setenv("VIDEO_INFERENCE_ENDPOINT_URL", standin.url)
    monkeypatch.setenv("VIDEO_INFERENCE_ENDPOINT_NAME", "text-redact")
    monkeypatch.setenv("VIDEO_INFERENCE_TIMEOUT_S", "30")
    yield standin
    standin.close()


def lavfi(spec: str):
    """An ffmpeg lavfi source (``testsrc=...``, ``sine=...``)."""
    return ffmpeg.input(spec, f="lavfi")


def clip(
    path: Path,
    *,
    size: str = "64x48",
    fps: float = 10,
    seconds: float = 3.0,
    vcodec: str = "libx264",
    pix_fmt: str = "yuv420p",
    audio: str | None = "stereo",
    audio_start: float = 0.0,
    audio_seconds: float | None = None,
    acodec: str = "aac",
    rotation: int = 0,
    keyframe_s: float = 0.5,
    vfr: tuple[float, float] | None = None,
    extra: dict | None = None,
) -> Path:
    """A ``testsrc`` clip as a device would write it (codec, container from the suffix, rotation, audio layout)."""
    if vfr:  # the first half at vfr[0] fps, the second at vfr[1]: one stream, frame durations changing
        halves = [
            lavfi(f"testsrc=size={size}:rate={rate}:duration={seconds / 2}:decimals={i}").filter("settb", "1/720")
            for i, rate in enumerate(vfr)
        ]  # two different sources: ffmpeg-python merges equal nodes
        video = ffmpeg.concat(*halves, v=1, a=0)
    else:
        video = lavfi(f"testsrc=size={size}:rate={fps}:duration={seconds}")
    streams = [video]
    options = {
        "vcodec": vcodec,
        "pix_fmt": pix_fmt,
        "fps_mode": "passthrough",
        "force_key_frames": f"expr:gte(t,n_forced*{keyframe_s})",
        **(extra or {}),
    }
    if vcodec == "libx264":
        options.update(preset="veryfast")
    if vcodec.startswith("libvpx"):
        options.update({"b:v": "300k", "deadline": "realtime", "cpu-used": 8})
    if audio:
        layout = {"mono": "mono", "stereo": "stereo"}[audio]
        length = audio_seconds if audio_seconds is not None else seconds - audio_start
        sound = lavfi(f"sine=frequency=440:sample_rate=48000:duration={length}")
        sound = sound.filter("aformat", channel_layouts=layout)
        if audio_start:  # the track begins later in the file (its first timestamp), as a late-starting recorder writes
            sound = sound.filter("asetpts", f"PTS+{audio_start}/TB")
        streams.append(sound)
        options["acodec"] = acodec
    if not rotation:
        run(ffmpeg.output(*streams, str(path), **options))
        return path
    # a display matrix, as phones store a portrait recording: a second pass sets it (stream copy)
    plain = path.with_name("unrotated-" + path.name)
    run(ffmpeg.output(*streams, str(plain), **options))
    tag = {"tag:v": "hvc1"} if vcodec == "libx265" else {}  # Apple's tag for hevc
    run(ffmpeg.input(str(plain), display_rotation=rotation).output(str(path), c="copy", **tag))
    plain.unlink()
    return path


def upload_bytes(data: bytes, mode: str = "identity") -> str:
    """A new job with ``data`` at its upload target; its id."""
    job = v.create_job(mode=mode, segment_seconds=SEGMENT)
    Path(job["upload_target"]).write_bytes(data)
    return job["job_id"]


def upload(store_root: Path, source: Path, mode: str = "grayscale", segment_seconds: float = SEGMENT) -> str:
    """A new job with the file ``source`` at its upload target; its id."""
    job = v.create_job(mode=mode, segment_seconds=segment_seconds)
    Path(job["upload_target"]).write_bytes(source.read_bytes())
    return job["job_id"]


def process(job_id: str, backend: str = "ffmpeg") -> dict:
    """The flow's steps as plain task bodies: chunk, every segment through ``backend``, reassemble."""
    job = v.start_chunking(job_id)
    for key in v.chunk_source(job_id, float(job["segment_seconds"]), job["mode"]):
        assert "output_key" in v.infer_segment(key, backend=backend)
    v.reassemble(job_id)
    return v.get_job(job_id)


def assert_like_source(source: Path, job: dict, store_root: Path) -> None:
    """Item 1's invariants: the final has the source's frames, duration, displayed size and whole audio track."""
    want, final = probe(source), probe(store_root / job["final_key"])
    assert job["status"] == v.COMPLETED
    assert final.frames == want.frames == job["final_frames"]
    assert abs(final.duration - want.duration) <= 0.1, (final.duration, want.duration)
    width, height = want.display_size
    if job.get("normalised"):  # odd sides padded to even (stated in the job)
        width, height = video_ffmpeg.even_size(width, height)
    assert final.display_size == video_ffmpeg.output_size(job["mode"], width, height)
    assert job["output_size"] == job["final_size"] == "{}x{}".format(*final.display_size)
    assert final.has_audio == want.has_audio
    if want.has_audio:
        assert abs(final.audio_duration - want.audio_duration) <= 0.1, (final.audio_duration, want.audio_duration)
        assert abs(final.audio_start - want.audio_start) <= 0.1, (final.audio_start, want.audio_start)
