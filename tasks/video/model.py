"""The text-redact backend: a real detector runs on every frame and the text it finds is blacked out.

The network is PP-OCRv4's text detector (DBNet, ONNX) that the ``rapidocr-onnxruntime`` wheel ships, run by
onnxruntime on CUDA when the CUDA provider is there, else on the CPU. A segment's frames are decoded with PyAV,
run through the net in batches, the probability map is thresholded into boxes (connected components, then
DBNet's unclip), the boxes are filled black, and the frames are re-encoded with libx264 keeping each frame's
timestamp and the audio packets as they were. The mode's filter chain runs after the redaction, as in the
ffmpeg backend. The detections (frame, box, score) come back so the caller can store them next to the output.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from tasks.video import ffmpeg as video_ffmpeg
from tasks.video.settings import VideoSettings

MODEL_NAME = "PP-OCRv4 text detection (rapidocr-onnxruntime)"
THRESHOLD = 0.3  # pixel probability that counts as text (rapidocr's default)
BOX_THRESHOLD = 0.5  # mean probability a box needs to be kept (rapidocr's default)
UNCLIP_RATIO = 1.6  # DBNet predicts shrunk regions; grow each box by area * ratio / perimeter
MIN_SIDE = 3  # boxes thinner than this (in the net's pixels) are noise
MAX_SIDE = 960  # larger frames are scaled down for the net (boxes are scaled back)
STRIDE = 32  # the net's input sides must be multiples of this


def model_path() -> Path:
    """The ONNX file of the text detector inside the rapidocr-onnxruntime package."""
    return Path(str(importlib.resources.files("rapidocr_onnxruntime") / "models" / "ch_PP-OCRv4_det_infer.onnx"))


def cuda_available() -> bool:
    """onnxruntime here can run on CUDA (the onnxruntime-gpu build on a machine with a GPU)."""
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def session_options(threads: int | None = None):
    """The CPU-tuned session options: every graph optimisation, one sequential pool of ``threads`` that sleeps when
    idle."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL  # DBNet is one chain: no branches to overlap
    # one pool of every core (VIDEO_MODEL_THREADS: fewer); segments running at once share the session and its pool
    options.intra_op_num_threads = threads or VideoSettings.read().model_threads or os.cpu_count() or 1
    options.inter_op_num_threads = 1
    # spinning workers burn the cores the decoder, the encoder and the other pipelines need between runs
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


# a segment's batches have one shape: the arena grows by what is asked, not in powers of two; the default exhaustive
# cuDNN search stays (it runs once per input shape and the session lives as long as the process)
CUDA_OPTIONS = {"arena_extend_strategy": "kSameAsRequested"}


@functools.lru_cache(maxsize=1)
def session():
    """One InferenceSession per process (loading the net costs more than a batch); CUDA first when available."""
    import onnxruntime

    providers = ([("CUDAExecutionProvider", CUDA_OPTIONS)] if cuda_available() else []) + ["CPUExecutionProvider"]
    return onnxruntime.InferenceSession(str(model_path()), session_options(), providers=providers)


def provider() -> str:
    """The execution provider the session really uses (CUDAExecutionProvider or CPUExecutionProvider)."""
    return session().get_providers()[0]


def net_size(height: int, width: int) -> tuple[float, int, int]:
    """(scale, height, width) of the net's input for a frame: at most MAX_SIDE, padded up to multiples of STRIDE."""
    scale = min(1.0, MAX_SIDE / max(height, width))

    def padded(side: int) -> int:
        return max(STRIDE, -(-round(side * scale) // STRIDE) * STRIDE)

    return scale, padded(height), padded(width)


def prepare(frames: list[np.ndarray]) -> tuple[np.ndarray, float]:
    """BGR uint8 frames (one size) -> the net's NCHW float32 batch ((x/255 - 0.5) / 0.5, zero-padded) and the scale."""
    height, width = frames[0].shape[:2]
    scale, net_h, net_w = net_size(height, width)
    batch = np.zeros((len(frames), 3, net_h, net_w), dtype=np.float32)
    for i, frame in enumerate(frames):
        if scale < 1.0:
            from PIL import Image

            size = (max(1, round(width * scale)), max(1, round(height * scale)))
            frame = np.asarray(Image.fromarray(frame).resize(size, Image.BILINEAR))
        h, w = frame.shape[:2]
        region = batch[i, :, :h, :w]  # the padding stays 0 (mid-gray after normalising)
        region[...] = frame.transpose(2, 0, 1)
        region *= np.float32(1 / 127.5)  # in place, in float32: no float64 copy of the frame
        region -= np.float32(1.0)
    return batch, scale


def boxes_from_map(probability: np.ndarray, scale: float, height: int, width: int) -> list[list[float]]:
    """Text boxes ``[x0, y0, x1, y1, score]`` (frame pixels, end exclusive) from one probability map."""
    from scipy import ndimage

    bitmap = ndimage.binary_dilation(probability > THRESHOLD, structure=np.ones((2, 2), bool))
    labels, count = ndimage.label(bitmap)
    boxes = []
    for index, found in enumerate(ndimage.find_objects(labels), start=1):
        if found is None:
            continue
        rows, cols = found
        box_h, box_w = rows.stop - rows.start, cols.stop - cols.start
        if min(box_h, box_w) < MIN_SIDE:
            continue
        score = float(probability[found][labels[found] == index].mean())
        if score < BOX_THRESHOLD:
            continue
        grow = box_h * box_w * UNCLIP_RATIO / (2 * (box_h + box_w))
        x0, y0 = (cols.start - grow) / scale, (rows.start - grow) / scale
        x1, y1 = (cols.stop + grow) / scale, (rows.stop + grow) / scale
        boxes.append(
            [
                max(0, int(x0)),
                max(0, int(y0)),
                min(width, int(np.ceil(x1))),
                min(height, int(np.ceil(y1))),
                round(score, 4),
            ]
        )
    return boxes


def detect(frames: list[np.ndarray], net=None) -> list[list[list[float]]]:
    """Text boxes of every frame in one batch (BGR uint8 frames of one size); ``net``: another session (benchmarks)."""
    net = net or session()
    batch, scale = prepare(frames)
    (probability,) = net.run(None, {net.get_inputs()[0].name: batch})
    height, width = frames[0].shape[:2]
    return [boxes_from_map(probability[i, 0], scale, height, width) for i in range(len(frames))]


def black_out(frame, boxes: list[list[float]]):
    """The yuv420p frame with every box filled black, all other pixels exactly as decoded."""
    import av

    width, height = frame.width, frame.height
    data = frame.to_ndarray()  # yuv420p: the Y, U and V planes one after the other
    flat = data.reshape(-1)
    luma = flat[: width * height].reshape(height, width)
    chroma = [
        flat[width * height + i * (width // 2) * (height // 2) :][: (width // 2) * (height // 2)].reshape(
            height // 2, width // 2
        )
        for i in (0, 1)
    ]
    for x0, y0, x1, y1, _score in boxes:
        luma[int(y0) : int(y1), int(x0) : int(x1)] = 16  # video-range black
        for plane in chroma:
            plane[int(y0) // 2 : (int(y1) + 1) // 2, int(x0) // 2 : (int(x1) + 1) // 2] = 128
    redacted = av.VideoFrame.from_ndarray(data, format="yuv420p")
    redacted.pts, redacted.time_base = frame.pts, frame.time_base
    return redacted


def _filter_graph(template, chain: str):
    """A PyAV filter graph running an ffmpeg filter chain (``name=args,name=args``) on the template's frames."""
    import av.filter

    graph = av.filter.Graph()
    nodes = [graph.add_buffer(template=template)]
    for step in chain.split(","):
        name, _, args = step.partition("=")
        nodes.append(graph.add(name, args or None))
    nodes.append(graph.add("buffersink"))
    graph.link_nodes(*nodes).configure()
    return graph


class _Encoder:
    """libx264 output keeping every frame's timestamp; the stream is opened at the first (filtered) frame's size."""

    def __init__(self, container, video, mode: str):
        self.container, self.video, self.stream = container, video, None
        chain = video_ffmpeg.FILTERS[mode]
        self.graph = _filter_graph(video, chain) if chain else None

    def _open(self, frame) -> None:
        self.stream = self.container.add_stream("libx264", rate=self.video.average_rate or Fraction(25))
        self.stream.width, self.stream.height, self.stream.pix_fmt = frame.width, frame.height, "yuv420p"
        self.stream.time_base = self.video.time_base
        self.stream.codec_context.time_base = self.video.time_base
        self.stream.options = {"preset": "veryfast", "crf": "23"}

    def _mux(self, frame) -> None:
        if frame is not None and self.stream is None:
            self._open(frame)
        if self.stream is not None:
            self.container.mux(self.stream.encode(frame))

    def write(self, frame) -> None:
        """Encode one frame (after the mode's filters)."""
        if self.graph is None:
            return self._mux(frame)
        self.graph.push(frame)
        self._drain()

    def close(self) -> None:
        """Flush the filters and the encoder."""
        if self.graph is not None:
            self.graph.push(None)
            self._drain()
        self._mux(None)

    def _drain(self) -> None:
        import av

        while True:
            try:
                self._mux(self.graph.pull())
            except (av.BlockingIOError, av.EOFError):
                return


def _yuv420p(frame):
    """The frame converted to yuv420p (the encoder's format), keeping its timestamp."""
    converted = frame.reformat(format="yuv420p")
    converted.pts, converted.time_base = frame.pts, frame.time_base
    return converted


def redact_text(source: Path, target: Path, mode: str = "identity", batch_size: int = 8) -> dict[str, Any]:
    """Black out the text the detector finds in every frame of ``source``; write ``target`` and return the detections.

    Detections: ``{"model", "provider", "frames", "detections": [{"frame", "pts", "boxes": [[x0, y0, x1, y1,
    score]]}]}``
    with one entry per frame that has text (frame = decode order, pts in seconds).
    """
    import av

    if mode not in video_ffmpeg.FILTERS:
        raise ValueError(f"unknown mode {mode!r}: choose one of {sorted(video_ffmpeg.FILTERS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    detections, frames_seen = [], 0
    with video_ffmpeg.open_media(source) as inp, av.open(str(target), "w", format="mp4") as out:
        video = inp.streams.video[0]
        audio = inp.streams.audio[0] if inp.streams.audio else None
        audio_out = out.add_stream_from_template(audio) if audio is not None else None
        encoder = _Encoder(out, video, mode)
        pending: list = []

        def flush() -> None:
            nonlocal frames_seen
            images = [frame.to_ndarray(format="bgr24") for frame in pending]
            for frame, boxes in zip(pending, detect(images)):
                if boxes:
                    seconds = float(frame.pts * frame.time_base) if frame.pts is not None else None
                    detections.append({"frame": frames_seen, "pts": seconds, "boxes": boxes})
                    frame = black_out(frame, boxes)
                encoder.write(frame)
                frames_seen += 1
            pending.clear()

        held: list = []  # audio packets wait until the video stream exists (the muxer's header names both)
        for packet in inp.demux(*(s for s in (video, audio) if s is not None)):
            if packet.stream is audio:
                if packet.dts is not None:
                    packet.stream = audio_out
                    held.append(packet)
            else:
                for frame in packet.decode():
                    pending.append(frame if frame.format.name == "yuv420p" else _yuv420p(frame))
                    if len(pending) >= batch_size:
                        flush()
            if encoder.stream is not None:
                for packet in held:
                    out.mux(packet)
                held.clear()
        if pending:
            flush()
        encoder.close()
        for packet in held:
            out.mux(packet)
    return {"model": MODEL_NAME, "provider": provider(), "frames": frames_seen, "detections": detections}
