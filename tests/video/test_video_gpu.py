"""The video pipeline's gpu backend (h264_nvenc): skipped without an NVIDIA GPU."""

from __future__ import annotations

import pytest

from tasks.video import ffmpeg as video_ffmpeg
from tasks.video import inference as video_inference

NO_GPU = video_inference.gpu_available()


def test_gpu_backend_refuses_cleanly_without_a_gpu(tmp_path):
    if NO_GPU is None:
        pytest.skip("a GPU is present")
    source = video_ffmpeg.make_test_video(tmp_path / "s.mp4", seconds=1.0)
    with pytest.raises(video_inference.GpuUnavailable, match="gpu backend: "):
        video_inference.infer("gpu", source, tmp_path / "o.mp4", "grayscale")
    assert not (tmp_path / "o.mp4").exists()


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=f"no usable GPU: {NO_GPU}")
@pytest.mark.parametrize("mode", sorted(video_ffmpeg.FILTERS))
def test_gpu_backend_encodes_every_mode_with_nvenc(tmp_path, mode):
    import av

    source = video_ffmpeg.make_test_video(tmp_path / "s.mp4", seconds=2.0, fps=10, size="320x240")
    out = tmp_path / "o.mp4"
    video_inference.infer("gpu", source, out, mode)
    info = video_ffmpeg.probe(out)
    assert info.frames == 20 and info.has_audio
    with av.open(str(out)) as container:
        assert container.streams.video[0].codec_context.name == "h264"
