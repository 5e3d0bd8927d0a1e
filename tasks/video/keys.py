"""Seed 003's keys: a job's upload, segments, outputs and final video.

Every key of this pipeline is built and parsed here; nothing else formats them by hand. Identifiers are
validated by the shared validators of ``tasks.core.keys`` so no input can write outside its prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tasks.core.keys import InvalidKey, safe_id

VIDEO_INPUT_PREFIX = "input/"  # every job's upload lands under it
_SEGMENT = re.compile(r"^segments/([^/]+)/(\d{5})_(\d{5})_([A-Za-z0-9-]+)\.mp4$")


@dataclass(frozen=True)
class SegmentKey:
    job_id: str
    segment_index: int
    total_segments: int
    mode: str


def source_key(job_id: str) -> str:
    """``input/{job_id}/source.mp4``."""
    return f"{VIDEO_INPUT_PREFIX}{safe_id(job_id, 'job_id')}/source.mp4"


def parse_source_key(key: str) -> str:
    """The job id of an upload key ``input/{job_id}/source.mp4``; InvalidKey if it is not one."""
    match = re.fullmatch(r"input/([^/]+)/source\.mp4", key)
    if not match:
        raise InvalidKey(f"not a video upload key (input/{{job_id}}/source.mp4): {key!r}")
    return safe_id(match.group(1), "job_id")


def segment_key(job_id: str, segment_index: int, total_segments: int, mode: str) -> str:
    """``segments/{job_id}/{segment_index:05d}_{total_segments:05d}_{mode}.mp4``."""
    if not re.fullmatch(r"[A-Za-z0-9-]+", mode):
        raise InvalidKey(f"invalid mode {mode!r}")
    if not 0 <= segment_index < total_segments <= 99999:
        raise InvalidKey(f"segment {segment_index} of {total_segments} is out of range")
    return f"segments/{safe_id(job_id, 'job_id')}/{segment_index:05d}_{total_segments:05d}_{mode}.mp4"


def parse_segment_key(key: str) -> SegmentKey:
    """Job id, index, total and mode of a ``segments/…`` key; InvalidKey if it is not one."""
    match = _SEGMENT.match(key)
    if not match:
        raise InvalidKey(f"not a segment key: {key!r}")
    job_id, index, total, mode = match.groups()
    return SegmentKey(safe_id(job_id, "job_id"), int(index), int(total), mode)


def segments_prefix(job_id: str) -> str:
    """``segments/{job_id}/``: every source segment of a job."""
    return f"segments/{safe_id(job_id, 'job_id')}/"


def job_output_prefix(job_id: str) -> str:
    """``jobs/{job_id}/``: every output object of a job."""
    return f"jobs/{safe_id(job_id, 'job_id')}/"


def output_segment_key(job_id: str, segment_index: int, total_segments: int, mode: str) -> str:
    """``jobs/{job_id}/segments/{index:05d}_{total:05d}_{mode}.mp4``: the inference output of one segment."""
    name = segment_key(job_id, segment_index, total_segments, mode).rsplit("/", 1)[1]
    return f"{job_output_prefix(job_id)}segments/{name}"


def detections_key(job_id: str, segment_index: int, total_segments: int, mode: str) -> str:
    """``jobs/{job_id}/detections/{index:05d}_{total:05d}_{mode}.json``: what a model backend found in one segment."""
    name = segment_key(job_id, segment_index, total_segments, mode).rsplit("/", 1)[1]
    return f"{job_output_prefix(job_id)}detections/{name.removesuffix('.mp4')}.json"


def final_key(job_id: str) -> str:
    """``jobs/{job_id}/final.mp4``."""
    return f"{job_output_prefix(job_id)}final.mp4"


def input_prefix(job_id: str) -> str:
    """``input/{job_id}/``: a job's uploaded inputs."""
    return f"{VIDEO_INPUT_PREFIX}{safe_id(job_id, 'job_id')}/"
