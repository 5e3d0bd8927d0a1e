"""The video pipeline on the files people really upload, generated here with the project's ffmpeg (probed by PyAV).

Shapes, from what the devices and programs write:
- phones: mp4/mov, h264 or hevc (``hvc1``), portrait recordings stored landscape with a display rotation, AAC;
- screen recorders: variable frame rate (the rate drops when the screen is still), often no audio, mkv (OBS);
- browsers (MediaRecorder): webm, vp8 or vp9 with opus, written live (no duration, no cues);
- cameras: mp4/mov h264 at 25 fps with stereo AAC, or PCM in mov;
- audio layouts: none, mono, stereo, starting after the first segment, ending before the video;
- odd sizes (641x359, 641x361, 1x1; yuv444p h264 and vp9 allow them);
- recorders writing as they go: fragmented mp4 (an empty moov, a moof+mdat fragment per keyframe, mfra last);
- interrupted uploads (a dropped connection: cut at a packet boundary, inside a packet, before the moov atom; a killed
  recorder: a fragmented mp4 cut between two fragments), an empty file, a text file, audio only.

Every valid shape must come out with the source's duration (0.1 s), frame count, displayed size (odd sides padded
to even, as the job records) and whole audio track; every bad one fails at chunking with a reason naming it.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tasks.video import ffmpeg as video_ffmpeg
from tasks.video import jobs as v
from tasks.video import keys
from tasks.video.ffmpeg import run
from tests.helpers.video import SEGMENT, assert_like_source, clip, lavfi, process, upload

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


def cut(source: Path, path: Path, where: str) -> Path:
    """``source`` cut off as a dropped upload leaves it: at a video packet's start, inside one, at half, or (a
    fragmented mp4) at a fragment's ``moof`` box, as a recorder killed between two fragments leaves it."""
    import av

    data = source.read_bytes()
    if where == "fragment":
        path.write_bytes(data[: fragment_starts(source)[-2]])  # the last two fragments never written
        return path
    with av.open(str(source)) as container:
        packets = [(p.pos, p.size) for p in container.demux(video=0) if p.size and p.pos is not None]
    pos, size = packets[len(packets) * 2 // 3]
    offset = {"boundary": pos, "inside": pos + size // 2, "half": len(data) // 2}[where]
    path.write_bytes(data[:offset])
    return path


def fragment_starts(source: Path) -> list[int]:
    """The offsets of a fragmented mp4's ``moof`` boxes."""
    with source.open("rb") as handle:
        return [pos for kind, pos, _, _ in video_ffmpeg.mp4_boxes(handle, 0, source.stat().st_size) if kind == "moof"]


@dataclass(frozen=True)
class Shape:
    make: Callable[[Path], Path]  # writes the upload into a folder, returns its path
    reason: str | None = None  # None: a valid upload; else what the failure reason must say
    normalised: str | None = None  # what the job records about re-encoding the picture before segmenting


def _write(name: str, **kwargs) -> Callable[[Path], Path]:
    return lambda folder: clip(folder / name, **kwargs)


def _cut(name: str, where: str, **kwargs) -> Callable[[Path], Path]:
    return lambda folder: cut(clip(folder / f"whole-{name}", **kwargs), folder / name, where)


def _text(folder: Path) -> Path:
    path = folder / "notes.txt"
    path.write_text("this is a text file, not a video\n" * 20)
    return path


def _empty(folder: Path) -> Path:
    path = folder / "empty.mp4"
    path.write_bytes(b"")
    return path


def _audio_only(folder: Path) -> Path:
    path = folder / "voice-memo.m4a"
    run(lavfi("sine=duration=1").output(str(path), acodec="aac"))
    return path


FRAGMENTED = "+frag_keyframe+empty_moov+default_base_moof"  # a fragment per keyframe, offsets within each fragment

SHAPES: dict[str, Shape] = {
    # phones
    "phone-portrait-h264-mp4": Shape(_write("p.mp4", rotation=90, size="64x48"), normalised="rotated 90 degrees"),
    "phone-portrait-hevc-mov-mono": Shape(
        _write("p.mov", rotation=-90, vcodec="libx265", audio="mono", extra={"x265-params": "log-level=error"}),
        normalised="rotated 270 degrees",
    ),
    "phone-upside-down-mp4": Shape(_write("u.mp4", rotation=180), normalised="rotated 180 degrees"),
    # screen recorders
    "screen-vfr-30-24-mp4-no-audio": Shape(_write("s.mp4", vfr=(30, 24), seconds=4.0, audio=None)),
    "screen-vfr-mkv-stereo": Shape(_write("s.mkv", vfr=(24, 30), seconds=3.0)),
    "screen-sparse-keyframes": Shape(_write("k.mp4", keyframe_s=10, seconds=3.0)),  # one keyframe: one segment
    # recorders that write as they go (fragmented mp4: an empty moov, then moof+mdat per keyframe, mfra last; a live
    # encoder: no B-frames)
    "recorder-fragmented-mp4": Shape(_write("r.mp4", seconds=3.0, extra={"movflags": FRAGMENTED, "bf": 0})),
    # browsers (MediaRecorder writes live webm: no duration, no cues)
    "browser-webm-vp8-opus-live": Shape(
        _write("b.webm", vcodec="libvpx", acodec="libopus", extra={"live": 1}), normalised="vp8 re-encoded as h264"
    ),
    "browser-webm-vp9-opus": Shape(_write("b9.webm", vcodec="libvpx-vp9", acodec="libopus")),
    # cameras
    "camera-mp4-25fps-stereo": Shape(_write("c.mp4", fps=25, seconds=2.0)),
    "camera-mov-pcm": Shape(_write("c.mov", fps=25, seconds=2.0, acodec="pcm_s16le")),
    # audio layouts
    "audio-mono-mkv": Shape(_write("m.mkv", audio="mono")),
    "audio-starts-after-segment-0": Shape(_write("late.mp4", seconds=4.0, audio_start=2.5)),
    "audio-shorter-than-video": Shape(_write("short.mp4", seconds=3.0, audio_seconds=1.2)),
    # odd sizes
    "odd-641x359-h264-444": Shape(
        _write("o1.mp4", size="641x359", seconds=1.0, pix_fmt="yuv444p"), normalised="padded from 641x359 to 642x360"
    ),
    "odd-641x361-vp9-webm": Shape(
        _write("o2.webm", size="641x361", seconds=1.0, vcodec="libvpx-vp9", acodec="libopus"),
        normalised="padded from 641x361 to 642x362",
    ),
    "odd-1x1": Shape(_write("o3.mp4", size="1x1", seconds=1.0, pix_fmt="yuv444p"), normalised="padded from 1x1 to 2x2"),
    # what must fail at chunking
    "interrupted-mp4-at-packet-boundary": Shape(
        _cut("i1.mp4", "boundary", extra={"movflags": "+faststart"}),
        reason="source.mp4 is cut off: 20 of the 30 video frames",
    ),
    "interrupted-mp4-inside-a-packet": Shape(
        _cut("i2.mp4", "inside", extra={"movflags": "+faststart"}),
        reason="source.mp4 is cut off: the file ends inside a packet",
    ),
    "interrupted-mp4-before-moov": Shape(
        _cut("i3.mp4", "half"), reason="source.mp4 is cut off: an mp4/mov without its index"
    ),
    "interrupted-mkv": Shape(
        _cut("i4.mkv", "boundary"), reason="source.mp4 is cut off: the file ends inside a packet or cluster"
    ),
    "interrupted-webm-live-recording": Shape(
        _cut("i5.webm", "boundary", vcodec="libvpx", acodec="libopus", extra={"live": 1}),
        reason="source.mp4 is cut off: the file ends inside a packet or cluster (File ended prematurely)",
    ),
    "interrupted-fragmented-mp4-at-a-fragment": Shape(
        _cut("i6.mp4", "fragment", seconds=3.0, extra={"movflags": FRAGMENTED}),
        reason="source.mp4 is cut off: a fragmented mp4 that ends after a fragment, without the index its muxer "
        "writes last (mfra) or a declared duration (mehd)",
    ),
    "empty": Shape(_empty, reason="the upload is empty (0 bytes)"),
    "not-a-video": Shape(_text, reason="not a readable video"),
    "audio-only": Shape(_audio_only, reason="the file has no video stream"),
}
VALID = [name for name, shape in SHAPES.items() if shape.reason is None]
BAD = [name for name, shape in SHAPES.items() if shape.reason is not None]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("uploads")
    return {name: shape.make(folder) for name, shape in SHAPES.items()}


@pytest.mark.parametrize("name", VALID)
def test_a_valid_upload_comes_out_like_its_source(tables, store_root, corpus, name):
    job = process(upload(store_root, corpus[name]))
    assert_like_source(corpus[name], job, store_root)
    expected = SHAPES[name].normalised
    assert (expected in job.get("normalised", "")) if expected else "normalised" not in job
    print(
        f"{name}: completed, {job['total_segments']} segments, {job['final_frames']} frames, "
        f"{job['final_duration']:.2f} s, {job['final_size']}, audio {job['final_audio_duration']:.2f} s"
        + (f", {job['normalised']}" if job.get("normalised") else "")
    )


@pytest.mark.parametrize("name", BAD)
def test_a_bad_upload_fails_at_chunking_with_its_reason(tables, store_root, corpus, name):
    job_id = upload(store_root, corpus[name])
    v.start_chunking(job_id)
    with pytest.raises(video_ffmpeg.InvalidMedia) as failure:
        v.chunk_source(job_id, SEGMENT, "grayscale")
    assert SHAPES[name].reason in str(failure.value)
    assert (
        f"input/{job_id}/source.mp4" in str(failure.value)
        or "upload" in str(failure.value)
        or "file" in str(failure.value)
    )
    assert sorted(p.relative_to(store_root).as_posix() for p in store_root.rglob("*") if p.is_file()) == [
        keys.source_key(job_id)
    ]  # nothing but the upload was written
    print(f"{name}: failed at chunking: {failure.value}")


def with_declared_duration(source: Path, path: Path, seconds: float) -> Path:
    """``source`` (fragmented, offsets within each fragment) with an ``mehd`` box declaring ``seconds`` for all its
    fragments and without its closing ``mfra``: a recorder that states the length up front and writes no index."""
    data = source.read_bytes()
    with source.open("rb") as handle:
        top = {kind: (pos, length) for kind, pos, _, length in video_ffmpeg.mp4_boxes(handle, 0, len(data))}
        moov, _ = top["moov"]
        inside = {kind: pos for kind, pos, _, _ in video_ffmpeg.mp4_boxes(handle, moov + 8, moov + top["moov"][1])}
    mvhd, mvex = inside["mvhd"], inside["mvex"]
    assert data[mvhd + 8] == 0  # mvhd version 0: the timescale 20 bytes in
    (timescale,) = struct.unpack(">I", data[mvhd + 20 : mvhd + 24])
    mehd = struct.pack(">I4sII", 16, b"mehd", 0, round(seconds * timescale))
    grown = bytearray(data[: top["mfra"][0]])
    for box in (moov, mvex):  # both hold the new box
        grown[box : box + 4] = struct.pack(">I", struct.unpack(">I", grown[box : box + 4])[0] + len(mehd))
    path.write_bytes(bytes(grown[: mvex + 8]) + mehd + bytes(grown[mvex + 8 :]))
    return path


@pytest.fixture(scope="module")
def declaring(tmp_path_factory) -> Path:
    """A 3 s fragmented mp4 whose ``mehd`` declares its 3 s, with no ``mfra``."""
    folder = tmp_path_factory.mktemp("declaring")
    whole = clip(folder / "whole.mp4", seconds=3.0, extra={"movflags": FRAGMENTED})
    return with_declared_duration(whole, folder / "declaring.mp4", 3.0)


def test_a_fragmented_mp4_that_declares_its_duration_needs_no_index(declaring):
    """Complete by its ``mehd``: every fragment it declares is there, so the missing ``mfra`` does not matter."""
    info = video_ffmpeg.probe(declaring)
    assert (info.frames, round(info.duration, 2)) == (30, 3.0)


def test_a_fragmented_mp4_short_of_its_declared_duration_is_cut_off(declaring, tmp_path):
    """Cut at a fragment: fewer seconds than its ``mehd`` declares."""
    short = r"^cut\.mp4 is cut off: 2\.\d\d s readable of the 3\.00 s its fragments declare \(mehd\)"
    with pytest.raises(video_ffmpeg.InvalidMedia, match=short):
        video_ffmpeg.probe(cut(declaring, tmp_path / "cut.mp4", "fragment"))


HARD = "hard-case"  # rotated, odd-sized, variable frame rate, audio starting after segment 0, in a mov


@pytest.fixture(scope="module")
def hard_clip(tmp_path_factory) -> Path:
    return clip(
        tmp_path_factory.mktemp("hard") / "hard.mov",
        size="63x47",
        vfr=(30, 20),
        seconds=3.0,
        pix_fmt="yuv444p",
        rotation=90,
        audio_start=1.4,
        audio="mono",
    )


MODES = sorted(video_ffmpeg.FILTERS)


@pytest.mark.parametrize(
    ("backend", "mode"),
    [("ffmpeg", mode) for mode in MODES]
    + [("http", "identity"), ("text-redact", "grayscale"), ("sagemaker", "identity")],
)
def test_every_backend_and_mode_keeps_the_source_whole(tables, store_root, hard_clip, backend, mode, request):
    if backend == "http":
        request.getfixturevalue("http_backend")
    if backend == "sagemaker":
        request.getfixturevalue("endpoint")
    job = process(upload(store_root, hard_clip, mode=mode), backend)
    assert job["normalised"].startswith("rotated 90 degrees upright; padded from 47x63 to 48x64")
    assert_like_source(hard_clip, job, store_root)


def test_reassembly_fails_the_job_when_the_final_lost_the_sound(tables, store_root, corpus, monkeypatch):
    """The check before `completed`: a final without the source's audio is a failed job with the reason."""
    job_id = upload(store_root, corpus["audio-starts-after-segment-0"])
    job = v.start_chunking(job_id)
    for key in v.chunk_source(job_id, SEGMENT, job["mode"]):
        v.infer_segment(key, backend="ffmpeg")
    concat = video_ffmpeg.concat
    monkeypatch.setattr(video_ffmpeg, "concat", lambda parts, target, *audio: concat(parts, target))
    with pytest.raises(v.JobFailed, match="does not match the source: it has no audio, the source has audio"):
        v.reassemble(job_id)
    assert v.get_job(job_id)["status"] == v.FAILED


# --------------------------------------------------------------------------- through the flow


def _flow(**params) -> dict:
    from flows.video import video_process

    return video_process(**{"segment_seconds": SEGMENT, "segment_retry_delays": [0, 0], **params})


def test_a_cut_off_upload_fails_once_at_chunking_through_the_flow(tables, store_root, corpus, monkeypatch):
    probes = []
    real = video_ffmpeg.probe
    monkeypatch.setattr(video_ffmpeg, "probe", lambda path, name=None: probes.append(name) or real(path, name))
    job_id = upload(store_root, corpus["interrupted-mp4-at-packet-boundary"])
    with pytest.raises(v.JobFailed, match="chunking failed: input/.*/source.mp4 is cut off: 20 of the 30 video frames"):
        _flow(job_id=job_id)
    assert probes == [keys.source_key(job_id)]  # one attempt: no retry of bad input
    job = v.get_job(job_id)
    assert job["status"] == v.FAILED and "total_segments" not in job


@pytest.mark.sweep  # a full flow through two failing segments: about a minute on 2 cores
def test_an_ffmpeg_refusal_is_not_retried_and_keeps_its_cause_line(tables, store_root, corpus, monkeypatch):
    """A deterministic failure (here a filter asking for a picture larger than the frame) fails the segment at
    once, with ffmpeg's own line naming the cause, not only the exit code."""
    monkeypatch.setitem(video_ffmpeg.FILTERS, "grayscale", "crop=4000:4000")
    calls = []
    real = video_ffmpeg.transform
    monkeypatch.setattr(video_ffmpeg, "transform", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    job_id = upload(store_root, corpus["camera-mp4-25fps-stereo"])
    with pytest.raises(v.JobFailed) as failure:
        _flow(job_id=job_id, max_parallel_segments=1)
    job = v.get_job(job_id)
    assert len(calls) == job["total_segments"] == 2  # once per segment: no retries
    assert "2 of 2 segments failed after retries" in job["failure_reason"]
    assert "Invalid too big or non positive size for width '4000' or height '4000'" in job["failure_reason"]
    assert "@ 0x" not in job["failure_reason"] and str(store_root) not in str(failure.value)


def test_cause_lines_keep_the_first_and_the_last_error_lines():
    stderr = "\n".join(
        [
            "[libx264 @ 0x5617a718acc0] width not divisible by 2 (641x359)",
            *[f"[vf#0:0 @ 0x1] line {i}" for i in range(10)],
            "[vf#0:0 @ 0x1] line 3",
            "Conversion failed!",
        ]
    )
    lines = video_ffmpeg.cause_lines(stderr)
    assert lines[0] == "[libx264] width not divisible by 2 (641x359)"
    assert lines[-1] == "Conversion failed!" and "..." in lines
    assert len(lines) == video_ffmpeg.CAUSE_LINES + 1 + video_ffmpeg.LAST_LINES


def test_remote_backends_wait_without_holding_a_cpu_slot(tables, store_root, corpus, http_backend, monkeypatch):
    """With one CPU slot on the machine, three segments still wait on the http endpoint at once."""
    monkeypatch.setenv("PIPELINES_CPU_HEAVY_SLOTS", "1")
    monkeypatch.setenv("PIPELINES_CPU_SLOTS_DIR", str(store_root.parent / "slots"))
    barrier = threading.Barrier(3, timeout=20)
    waited = []
    post = http_backend.do_POST

    def meet(self):  # each request waits for the other two: only concurrent requests pass without a timeout
        try:
            barrier.wait()
            waited.append(True)
        except threading.BrokenBarrierError:
            waited.append(False)
        post(self)

    http_backend.do_POST = meet
    job_id = upload(store_root, corpus["audio-starts-after-segment-0"], mode="identity", segment_seconds=1.5)
    job = _flow(job_id=job_id, mode="identity", backend="http", segment_seconds=1.5, max_parallel_segments=3)
    assert job["status"] == v.COMPLETED and job["total_segments"] == 3
    assert waited == [True, True, True]
