"""GPU check for the video pipeline's ``gpu`` backend (h264_nvenc), runnable on a machine with an NVIDIA GPU.

    python benchmarks/video_gpu.py [--quick]  # needs: ffmpeg-python imageio-ffmpeg av nvidia-ml-py

No DynamoDB or Prefect needed: it generates a clip, segments it, runs every mode through the gpu backend
and checks each output (H.264, same frame count, audio kept, grayscale really gray), concatenates the
outputs like reassembly does, then compares NVENC's frames/s with the CPU (libx264) backend's.
Exits 0 when all checks pass, 1 when one fails, 2 when there is no usable GPU.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.video import ffmpeg as video_ffmpeg
from tasks.video import inference as video_inference


def check(condition: bool, what: str, failures: list[str]) -> None:
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def codec_of(path: Path) -> str:
    import av

    with av.open(str(path)) as container:
        return container.streams.video[0].codec_context.name


def mean_chroma_gap(path: Path) -> float:
    import av

    with av.open(str(path)) as container:
        frame = next(container.decode(video=0)).to_ndarray(format="rgb24").astype(float)
    return abs(frame[..., 0].mean() - frame[..., 2].mean())


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="accepted for `make test-sweep`: the run is short already")
    parser.parse_args()
    reason = video_inference.gpu_available()
    if reason is not None:
        print(f"SKIP: no usable GPU: {reason}")
        return 2
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="video-gpu-") as tmp:
        work = Path(tmp)
        source = video_ffmpeg.make_test_video(
            work / "source.mp4", seconds=6.0, fps=30, size="1280x720", keyframe_seconds=1.0
        )
        parts = video_ffmpeg.segment(source, work / "parts", 1.0, video_ffmpeg.OWN_DEMUXER)
        source_info = video_ffmpeg.probe(source)
        check(len(parts) == 6, f"6 segments (got {len(parts)})", failures)
        for mode in sorted(video_ffmpeg.FILTERS):
            outputs = []
            for index, part in enumerate(parts):
                out = work / f"{mode}-{index}.mp4"
                video_inference.infer("gpu", part, out, mode)
                outputs.append(out)
            infos = [video_ffmpeg.probe(o) for o in outputs]
            check(all(codec_of(o) == "h264" for o in outputs), f"{mode}: outputs are H.264 from h264_nvenc", failures)
            check(
                [i.frames for i in infos] == [video_ffmpeg.probe(p).frames for p in parts],
                f"{mode}: every segment keeps its frame count",
                failures,
            )
            check(all(i.has_audio for i in infos), f"{mode}: audio kept", failures)
            final = work / f"{mode}-final.mp4"
            video_ffmpeg.concat(outputs, final)
            info = video_ffmpeg.probe(final)
            check(
                abs(info.frames - source_info.frames) <= len(parts) - 1,
                f"{mode}: final has {info.frames} frames (source {source_info.frames})",
                failures,
            )
            if mode == "grayscale":
                check(
                    mean_chroma_gap(final) < 3,
                    f"grayscale: R and B means agree ({mean_chroma_gap(final):.2f})",
                    failures,
                )
            if mode == "scale":
                check(
                    (info.width, info.height) == (640, 360),
                    f"scale: 640x360 (got {info.width}x{info.height})",
                    failures,
                )

        frames = sum(video_ffmpeg.probe(p).frames for p in parts)
        for backend in ("gpu", "ffmpeg"):
            start = time.perf_counter()
            for index, part in enumerate(parts):
                video_inference.infer(backend, part, work / f"speed-{backend}-{index}.mp4", "grayscale")
            elapsed = time.perf_counter() - start
            print(
                f"{backend:6s} backend grayscale 1280x720: {frames / elapsed:7.1f} frames/s ({frames} frames, "
                f"{elapsed:.2f} s)"
            )
    print("ALL CHECKS PASSED" if not failures else f"{len(failures)} CHECK(S) FAILED: {failures}")
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
