"""ffmpeg reads an upload only with the demuxer the probe accepted, through the file protocol only (issue 50).

An upload that a playlist, manifest or list demuxer reads (HLS, DASH, concat) names other files, anywhere on the
machine: it is refused at the probe with the reason, before any ffmpeg runs. A valid container whose first bytes a
second demuxer also claims (a Matroska file whose EBML header holds a DASH manifest: PyAV's build, without DASH,
reads Matroska; ffmpeg's, with DASH, cannot choose) is read as the Matroska the probe accepted, and the files the
manifest names are never read.
"""

from __future__ import annotations

from pathlib import Path

import ffmpeg
import pytest

from tasks.video import ffmpeg as video_ffmpeg
from tasks.video import jobs as v
from tasks.video import keys
from tasks.video.ffmpeg import run
from tests.helpers.video import SEGMENT, assert_like_source, clip, process, upload

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A folder outside every job's prefix with a video no job may read (another size and length than the uploads):
    as mp4 and as the MPEG-TS an HLS playlist names."""
    folder = tmp_path_factory.mktemp("outside")
    secret = clip(folder / "secret.mp4", size="96x80", seconds=5.0)
    run(ffmpeg.input(str(secret)).output(str(folder / "secret.ts"), c="copy", f="mpegts"))
    return folder


def _hls(outside: Path) -> bytes:
    return f"#EXTM3U\n#EXT-X-TARGETDURATION:5\n#EXTINF:5.0,\n{outside / 'secret.ts'}\n#EXT-X-ENDLIST\n".encode()


def _mpd(outside: Path) -> str:
    return (
        '<MPD xmlns="urn:mpeg:dash:schema:mpd:2011" profiles="urn:mpeg:dash:profile:isoff-on-demand:2011" '
        'type="static" mediaPresentationDuration="PT5S" minBufferTime="PT1S"><Period><AdaptationSet '
        'mimeType="video/mp4"><Representation id="1" bandwidth="100000" width="96" height="80" codecs="avc1">'
        f"<BaseURL>{(outside / 'secret.mp4').as_uri()}</BaseURL><SegmentBase/></Representation></AdaptationSet>"
        "</Period></MPD>"
    )


def _dash(outside: Path) -> bytes:
    return f'<?xml version="1.0" encoding="utf-8"?>\n{_mpd(outside)}\n'.encode()


def _concat_outside(outside: Path) -> bytes:
    return f"ffconcat version 1.0\nfile '{outside / 'secret.mp4'}'\n".encode()


def _concat_beside(outside: Path) -> bytes:
    return b"ffconcat version 1.0\nfile 'other.mp4'\n"  # a file beside the upload: what `safe` lets through


LISTS = {
    "hls-playlist-named-mp4": (_hls, "source.mp4 is an HLS playlist, not a video container"),
    "dash-manifest-named-mp4": (_dash, "source.mp4 is an XML document (a DASH manifest?), not a video container"),
    "concat-list-naming-a-file-outside": (_concat_outside, "source.mp4 is an ffmpeg concat list"),
    "concat-list-naming-a-file-beside-it": (_concat_beside, "source.mp4 is an ffmpeg concat list"),
}


@pytest.mark.parametrize("name", LISTS)
def test_an_upload_that_names_other_files_is_refused_before_ffmpeg_reads_it(
    tables, store_root, outside, tmp_path, monkeypatch, name
):
    make, reason = LISTS[name]
    commands = []
    monkeypatch.setattr(video_ffmpeg, "run", lambda stream: commands.append(stream.compile()))
    upload_file = tmp_path / "upload.mp4"
    upload_file.write_bytes(make(outside))
    job_id = upload(store_root, upload_file)
    beside = store_root / keys.input_prefix(job_id) / "other.mp4"
    beside.write_bytes((outside / "secret.mp4").read_bytes())
    v.start_chunking(job_id)
    with pytest.raises(video_ffmpeg.InvalidMedia, match="playlists, manifests and lists name other files") as refused:
        v.chunk_source(job_id, SEGMENT, "grayscale")
    assert reason in str(refused.value) and f"input/{job_id}/source.mp4" in str(refused.value)
    assert isinstance(refused.value, video_ffmpeg.RefusedInput)
    assert commands == []  # refused at the probe: no ffmpeg opened it
    written = sorted(p.relative_to(store_root).as_posix() for p in store_root.rglob("*") if p.is_file())
    assert written == sorted([keys.source_key(job_id), beside.relative_to(store_root).as_posix()])


def test_a_refused_list_fails_the_job_through_the_flow_with_its_reason(tables, store_root, outside, tmp_path):
    from flows.video import video_process

    upload_file = tmp_path / "upload.mp4"
    upload_file.write_bytes(_hls(outside))
    job_id = upload(store_root, upload_file)
    with pytest.raises(v.JobFailed, match="chunking failed: input/.*/source.mp4 is an HLS playlist"):
        video_process(job_id=job_id, segment_seconds=SEGMENT, segment_retry_delays=[0, 0])
    job = v.get_job(job_id)
    assert job["status"] == v.FAILED and "is an HLS playlist" in job["failure_reason"]


def with_manifest_in_header(source: Path, path: Path, manifest: str) -> Path:
    """``source`` (Matroska) with ``manifest`` in an EBML Void element at the start of its EBML header, where the
    DASH probe finds it (no NUL byte before it) and Matroska readers skip it; the Segment after it is unchanged."""
    data = source.read_bytes()
    assert data[:4] == b"\x1a\x45\xdf\xa3" and data[4] & 0x80  # the EBML header, its size in one byte
    size = data[4] & 0x7F

    def two_byte_size(n: int) -> bytes:
        assert 0 < n < 0x3FFF and n & 0xFF  # no NUL byte in the size either
        return bytes([0x40 | n >> 8, n & 0xFF])

    void = b"\xec" + two_byte_size(len(manifest)) + manifest.encode()
    body = void + data[5 : 5 + size]
    path.write_bytes(data[:4] + two_byte_size(len(body)) + body + data[5 + size :])
    return path


def test_a_matroska_upload_that_also_looks_like_a_dash_manifest_is_read_as_matroska(
    tables, store_root, outside, tmp_path
):
    plain = clip(tmp_path / "plain.mkv", seconds=2.0)
    polyglot = with_manifest_in_header(plain, tmp_path / "polyglot.mkv", _mpd(outside))
    assert video_ffmpeg.probe(polyglot).demuxer == "matroska"
    job = process(upload(store_root, polyglot))
    assert job["source_format"] == "matroska"
    assert_like_source(plain, job, store_root)  # the upload's frames, seconds and sound: none of the secret's
    secret = video_ffmpeg.probe(outside / "secret.mp4")
    assert (job["final_frames"], job["final_size"]) != (secret.frames, f"{secret.width}x{secret.height}")


def _inputs(command: list[str]) -> list[tuple[str | None, str | None, str]]:
    """(-f, -protocol_whitelist, file name) of each input of an ffmpeg command line (input options come in pairs)."""
    found, options, at = [], {}, 1  # command[0] is the binary
    while at + 1 < len(command) and command[at].startswith("-"):
        if command[at] == "-i":
            found.append((options.get("-f"), options.get("-protocol_whitelist"), Path(command[at + 1]).name))
            options = {}
        else:
            options[command[at]] = command[at + 1]
        at += 2
    return found


def test_every_ffmpeg_input_is_pinned_to_its_demuxer_and_the_file_protocol(tables, store_root, tmp_path, monkeypatch):
    commands = []
    real = video_ffmpeg.run
    monkeypatch.setattr(video_ffmpeg, "run", lambda stream: (commands.append(stream.compile()), real(stream))[1])
    job = process(
        upload(store_root, clip(tmp_path / "upload.mkv", seconds=2.0, size="63x48", pix_fmt="yuv444p"))
    )  # normalised too
    assert job["status"] == v.COMPLETED and "normalised" in job
    inputs = [read for command in commands for read in _inputs(command)]
    assert inputs and all(protocols == "file" for _, protocols, _ in inputs), inputs
    assert ("matroska", "file", "source.mp4") in inputs  # the upload: as the probe read it (normalise, final audio)
    assert {demuxer for demuxer, _, name in inputs if name != "source.mp4"} == {"mov", "concat"}
    (join,) = [command for command in commands if "concat" in command]
    assert join[join.index("-safe") + 1] == "1"


def test_ffmpeg_pinned_to_the_probed_demuxer_never_follows_a_manifest(outside, tmp_path):
    """A DASH manifest named .mp4: ffmpeg left to guess reads the video it names (outside any job); read as the mp4
    the name claims (the probe bypassed), through the file protocol only, it is refused and nothing is written."""
    manifest = tmp_path / "source.mp4"
    manifest.write_bytes(_dash(outside))
    guessed = tmp_path / "guessed.mp4"
    run(ffmpeg.input(str(manifest)).output(str(guessed), c="copy"))
    secret = video_ffmpeg.probe(outside / "secret.mp4")
    assert video_ffmpeg.probe(guessed).frames == secret.frames  # the manifest is live: unpinned, ffmpeg follows it
    pinned = tmp_path / "pinned.mp4"
    with pytest.raises(video_ffmpeg.FfmpegRefused, match="moov atom not found"):
        run(video_ffmpeg.read(manifest, video_ffmpeg.OWN_DEMUXER).output(str(pinned), c="copy"))
    assert not pinned.exists()
