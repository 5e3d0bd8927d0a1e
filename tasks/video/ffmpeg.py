"""ffmpeg and PyAV for the video pipeline: probe, segment, filter, concat, and test clips.

The binary is the one inside the ``imageio-ffmpeg`` wheel, driven through ffmpeg-python; there is no
ffprobe, so media is probed with PyAV (demuxing every packet, which also finds truncated files).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import ffmpeg

# mode -> video filter chain (None: stream copy). Every mode keeps frames, timestamps and audio as they are.
FILTERS: dict[str, str | None] = {
    "identity": None,
    "grayscale": "format=gray,format=yuv420p",
    "scale": "scale=trunc(iw/4)*2:trunc(ih/4)*2",
    "denoise": "hqdn3d=4:3:6:4.5",
}


class InvalidMedia(ValueError):
    """The input is not a playable video (empty, not a video, truncated or corrupt)."""


class FfmpegError(RuntimeError):
    """ffmpeg exited with an error; the message carries the tail of its stderr."""


@functools.lru_cache(maxsize=1)
def ffmpeg_exe() -> str:
    """Path of the imageio-ffmpeg binary."""
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def run(stream) -> None:
    """Run an ffmpeg-python graph with the bundled binary; errors become FfmpegError with stderr's tail."""
    try:
        stream.global_args("-hide_banner", "-nostdin", "-loglevel", "error").run(
            cmd=ffmpeg_exe(), capture_stdout=True, capture_stderr=True, overwrite_output=True
        )
    except ffmpeg.Error as error:
        tail = (error.stderr or b"").decode(errors="replace").strip().splitlines()[-3:]
        raise FfmpegError("ffmpeg failed: " + (" | ".join(tail) or "no message")) from None


@dataclass(frozen=True)
class MediaInfo:
    duration: float  # seconds (video stream)
    frames: int  # video packets (= frames for the codecs used here)
    fps: float
    has_audio: bool
    width: int
    height: int


def probe(path: str | Path, name: str | None = None) -> MediaInfo:
    """Duration, frame count and audio of a file, demuxing every packet; InvalidMedia when it is no video.

    ``name`` (an object key) stands for the local path in messages, which never hold local paths.
    """
    import av

    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise InvalidMedia("the upload is empty (0 bytes)")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise InvalidMedia("the file has no video stream")
            video = container.streams.video[0]
            has_audio = bool(container.streams.audio)
            frames, first, last, last_duration = 0, None, None, 0
            for packet in container.demux(video):
                if packet.size == 0 or packet.pts is None:  # flush packet
                    continue
                frames += 1
                first = packet.pts if first is None else min(first, packet.pts)
                if last is None or packet.pts >= last:
                    last, last_duration = packet.pts, packet.duration or 0
            if frames == 0:
                raise InvalidMedia("the video stream has no frames")
            duration = float((last - first + last_duration) * video.time_base)
            fps = float(video.average_rate or video.guessed_rate or 0)
            return MediaInfo(duration, frames, fps, has_audio, video.codec_context.width, video.codec_context.height)
    except InvalidMedia:
        raise
    except (av.error.FFmpegError, UnicodeDecodeError, ValueError) as error:
        message = str(error).replace(str(path), name or path.name)
        raise InvalidMedia(f"not a readable video ({type(error).__name__}: {message})") from None


def segment(source: Path, out_dir: Path, segment_seconds: float) -> list[Path]:
    """Split ``source`` with the segment muxer (stream copy; cuts fall on keyframes). Returns the parts in order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pattern = out_dir / "part-%05d.mp4"
    run(
        ffmpeg.input(str(source)).output(
            str(pattern), c="copy", map="0", f="segment", segment_time=segment_seconds, reset_timestamps=1
        )
    )
    parts = sorted(out_dir.glob("part-*.mp4"), key=lambda p: int(re.findall(r"\d+", p.stem)[0]))
    if not parts:
        raise InvalidMedia("ffmpeg produced no segments")
    return parts


def transform(source: Path, target: Path, mode: str, encoder: str | None = None) -> None:
    """Apply ``mode``'s filter chain, video re-encoded (libx264 unless ``encoder``), audio copied.

    Identity without an explicit encoder is a stream copy.
    """
    if mode not in FILTERS:
        raise ValueError(f"unknown mode {mode!r}: choose one of {sorted(FILTERS)}")
    chain = FILTERS[mode]
    stream = ffmpeg.input(str(source))
    if chain is None and encoder is None:
        run(stream.output(str(target), c="copy", map="0"))
        return
    encoder = encoder or "libx264"
    options = {"c:v": encoder, "c:a": "copy", "map": "0", "pix_fmt": "yuv420p"}
    if chain is not None:
        options["vf"] = chain
    if encoder == "libx264":
        options.update(preset="veryfast", crf=23)
    run(stream.output(str(target), **options))


def concat(parts: list[Path], target: Path) -> None:
    """Join ``parts`` in order with the concat demuxer (stream copy)."""
    listing = target.with_name(target.name + ".concat.txt")
    listing.write_text("".join("file '{}'\n".format(str(p).replace("'", r"'\''")) for p in parts))
    try:
        run(ffmpeg.input(str(listing), f="concat", safe=0).output(str(target), c="copy", map="0", movflags="+faststart"))
    finally:
        listing.unlink(missing_ok=True)


def make_test_video(
    path: Path, seconds: float = 5.0, fps: int = 10, size: str = "160x120", keyframe_seconds: float = 1.0
) -> Path:
    """A ``testsrc`` clip with ``sine`` audio and a keyframe every ``keyframe_seconds`` (so segments cut there)."""
    video = ffmpeg.input(f"testsrc=size={size}:rate={fps}:duration={seconds}", f="lavfi")
    audio = ffmpeg.input(f"sine=frequency=440:sample_rate=44100:duration={seconds}", f="lavfi")
    gop = max(1, int(round(fps * keyframe_seconds)))
    run(
        ffmpeg.output(
            video, audio, str(path), vcodec="libx264", acodec="aac", pix_fmt="yuv420p", g=gop,
            keyint_min=gop, sc_threshold=0, preset="veryfast", shortest=None,
        )
    )
    return path
