"""ffmpeg and PyAV for the video pipeline: probe, segment, filter, concat, and test clips.

The binary is the one inside the ``imageio-ffmpeg`` wheel, driven through ffmpeg-python; there is no
ffprobe, so media is probed with PyAV (demuxing every packet and comparing them with what the container declares,
which finds cut-off uploads).

Every file is read with one demuxer, named, through the file protocol only: an upload with the one the probe
accepted (``MediaInfo.demuxer``, one of ``UPLOAD_DEMUXERS``), a file this module wrote with ``OWN_DEMUXER``. Left to
guess, ffmpeg may read the same bytes with another demuxer than PyAV did (its build has DASH, PyAV's has not), and
playlists, manifests and lists (hls, dash, concat, image2 patterns) open whatever files or URLs they name.

The final output gets the source's own audio track, muxed onto the joined video (the segments' audio, there for
the backends, is left out), so audio that starts late or ends early comes through whole.
"""

from __future__ import annotations

import errno
import functools
import re
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ffmpeg

from tasks.core.errors import DiskFull, PipelineError, RefusedInput

# mode -> video filter chain (None: stream copy). Every mode keeps frames, timestamps and audio as they are.
FILTERS: dict[str, str | None] = {
    "identity": None,
    "grayscale": "format=gray,format=yuv420p",
    "scale": "scale=trunc(iw/4)*2:trunc(ih/4)*2",
    "denoise": "hqdn3d=4:3:6:4.5",
}


class InvalidMedia(RefusedInput):
    """The input is not a playable video (empty, not a video, truncated or corrupt)."""


class FfmpegError(PipelineError, RuntimeError):
    """ffmpeg exited with an error; the message carries its own cause lines."""


class FfmpegRefused(FfmpegError, RefusedInput):
    """ffmpeg refused the input or the options: the same call fails the same way, so it is not retried."""


# ffmpeg failures a retry may cure: the machine, not the media (anything else on the same input fails again)
TRANSIENT_CAUSES = (
    "Cannot allocate memory",
    "Resource temporarily unavailable",
    "Killed",
    "Connection",
    "timed out",
    "Input/output error",
)
# ffmpeg's words for a write refused for want of space: a full disk (DiskFull), the job waits for room
FULL_DISK_CAUSES = ("No space left", "Disk quota exceeded")
# the demuxers an upload may be read with: containers that hold their own media. Any other is refused at the probe:
# hls, dash, concat, image2 and the like read the files or URLs an upload names (outside the job's folder too)
UPLOAD_DEMUXERS = ("mov", "matroska", "avi", "flv", "mpegts", "mpeg", "ogg", "asf", "nut", "ivf", "mxf")
OWN_DEMUXER = "mov"  # what this module writes (mp4: segments, outputs, the final)
ONLY_FILES = "file"  # the protocols ffmpeg and PyAV may open: the named local file, nothing a file names elsewhere
# what an upload refused by its demuxer looks like, by its first bytes, for the reason the job fails with
NOT_CONTAINERS = (
    (b"#EXTM3U", "an HLS playlist"),
    (b"<?xml", "an XML document (a DASH manifest?)"),
    (b"<MPD", "a DASH manifest"),
    (b"ffconcat", "an ffmpeg concat list"),
    (b"file ", "an ffmpeg concat list"),
)
# how many of ffmpeg's error lines a failure message keeps (the first ones name the cause, the last what stopped)
CAUSE_LINES, LAST_LINES = 6, 2
TIMESCALE = 90000  # one video time base for every part the concat demuxer joins (it reads all parts in the first's)
# the encoder's time base: the input stream's own, so every frame keeps its exact timestamp. Left to itself, ffmpeg
# encodes in 1/(average frame rate): a variable-rate picture's timestamps are rounded to whole average frames (a
# 12.5-then-8 fps segment of 12 frames and 1.007 s came out 1.128 s long)
KEEP_TIMESTAMPS = {"enc_time_base:v": "demux", "fps_mode": "passthrough"}


@functools.lru_cache(maxsize=1)
def ffmpeg_exe() -> str:
    """Path of the imageio-ffmpeg binary."""
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def cause_lines(stderr: str) -> list[str]:
    """ffmpeg's error lines without repeats or object addresses: the first ``CAUSE_LINES``, the last ``LAST_LINES``."""
    lines = []
    for line in stderr.strip().splitlines():
        line = re.sub(r" @ 0x[0-9a-f]+\]", "]", line.strip())
        if line and line not in lines:
            lines.append(line)
    if len(lines) > CAUSE_LINES + LAST_LINES:
        lines = lines[:CAUSE_LINES] + ["..."] + lines[-LAST_LINES:]
    return lines


def read(path: str | Path, demuxer: str):
    """``path`` as an ffmpeg-python input read with ``demuxer`` only, through the file protocol only."""
    return ffmpeg.input(str(path), f=demuxer, protocol_whitelist=ONLY_FILES)


def open_media(path: str | Path, demuxer: str = OWN_DEMUXER):
    """``path`` opened by PyAV for reading with ``demuxer`` only, through the file protocol only."""
    import av

    return av.open(str(path), format=demuxer, container_options={"protocol_whitelist": ONLY_FILES})


def run(stream) -> None:
    """Run an ffmpeg-python graph with the bundled binary; errors become FfmpegRefused (or FfmpegError when a retry
    may cure them: killed, out of memory; DiskFull when a write met a full disk) with ffmpeg's own cause lines."""
    try:
        stream.global_args("-hide_banner", "-nostdin", "-loglevel", "error").run(
            cmd=ffmpeg_exe(), capture_stdout=True, capture_stderr=True, overwrite_output=True
        )
    except ffmpeg.Error as error:
        text = (error.stderr or b"").decode(errors="replace")
        message = "ffmpeg failed: " + (" | ".join(cause_lines(text)) or "no message")
        if any(cause in text for cause in FULL_DISK_CAUSES):
            raise DiskFull(errno.ENOSPC, message) from None
        transient = any(cause in text for cause in TRANSIENT_CAUSES) or not text.strip()
        raise (FfmpegError if transient else FfmpegRefused)(message) from None


@dataclass(frozen=True)
class MediaInfo:
    duration: float  # seconds (video stream)
    frames: int  # video packets (= frames for the codecs used here)
    fps: float
    has_audio: bool
    width: int  # as stored (before rotation)
    height: int
    codec: str = ""
    rotation: int = 0  # degrees the player turns the picture (display matrix), 0/90/180/270
    audio_start: float = 0.0  # seconds after the video's first frame (negative: before it)
    audio_duration: float = 0.0
    audio_codec: str = ""
    demuxer: str = ""  # the one that read it (one of UPLOAD_DEMUXERS): ffmpeg reads the file with it alone

    @property
    def display_size(self) -> tuple[int, int]:
        """Width and height as a player shows them (rotation honoured)."""
        return (self.height, self.width) if self.rotation % 180 == 90 else (self.width, self.height)


TRUNCATION_TOLERANCE_S = 0.25  # readable packets may end this much before the container's declared duration
PREMATURE_END = ("File ended prematurely", "partial file")  # what the matroska and mov demuxers log at a cut


def _span(packets: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(start, end) in seconds of a stream's (pts, duration) packets: the last one's pts plus its duration, or plus
    the interval before it where the stored duration is none or implausibly short (mkv and webm store none; a
    stream copy from them writes a tick)."""
    if not packets:
        return None
    times = sorted(packets)
    last_pts, last_duration = times[-1]
    if len(times) > 1 and last_duration < (last_pts - times[-2][0]) / 2:
        last_duration = last_pts - times[-2][0]
    return times[0][0], last_pts + last_duration


def libav_errors_reported() -> None:
    """PyAV's errors carry libav's own last error line (e.g. "moov atom not found"), and a Capture sees every one."""
    import av.logging

    if av.logging.get_level() is None:  # libav's errors reach Python only at a set level
        av.logging.set_level(av.logging.ERROR)
    av.logging.set_skip_repeated(False)  # a second cut-off file logs the same line as the first: it must arrive too


def list_kind(path: Path) -> str | None:
    """What ``path`` is by its first bytes when it is a playlist, manifest or list (``NOT_CONTAINERS``), else None."""
    with path.open("rb") as handle:
        head = handle.read(4096).lstrip()
    return next((name for sign, name in NOT_CONTAINERS if head.startswith(sign)), None)


def refused_format(label: str, kind: str | None) -> InvalidMedia:
    """Why an upload that none of ``UPLOAD_DEMUXERS`` reads (``kind``: what it looks like) is refused."""
    what = f"{label} is {kind}, not a video container" if kind else f"{label} is not in a video container read here"
    return InvalidMedia(
        f"{what}: playlists, manifests and lists name other files, so only self-contained containers are read "
        f"({', '.join(UPLOAD_DEMUXERS)})"
    )


def probe(path: str | Path, name: str | None = None) -> MediaInfo:
    """Duration, frame count, size, rotation, audio and demuxer of a file, demuxing every packet; InvalidMedia when it
    is no video, in a format that names other files (a playlist, manifest or list: only ``UPLOAD_DEMUXERS`` read it),
    or a cut-off one (fewer readable frames or seconds than its container declares, or a partial packet).

    ``name`` (an object key) stands for the local path in messages, which never hold local paths.
    """
    import av
    import av.logging

    libav_errors_reported()
    path = Path(path)
    label = name or path.name
    size = path.stat().st_size
    if size == 0:
        raise InvalidMedia("the upload is empty (0 bytes)")
    try:
        only = {"format_whitelist": ",".join(UPLOAD_DEMUXERS), "protocol_whitelist": ONLY_FILES}
        with av.logging.Capture() as logs, av.open(str(path), container_options=only) as container:
            if not container.streams.video:
                raise InvalidMedia("the file has no video stream")
            video = container.streams.video[0]
            audio = container.streams.audio[0] if container.streams.audio else None
            streams = [s for s in (video, audio) if s is not None]
            seen: dict[object, list[tuple[float, float]]] = {video: [], audio: []}
            by_index = {s.index: (seen[s], s.time_base.numerator, s.time_base.denominator) for s in streams}
            corrupt, rotation = 0, None
            for packet in container.demux(*streams):
                pts = packet.pts
                if pts is None or packet.size == 0:  # flush packet
                    continue
                corrupt += packet.is_corrupt
                # seconds as int * num / den: one correctly rounded division, the same float as the Fraction's, at a
                # fraction of its cost (every packet of every probe: the source, each segment, each output)
                spans, num, den = by_index[packet.stream_index]
                spans.append((pts * num / den, (packet.duration or 0) * num / den))
                if rotation is None and packet.stream_index == video.index:  # decoded until a frame shows it
                    for frame in packet.decode():
                        rotation = int(round(frame.rotation or 0)) % 360
                        break
            frames = len(seen[video])
            if frames == 0:
                raise InvalidMedia("the video stream has no frames")
            (start, end), audio_span = _span(seen[video]), _span(seen[audio])
            spans = [(start, end)] + ([audio_span] if audio_span else [])
            ended = [text.strip() for _, _, text in logs if any(sign in text for sign in PREMATURE_END)]
            if ended:  # the demuxer met the end of the file inside an element (a live webm declares no duration)
                raise InvalidMedia(f"{label} is cut off: the file ends inside a packet or cluster ({ended[0]})")
            readable = max(e for _, e in spans) - min(s for s, _ in spans)
            _truncation(container, video, frames, corrupt, readable, label)
            _unfinished_fragments(_fragments(path), readable, label)
            fps = float(video.average_rate or video.guessed_rate or 0)
            return MediaInfo(
                end - start,
                frames,
                fps,
                audio_span is not None,
                video.codec_context.width,
                video.codec_context.height,
                codec=video.codec_context.name,
                rotation=rotation or 0,
                audio_start=(audio_span[0] - start) if audio_span else 0.0,
                audio_duration=(audio_span[1] - audio_span[0]) if audio_span else 0.0,
                audio_codec=audio.codec_context.name if audio_span else "",
                demuxer=container.format.name.split(",")[0],
            )
    except InvalidMedia:
        raise
    except (av.error.FFmpegError, UnicodeDecodeError, ValueError) as error:
        kind = list_kind(path)
        if kind or any("not on whitelist" in text for _, _, text in logs):
            raise refused_format(label, kind) from None
        with path.open("rb") as head:
            if head.read(8)[4:8] in (b"ftyp", b"mdat", b"wide", b"free"):  # an mp4/mov whose index never came
                raise InvalidMedia(
                    f"{label} is cut off: an mp4/mov without its index (moov atom); the recording "
                    "or the upload did not finish"
                ) from None
        message = str(error).replace(str(path), label)
        raise InvalidMedia(f"not a readable video, cut off or corrupt ({type(error).__name__}: {message})") from None


def _truncation(container, video, frames: int, corrupt: int, readable: float, label: str) -> None:
    """InvalidMedia when the readable packets fall short of what the container declares: the upload was cut off."""
    declared_frames = int(video.frames or 0)  # mp4/mov: the sample table; 0 where the container does not say
    declared = container.duration / 1_000_000 if container.duration else None  # all streams, in AV_TIME_BASE
    if corrupt:
        raise InvalidMedia(f"{label} is cut off or corrupt: {corrupt} packet(s) end before their declared size")
    if declared_frames > frames:
        raise InvalidMedia(
            f"{label} is cut off: {frames} of the {declared_frames} video frames its container declares are readable"
        )
    if declared is not None and readable + TRUNCATION_TOLERANCE_S < declared:
        raise InvalidMedia(
            f"{label} is cut off: {readable:.2f} s readable of the {declared:.2f} s its container declares"
        )


def mp4_boxes(handle, start: int, end: int) -> Iterator[tuple[str, int, int, int]]:
    """(type, offset, header size, size) of each ISO BMFF box between ``start`` and ``end`` of an open file; stops
    at a header that does not fit or is not one."""
    pos = start
    while pos + 8 <= end:
        handle.seek(pos)
        size, kind = struct.unpack(">I4s", handle.read(8))
        header = 8
        if size == 1:  # a 64-bit size follows
            if pos + 16 > end:
                return
            (size,), header = struct.unpack(">Q", handle.read(8)), 16
        elif size == 0:  # the box runs to the end
            size = end - pos
        if size < header:
            return
        yield kind.decode("latin-1"), pos, header, size
        pos += size


@dataclass(frozen=True)
class Fragments:
    """How a fragmented mp4 (a moov with ``mvex``: its samples in ``moof`` fragments after it) vouches for its end."""

    declared: float | None  # seconds the ``mehd`` box declares for all fragments; None when it has none
    closed: bool  # the ``mfra`` box (the fragments' random-access index) is there: its muxer writes it last


def _fragments(path: Path) -> Fragments | None:
    """The end marks of a fragmented mp4, None for any other file (not ISO BMFF, or a moov without ``mvex``)."""
    size = path.stat().st_size
    try:
        return _fragment_marks(path, size)
    except (struct.error, IndexError):  # a moov libav read but this reading cannot: nothing here to judge by
        return None


def _fragment_marks(path: Path, size: int) -> Fragments | None:
    """``_fragments`` of the ``size`` bytes at ``path``."""
    with path.open("rb") as handle:
        top = list(mp4_boxes(handle, 0, size))
        moov = next((box for box in top if box[0] == "moov" and box[1] + box[3] <= size), None)
        if moov is None:
            return None
        inside = {
            kind: (pos, header, length)
            for kind, pos, header, length in mp4_boxes(handle, moov[1] + moov[2], moov[1] + moov[3])
        }
        if "mvex" not in inside or "mvhd" not in inside:
            return None
        handle.seek(inside["mvhd"][0] + inside["mvhd"][1])
        version = handle.read(1)[0]
        handle.seek(inside["mvhd"][0] + inside["mvhd"][1] + (20 if version else 12))
        (timescale,) = struct.unpack(">I", handle.read(4))
        pos, header, length = inside["mvex"]
        mehd = next((box for box in mp4_boxes(handle, pos + header, pos + length) if box[0] == "mehd"), None)
        declared = None
        if mehd is not None and timescale:
            handle.seek(mehd[1] + mehd[2])
            version = handle.read(4)[0]
            (ticks,) = struct.unpack(">Q" if version else ">I", handle.read(8 if version else 4))
            declared = ticks / timescale if ticks else None
        closed = any(kind == "mfra" and pos + length <= size for kind, pos, _, length in top)
        return Fragments(declared, closed)


def _unfinished_fragments(fragments: Fragments | None, readable: float, label: str) -> None:
    """InvalidMedia for a fragmented mp4 that ends after a whole fragment (a killed recorder): its fragments fall
    short of what its ``mehd`` declares or, declaring nothing, it lacks the ``mfra`` index its muxer writes last.
    Every fragment is whole there, so nothing else shows the cut."""
    if fragments is None:
        return
    if fragments.declared is not None:
        if readable + TRUNCATION_TOLERANCE_S < fragments.declared:
            raise InvalidMedia(
                f"{label} is cut off: {readable:.2f} s readable of the {fragments.declared:.2f} s its fragments "
                "declare (mehd); the recording or the upload did not finish"
            )
        return
    if not fragments.closed:
        raise InvalidMedia(
            f"{label} is cut off: a fragmented mp4 that ends after a fragment, without the index its muxer writes "
            "last (mfra) or a declared duration (mehd); the recording or the upload did not finish"
        )


# video codecs the mp4 muxer takes by stream copy; any other source is normalised (re-encoded) before segmenting
MP4_VIDEO_CODECS = ("h264", "hevc", "vp9", "av1", "mpeg4")
# audio codecs the final mp4 takes by stream copy; any other source audio is encoded to AAC
MP4_AUDIO_CODECS = ("aac", "mp3", "opus", "flac", "alac", "ac3", "eac3")


def normalisation(info: MediaInfo) -> str | None:
    """Why the source is re-encoded before segmenting (rotated, odd sides, a codec mp4 cannot carry), or None."""
    reasons = []
    if info.rotation:
        reasons.append(f"rotated {info.rotation} degrees upright")
    width, height = info.display_size
    if width % 2 or height % 2:
        reasons.append(
            f"padded from {width}x{height} to {even_size(width, height)[0]}x{even_size(width, height)[1]} "
            "(one black row/column: yuv420p needs even sides)"
        )
    if info.codec not in MP4_VIDEO_CODECS:
        reasons.append(f"{info.codec} re-encoded as h264 (mp4 cannot carry {info.codec})")
    return "; ".join(reasons) or None


def even_size(width: int, height: int) -> tuple[int, int]:
    """The size padded up to even sides."""
    return width + width % 2, height + height % 2


def _audio_codec(source: Path, demuxer: str) -> str | None:
    """The codec of ``source``'s first audio stream (read with ``demuxer``), None when it has none."""
    with open_media(source, demuxer) as container:
        return container.streams.audio[0].codec_context.name if container.streams.audio else None


def _mp4_streams(source: Path, demuxer: str) -> list:
    """ffmpeg-python selectors of ``source``'s first video and, when mp4 can carry its codec, first audio stream."""
    stream = read(source, demuxer)
    return [stream["v:0"]] + ([stream["a:0"]] if _audio_codec(source, demuxer) in MP4_AUDIO_CODECS else [])


def normalise(source: Path, target: Path, segment_seconds: float, demuxer: str) -> None:
    """Re-encode the source's video (h264, read with ``demuxer``): upright (the rotation applied), padded to even
    sides, every frame kept with its timestamp (variable frame rate too), a keyframe every ``segment_seconds`` so
    segments cut there."""
    video, *audio = _mp4_streams(source, demuxer)
    run(
        ffmpeg.output(
            video.filter("pad", "ceil(iw/2)*2", "ceil(ih/2)*2"),
            *audio,
            str(target),
            vcodec="libx264",
            pix_fmt="yuv420p",
            preset="veryfast",
            crf=18,
            acodec="copy",
            force_key_frames=f"expr:gte(t,n_forced*{segment_seconds:g})",
            video_track_timescale=TIMESCALE,
            **KEEP_TIMESTAMPS,
        )
    )


def segment(source: Path, out_dir: Path, segment_seconds: float, demuxer: str) -> list[Path]:
    """Split ``source`` (read with ``demuxer``) with the segment muxer (stream copy of its video and, where mp4 takes
    it, its audio; cuts fall on keyframes). Returns the parts in order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pattern = out_dir / "part-%05d.mp4"
    run(
        ffmpeg.output(
            *_mp4_streams(source, demuxer),
            str(pattern),
            c="copy",
            f="segment",
            segment_time=segment_seconds,
            reset_timestamps=1,
            # no edit list: from a source without packet durations (mkv, webm) it would hide each part's last frame
            segment_format_options="use_editlist=0",
        )
    )
    parts = sorted(out_dir.glob("part-*.mp4"), key=lambda p: int(re.findall(r"\d+", p.stem)[0]))
    if not parts:
        raise InvalidMedia("ffmpeg produced no segments")
    return parts


def output_size(mode: str, width: int, height: int) -> tuple[int, int]:
    """The picture size ``mode`` makes of a ``width`` x ``height`` segment."""
    if mode == "scale":
        return max(2, width // 4 * 2), max(2, height // 4 * 2)
    return width, height


def transform(source: Path, target: Path, mode: str, encoder: str | None = None) -> None:
    """Apply ``mode``'s filter chain to the video, re-encoded (libx264 unless ``encoder``) with every frame's
    timestamp, audio copied.

    Identity without an explicit encoder is a stream copy.
    """
    if mode not in FILTERS:
        raise ValueError(f"unknown mode {mode!r}: choose one of {sorted(FILTERS)}")
    chain = FILTERS[mode]
    stream = read(source, OWN_DEMUXER)
    if chain is None and encoder is None:
        run(stream.output(str(target), c="copy", map="0"))
        return
    encoder = encoder or "libx264"
    options = {"c:v": encoder, "c:a": "copy", "map": "0", "pix_fmt": "yuv420p", **KEEP_TIMESTAMPS}
    if chain is not None:
        options["vf"] = chain
    if encoder == "libx264":
        options.update(preset="veryfast", crf=23)
    run(stream.output(str(target), **options))


RETIME_BATCH = 32  # parts one ffmpeg call remuxes at once (its open files and command line stay bounded)


def retime(parts: list[Path], folder: Path) -> list[Path]:
    """Each part's first video stream remuxed (stream copy) onto the one ``TIMESCALE`` time base, as
    ``folder/00000.mp4``, ...: one ffmpeg call for up to ``RETIME_BATCH`` parts (a process start per part cost
    more than its remux)."""
    retimed = [folder / f"{index:05d}.mp4" for index in range(len(parts))]
    for lo in range(0, len(parts), RETIME_BATCH):
        outputs = [
            read(part, OWN_DEMUXER)["v:0"].output(str(out), c="copy", video_track_timescale=TIMESCALE)
            for part, out in zip(parts[lo : lo + RETIME_BATCH], retimed[lo : lo + RETIME_BATCH])
        ]
        run(ffmpeg.merge_outputs(*outputs))
    return retimed


def video_span(path: Path) -> float:
    """Seconds from a file's first video frame to the end of its last, as ``probe`` counts them, from the video
    packets alone (no decoding, no checks: for files this module just wrote)."""
    with open_media(path) as container:
        video = container.streams.video[0]
        packets = [
            (float(packet.pts * packet.time_base), float((packet.duration or 0) * packet.time_base))
            for packet in container.demux(video)
            if packet.size and packet.pts is not None
        ]
    start, end = _span(packets) or (0.0, 0.0)
    return end - start


def concat(parts: list[Path], target: Path, audio: Path | None = None, audio_demuxer: str = OWN_DEMUXER) -> None:
    """Join the video of ``parts`` in order (stream copy), then add ``audio``'s first audio track whole (read with
    ``audio_demuxer``), where it starts there against that file's video (copied when mp4 takes its codec, else AAC).

    The concat list names each part by its bare file name beside the list (``safe`` holds: no path, no protocol),
    and every file it opens must be an mp4 read through the file protocol.

    Each part is first remuxed to one time base: the concat demuxer reads every part in the first part's, so parts
    with another (a frame-rate change, another backend's encoder) would play too fast or too slow.
    """
    with tempfile.TemporaryDirectory(prefix=".concat-", dir=target.parent) as tmp:
        listing = Path(tmp) / "concat.txt"
        lines = []
        for retimed in retime(parts, Path(tmp)):
            # each part placed after the frames before it, not after its container's duration (which counts a
            # reordering delay in, so parts drifted apart where the frame rate changes)
            lines.append(f"file '{retimed.name}'\nduration {video_span(retimed):.6f}\n")
        listing.write_text("".join(lines))
        joined = ffmpeg.input(
            str(listing), f="concat", safe=1, protocol_whitelist=ONLY_FILES, format_whitelist=f"concat,{OWN_DEMUXER}"
        )
        streams = [joined["v:0"]]
        options: dict = {"c:v": "copy", "movflags": "+faststart", "video_track_timescale": TIMESCALE}
        if audio is not None:
            streams.append(read(audio, audio_demuxer)["a:0"])
            options["c:a"] = "copy" if _audio_codec(audio, audio_demuxer) in MP4_AUDIO_CODECS else "aac"
        run(ffmpeg.output(*streams, str(target), **options))


def make_test_video(
    path: Path,
    seconds: float = 5.0,
    fps: int = 10,
    size: str = "160x120",
    keyframe_seconds: float = 1.0,
    pattern: str = "testsrc",
    overlay: str = "",
    preset: str = "veryfast",
    **output_options: Any,
) -> Path:
    """A lavfi ``pattern`` clip (``testsrc``, ``testsrc2``, ``color=c=white``, ...) through the ``overlay`` filters
    (e.g. ``drawtext=...``), ``sine`` audio and a keyframe every ``keyframe_seconds`` (so segments cut there);
    ``output_options`` go to the encoder (e.g. ``**{"b:v": "12M"}`` for a camera's bitrate)."""
    options = f"size={size}:rate={fps}:duration={seconds}"
    source = f"{pattern}:{options}" if "=" in pattern else f"{pattern}={options}"
    video = ffmpeg.input(f"{source},{overlay}" if overlay else source, f="lavfi")
    audio = ffmpeg.input(f"sine=frequency=440:sample_rate=44100:duration={seconds}", f="lavfi")
    gop = max(1, int(round(fps * keyframe_seconds)))
    run(
        ffmpeg.output(
            video,
            audio,
            str(path),
            vcodec="libx264",
            acodec="aac",
            pix_fmt="yuv420p",
            g=gop,
            keyint_min=gop,
            sc_threshold=0,
            preset=preset,
            shortest=None,
            **output_options,
        )
    )
    return path
