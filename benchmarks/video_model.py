"""text-redact's detector: frames/s of the tuned session against the same net run frame by frame with default options.

    .venv/bin/python benchmarks/video_model.py [--quick] [--frames N] [--repeat R] [--size 320x240]

Frames come from a clip ffmpeg draws (a moving test pattern with black text on a white band), decoded once;
each variant runs the whole detector step (normalise, run the net, boxes from the probability map) over the
same frames. The baseline is what a user would script: ``onnxruntime.InferenceSession(path)`` with default
options, one frame per run. The variants are interleaved and repeated; the best of each is reported, then
``RATIO tuned/frame-by-frame-default = X`` (frames/s). Each knob is also measured alone against the baseline.
``--load N`` runs N busy processes beside it, as the other pipelines load a shared machine.
Exits 1 when a variant's boxes miss the drawn text on any frame (a wrong result), never because it is slow.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.video import ffmpeg as video_ffmpeg
from tasks.video import model

TEXT_AT = (40, 60)


def text_frames(path: Path, size: str, count: int) -> tuple[list[np.ndarray], tuple[int, int, int, int]]:
    """``count`` BGR frames with the same black text on a white band over a moving pattern, and the text's area."""
    import av

    drawn = (
        f"testsrc2=size={size}:rate=25,drawbox=x=0:y={TEXT_AT[1] - 10}:w=iw:h=50:color=white:t=fill,"
        f"drawtext=text='HELLO WORLD 42':fontsize=28:fontcolor=black:x={TEXT_AT[0]}:y={TEXT_AT[1]}"
    )
    subprocess.run(
        [
            video_ffmpeg.ffmpeg_exe(),
            "-v",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            drawn,
            "-frames:v",
            str(count),
            "-c:v",
            "libx264",
            "-preset",
            "veryfast",
            "-crf",
            "18",
            "-pix_fmt",
            "yuv420p",
            str(path),
        ],
        check=True,
    )
    with av.open(str(path)) as container:
        frames = [frame.to_ndarray(format="bgr24") for frame in container.decode(video=0)]
    band = frames[0][TEXT_AT[1] - 8 : TEXT_AT[1] + 38]
    rows, cols = np.nonzero(band.max(axis=2) < 100)
    area = (int(cols.min()), int(rows.min()) + TEXT_AT[1] - 8, int(cols.max()) + 1, int(rows.max()) + TEXT_AT[1] - 7)
    return frames, area


def session(
    threads: int | None = None,
    spinning: bool = True,
    mem_pattern: bool = True,
    parallel: bool = False,
    tuned: bool = False,
):
    """A CPU session: onnxruntime's defaults, or the module's tuned options, or defaults with one knob changed."""
    import onnxruntime

    if tuned:
        options = model.session_options()
    else:
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.enable_mem_pattern = mem_pattern
        if parallel:
            options.execution_mode = onnxruntime.ExecutionMode.ORT_PARALLEL
    return onnxruntime.InferenceSession(str(model.model_path()), options, providers=["CPUExecutionProvider"])


def run_variant(net, frames: list[np.ndarray], batch: int, scale: float) -> tuple[float, list]:
    """(frames/s, boxes per frame) of the detector step over ``frames`` in batches; ``scale`` < 1 shrinks the input."""
    boxes: list = []
    max_side = model.MAX_SIDE
    model.MAX_SIDE = round(max(frames[0].shape[:2]) * scale) if scale < 1 else max_side
    try:
        model.detect(frames[:batch], net)  # first run: allocations, not per-frame work
        start = time.perf_counter()
        for i in range(0, len(frames), batch):
            boxes += model.detect(frames[i : i + batch], net)
        return len(frames) / (time.perf_counter() - start), boxes
    finally:
        model.MAX_SIDE = max_side


def covers(found: list, area: tuple[int, int, int, int]) -> bool:
    """One of the boxes covers the text's area."""
    return any(b[0] <= area[0] and b[1] <= area[1] and b[2] >= area[2] and b[3] >= area[3] for b in found)


def spin() -> None:
    """A busy loop: one core's worth of another pipeline."""
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 16 frames, one repeat, no single knobs")
    parser.add_argument("--frames", type=int, default=None, help="frames per variant (default 64, quick 16)")
    parser.add_argument("--repeat", type=int, default=None, help="interleaved repeats (default 3, quick 1)")
    parser.add_argument("--size", default="320x240")
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        help="busy processes running beside the measurement (the other pipelines on a shared machine)",
    )
    args = parser.parse_args()
    count = args.frames or (16 if args.quick else 64)
    repeat = args.repeat or (1 if args.quick else 3)
    cores = os.cpu_count() or 1
    variants = {  # name: (session, batch, input scale)
        "frame-by-frame-default": (session(), 1, 1.0),
        "tuned": (session(tuned=True), 1, 1.0),
    }
    if not args.quick:
        variants |= {
            "tuned, batches of 8": (variants["tuned"][0], 8, 1.0),
            "default, no spinning": (session(spinning=False), 1, 1.0),
            f"default, {cores} threads": (session(threads=cores), 1, 1.0),
            "default, 1 thread": (session(threads=1), 1, 1.0),
            "default, batches of 8": (variants["frame-by-frame-default"][0], 8, 1.0),
            "default, no memory pattern": (session(mem_pattern=False), 1, 1.0),
            "default, parallel mode": (session(parallel=True), 1, 1.0),
            "tuned, input 0.8x": (variants["tuned"][0], 1, 0.8),
        }
    with tempfile.TemporaryDirectory() as tmp:
        frames, area = text_frames(Path(tmp) / "text.mp4", args.size, count)
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.load)]
    for process in busy:
        process.start()
    best = dict.fromkeys(variants, 0.0)
    wrong = []
    for _ in range(repeat):
        for name, (net, batch, scale) in variants.items():
            rate, boxes = run_variant(net, frames, batch, scale)
            best[name] = max(best[name], rate)
            missed = [i for i, found in enumerate(boxes) if not covers(found, area)]
            if missed and name not in wrong:
                wrong.append(name)
                print(f"WRONG: {name} misses the text {area} on frames {missed[:10]}", file=sys.stderr)
    load = os.getloadavg()
    for process in busy:
        process.terminate()
    base = best["frame-by-frame-default"]
    print(
        f"{count} frames of {args.size}, best of {repeat}, {cores} cores, load average {load[0]:.2f} "
        f"{load[1]:.2f} {load[2]:.2f}, {args.load} busy processes beside it; provider CPUExecutionProvider"
    )
    for name, rate in best.items():
        print(f"  {name:32s} {rate:7.1f} frames/s  {rate / base:5.2f}x")
    print(f"RATIO tuned/frame-by-frame-default = {best['tuned'] / base:.2f} (frames/s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
