"""The video pipeline's model backends: text-redact (a real text detector, ONNX) and a SageMaker-style async endpoint.

Clips are drawn by ffmpeg (drawtext on a white source), so there is known text to find; the endpoint is a local
stand-in (tests/helpers/sagemaker_standin.py) reached through the real boto3 sagemaker-runtime client.
"""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest

from flows.video import video_process
from tasks.video import inference as video_inference
from tasks.video import jobs as v
from tasks.video import keys, model
from tasks.video.ffmpeg import make_test_video, probe

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

SIZE, FPS, SECONDS = (320, 192), 10, 2.0  # 20 frames; two 1 s segments in the flow tests
TEXT_AT = (40, 60)  # where drawtext puts the text (fontsize 28)


def _clip(path: Path, text: str | None) -> Path:
    """A white clip with black ``text`` (none: blank), sine audio, a keyframe every second."""
    overlay = f"drawtext=text='{text}':fontsize=28:fontcolor=black:x={TEXT_AT[0]}:y={TEXT_AT[1]}" if text else ""
    size = f"{SIZE[0]}x{SIZE[1]}"
    return make_test_video(path, SECONDS, FPS, size, keyframe_seconds=1.0, pattern="color=c=white", overlay=overlay)


@pytest.fixture(scope="module")
def text_clip(tmp_path_factory) -> Path:
    return _clip(tmp_path_factory.mktemp("model") / "text.mp4", "HELLO WORLD 42")


@pytest.fixture(scope="module")
def blank_clip(tmp_path_factory) -> Path:
    return _clip(tmp_path_factory.mktemp("model") / "blank.mp4", None)


def _frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


@pytest.fixture(scope="module")
def text_area(text_clip) -> tuple[int, int, int, int]:
    """x0, y0, x1, y1 (end exclusive) of the drawn text's dark pixels, the same in every frame."""
    rows, cols = np.nonzero(_frames(text_clip)[0].max(axis=2) < 128)
    assert rows.size and cols.min() >= TEXT_AT[0] - 2 and rows.min() >= TEXT_AT[1] - 2
    return int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1


def _covers(box: list[float], area: tuple[int, int, int, int]) -> bool:
    """``box`` covers ``area`` and is at most twice its size."""
    inside = box[0] <= area[0] and box[1] <= area[1] and box[2] >= area[2] and box[3] >= area[3]
    return inside and (box[2] - box[0]) * (box[3] - box[1]) <= 2 * (area[2] - area[0]) * (area[3] - area[1])


def test_text_redact_blacks_out_the_text_it_finds_and_nothing_else(text_clip, text_area, tmp_path):
    out = tmp_path / "out.mp4"
    found = model.redact_text(text_clip, out, "identity", batch_size=8)

    assert found["frames"] == 20 and found["provider"] in ("CPUExecutionProvider", "CUDAExecutionProvider")
    assert [d["frame"] for d in found["detections"]] == list(range(20))  # text in every frame
    assert [d["pts"] for d in found["detections"]] == pytest.approx([i / FPS for i in range(20)])
    for detection in found["detections"]:
        (box,) = detection["boxes"]  # one line of text, one box around all of it, not much more
        assert _covers(box, text_area) and 0.5 <= box[4] <= 1.0

    source, output = probe(text_clip), probe(out)
    assert (output.frames, output.duration, output.has_audio) == (source.frames, source.duration, True)
    for before, after, detection in zip(_frames(text_clip), _frames(out), found["detections"]):
        x0, y0, x1, y1, _ = detection["boxes"][0]
        boxed = np.zeros(before.shape[:2], bool)
        boxed[y0:y1, x0:x1] = True
        assert before[boxed].min() <= 20  # there was black text
        assert after[boxed].max() <= 20  # now the whole box is black
        change = np.abs(before.astype(int) - after.astype(int))[~boxed]
        assert change.mean() < 1.0 and np.percentile(change, 99) <= 6  # elsewhere only x264's rounding


def test_text_redact_finds_nothing_on_a_blank_clip_and_keeps_its_frames(blank_clip, tmp_path):
    out = tmp_path / "out.mp4"
    found = model.redact_text(blank_clip, out, "identity", batch_size=3)  # 20 frames: batches of 3 and a last of 2

    assert (found["frames"], found["detections"]) == (20, [])
    assert probe(out).frames == 20
    assert all(np.abs(a.astype(int) - b.astype(int)).max() <= 6 for a, b in zip(_frames(blank_clip), _frames(out)))


def test_text_redact_applies_the_mode_after_redacting(text_clip, tmp_path):
    out = tmp_path / "scaled.mp4"
    model.redact_text(text_clip, out, "scale", batch_size=8)
    info = probe(out)
    assert (info.width, info.height, info.frames) == (SIZE[0] // 2, SIZE[1] // 2, 20)


def test_text_redact_refuses_a_bad_batch_size_and_a_file_that_is_no_video(text_clip, tmp_path):
    with pytest.raises(ValueError, match="batch_size must be at least 1, not 0"):
        model.redact_text(text_clip, tmp_path / "o.mp4", "identity", batch_size=0)
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video at all" * 100)
    with pytest.raises(video_inference.InferenceError) as error:
        video_inference.infer("text-redact", junk, tmp_path / "o.mp4", "identity")
    assert str(error.value) == (
        "text-redact backend: InvalidDataError: [Errno 1094995529] "
        "Invalid data found when processing input: 'junk.mp4'; "
        "last error log: [mov,mp4,m4a,3gp,3g2,mj2] moov atom not found"  # libav's own line
    )


def _upload(store_root: Path, clip: Path, mode: str) -> str:
    job = v.create_job(mode=mode, segment_seconds=1.0)
    Path(job["upload_target"]).write_bytes(clip.read_bytes())
    return job["job_id"]


def _run(job_id: str, backend: str, mode: str):
    return video_process(job_id=job_id, backend=backend, mode=mode, segment_seconds=1.0, segment_retries=0)


def test_video_process_with_the_text_redact_backend(tables, store_root, text_clip, text_area):
    job_id = _upload(store_root, text_clip, "grayscale")
    job = _run(job_id, "text-redact", "grayscale")

    assert (job["status"], job["total_segments"], job["final_frames"]) == ("completed", 2, 20)
    for index in range(2):  # each segment's detections beside the outputs: 10 frames, each with the text's box
        stored = json.loads((store_root / keys.detections_key(job_id, index, 2, "grayscale")).read_text())
        assert stored["frames"] == 10 and [d["frame"] for d in stored["detections"]] == list(range(10))
        assert all(_covers(d["boxes"][0], text_area) for d in stored["detections"])
    frame = _frames(store_root / job["final_key"])[15]
    x0, y0, x1, y1 = text_area
    assert frame[y0:y1, x0:x1].max() <= 20 and frame[: y0 - 20].min() >= 235  # text black, background white
    assert np.abs(frame[..., 0].astype(int) - frame[..., 2].astype(int)).max() <= 3  # and gray


def test_video_process_through_the_async_endpoint(tables, store_root, text_clip, text_area, endpoint):
    job_id = _upload(store_root, text_clip, "identity")
    job = _run(job_id, "sagemaker", "identity")

    assert (job["status"], job["final_frames"]) == ("completed", 20)
    segments = [(store_root / keys.segment_key(job_id, i, 2, "identity")).as_uri() for i in range(2)]
    assert sorted(call["input"] for call in endpoint.invocations) == segments  # invoked with the objects' URLs
    assert {call["attributes"] for call in endpoint.invocations} == {"mode=identity"}
    frame = _frames(store_root / job["final_key"])[5]
    x0, y0, x1, y1 = text_area
    assert frame[y0:y1, x0:x1].max() <= 20  # the endpoint redacted it


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (
            lambda e: setattr(e, "fail_with", "CUDA error: out of memory"),
            "sagemaker backend: endpoint text-redact at {url} failed: RuntimeError: CUDA error: out of memory",
        ),
        (
            lambda e: setattr(e, "endpoints", ()),
            "sagemaker backend: endpoint text-redact at {url} refused the invocation: "
            "An error occurred (ValidationError) "
            "when calling the InvokeEndpointAsync operation: Endpoint text-redact of account 000000000000 not found.",
        ),
        (
            lambda e: setattr(e, "silent", True),
            "sagemaker backend: endpoint text-redact at {url} wrote no output within 2 s",
        ),
    ],
    ids=["failure-location", "unknown-endpoint", "no-answer"],
)
def test_an_endpoint_failure_fails_the_segment_with_its_reason(
    tables, store_root, text_clip, endpoint, monkeypatch, setup, reason
):
    monkeypatch.setenv("VIDEO_INFERENCE_TIMEOUT_S", "2")
    setup(endpoint)
    job_id = _upload(store_root, text_clip, "identity")
    with pytest.raises(v.JobFailed):
        _run(job_id, "sagemaker", "identity")

    job = v.get_job(job_id)
    assert job["status"] == "failed" and job["failure_reason"].startswith(
        "2 of 2 segments failed after retries; first: "
    )
    assert reason.format(url=endpoint.url) in job["failure_reason"]
    assert not list((store_root / "jobs").rglob("*.mp4"))  # nothing recorded as output


@pytest.mark.gpu
@pytest.mark.skipif(not model.cuda_available(), reason="onnxruntime has no CUDAExecutionProvider here")
def test_text_redact_runs_on_cuda_when_available(text_clip, tmp_path):
    found = model.redact_text(text_clip, tmp_path / "out.mp4", "identity", batch_size=8)
    assert found["provider"] == "CUDAExecutionProvider"
    assert [d["frame"] for d in found["detections"]] == list(range(20))
