"""Property: for any picture size, frame rate (constant or changing half-way), segment length and audio layout,
the video pipeline's final output has the source's frames, duration, displayed size and whole audio track."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tasks.video import ffmpeg as video_ffmpeg
from tests.helpers.video import assert_like_source, clip, process, upload

# few draws in `make test`; `make test-sweep` draws many more. Derandomized (the same draws on every run, so CI is
# never red by the luck of a draw), no deadline (ffmpeg's time on a loaded machine), no health checks on speed
SLOW_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
QUICK = settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=SLOW_OK)
SWEEP = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=SLOW_OK)

uploads = st.fixed_dictionaries(
    {
        "width": st.integers(1, 96),
        "height": st.integers(1, 72),
        "fps": st.sampled_from([8, 10, 12.5, 15, 24, 25, 29.97, 30]),
        "second_fps": st.none() | st.sampled_from([8, 10, 15, 24, 30]),  # a frame-rate change half-way
        "seconds": st.sampled_from([1.0, 1.5, 2.0, 2.5, 3.0]),
        "segment_seconds": st.sampled_from([0.5, 1.0, 1.5, 2.0]),
        "audio_start": st.none() | st.sampled_from([0.0, 0.3, 0.9, 1.6]),  # None: no audio
        "rotation": st.sampled_from([0, 0, 90, 180, -90]),
        "mode": st.sampled_from(sorted(video_ffmpeg.FILTERS)),
    }
)


# found by the sweep: the encoder rounded a frame-rate change's timestamps to whole average frames, so the denoised
# segment 0 (12 frames, 1.007 s) came out 1.128 s long and the job failed
VFR_DENOISE = {
    "width": 2,
    "height": 1,
    "fps": 12.5,
    "second_fps": 8,
    "seconds": 1.5,
    "segment_seconds": 1.0,
    "audio_start": None,
    "rotation": 0,
    "mode": "denoise",
}


def _check(draw: dict, store_root, folder) -> None:
    seconds, audio_start = draw["seconds"], draw["audio_start"]
    if audio_start is not None and audio_start >= seconds:
        audio_start = seconds / 2
    source = clip(
        folder / f"{uuid.uuid4().hex}.mp4",
        size=f"{draw['width']}x{draw['height']}",
        fps=draw["fps"],
        seconds=seconds,
        pix_fmt="yuv444p",
        rotation=draw["rotation"],
        keyframe_s=0.5,
        audio=None if audio_start is None else "stereo",
        audio_start=audio_start or 0.0,
        vfr=(draw["fps"], draw["second_fps"]) if draw["second_fps"] else None,
    )
    job = process(upload(store_root, source, mode=draw["mode"], segment_seconds=draw["segment_seconds"]))
    assert_like_source(source, job, store_root)


@QUICK
@given(draw=uploads)
@example(draw=VFR_DENOISE)
def test_any_upload_comes_out_like_its_source(tables, store_root, tmp_path, draw):
    _check(draw, store_root, tmp_path)


@pytest.mark.sweep
@SWEEP
@given(draw=uploads)
@example(draw=VFR_DENOISE)
def test_any_upload_comes_out_like_its_source_sweep(tables, store_root, tmp_path, draw):
    _check(draw, store_root, tmp_path)
