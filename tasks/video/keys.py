"""Seed 003's keys: a job's upload, segments, outputs and final video.

Every key of this pipeline is built and parsed here; nothing else formats them by hand. A job id is validated
once, where it comes in (a flow parameter, an upload or segment key, a new job, an id read back from the store),
by ``parse_job_id``; what it returns is a ``JobId`` (whose constructor is the one caller of the shared ``safe_id``),
and a JobId is passed inward and never checked again. So no input can write outside its prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tasks.core.keys import InvalidKey, safe_id

VIDEO_INPUT_PREFIX = "input/"  # every job's upload lands under it
_SEGMENT = re.compile(r"^segments/([^/]+)/(\d{5})_(\d{5})_([A-Za-z0-9-]+)\.mp4$")


class JobId(str):
    """A video job id that passed ``safe_id``: one path segment, no ``/`` or ``..`` (made by ``parse_job_id``)."""

    __slots__ = ()

    def __new__(cls, raw: str) -> JobId:
        # the constructor validates too, so no JobId exists that was not checked (unpickling one checks it again)
        return super().__new__(cls, safe_id(raw, "job_id"))

    def __copy__(self) -> JobId:
        return self  # immutable, like str: Prefect copies a task's parameters, and a copy needs no second check

    def __deepcopy__(self, memo: dict) -> JobId:
        return self


def parse_job_id(raw: str) -> JobId:
    """``raw`` as a JobId: validated here (InvalidKey if it could escape its prefix); a JobId is returned as it is."""
    return raw if isinstance(raw, JobId) else JobId(raw)


@dataclass(frozen=True)
class SegmentKey:
    job_id: JobId
    segment_index: int
    total_segments: int
    mode: str


def source_key(job_id: JobId) -> str:
    """``input/{job_id}/source.mp4``."""
    return f"{input_prefix(job_id)}source.mp4"


def parse_source_key(key: str) -> JobId:
    """The job id of an upload key ``input/{job_id}/source.mp4``; InvalidKey if it is not one."""
    match = re.fullmatch(r"input/([^/]+)/source\.mp4", key)
    if not match:
        raise InvalidKey(f"not a video upload key (input/{{job_id}}/source.mp4): {key!r}")
    return parse_job_id(match.group(1))


def segment_key(job_id: JobId, segment_index: int, total_segments: int, mode: str) -> str:
    """``segments/{job_id}/{segment_index:05d}_{total_segments:05d}_{mode}.mp4``."""
    name = _segment_name(segment_index, total_segments, mode)
    return f"{segments_prefix(job_id)}{name}.mp4"


def _segment_name(segment_index: int, total_segments: int, mode: str) -> str:
    """``{segment_index:05d}_{total_segments:05d}_{mode}``: a segment's name in every folder of its job."""
    if not re.fullmatch(r"[A-Za-z0-9-]+", mode):
        raise InvalidKey(f"invalid mode {mode!r}")
    if not 0 <= segment_index < total_segments <= 99999:
        raise InvalidKey(f"segment {segment_index} of {total_segments} is out of range")
    return f"{segment_index:05d}_{total_segments:05d}_{mode}"


def parse_segment_key(key: str) -> SegmentKey:
    """Job id, index, total and mode of a ``segments/…`` key; InvalidKey if it is not one."""
    match = _SEGMENT.match(key)
    if not match:
        raise InvalidKey(f"not a segment key: {key!r}")
    job_id, index, total, mode = match.groups()
    return SegmentKey(parse_job_id(job_id), int(index), int(total), mode)


def segments_prefix(job_id: JobId) -> str:
    """``segments/{job_id}/``: every source segment of a job."""
    return f"segments/{parse_job_id(job_id)}/"


def job_output_prefix(job_id: JobId) -> str:
    """``jobs/{job_id}/``: every output object of a job."""
    return f"jobs/{parse_job_id(job_id)}/"


def output_segment_key(job_id: JobId, segment_index: int, total_segments: int, mode: str) -> str:
    """``jobs/{job_id}/segments/{index:05d}_{total:05d}_{mode}.mp4``: the inference output of one segment."""
    name = _segment_name(segment_index, total_segments, mode)
    return f"{job_output_prefix(job_id)}segments/{name}.mp4"


def detections_key(job_id: JobId, segment_index: int, total_segments: int, mode: str) -> str:
    """``jobs/{job_id}/detections/{index:05d}_{total:05d}_{mode}.json``: what a model backend found in one segment."""
    name = _segment_name(segment_index, total_segments, mode)
    return f"{job_output_prefix(job_id)}detections/{name}.json"


def final_key(job_id: JobId) -> str:
    """``jobs/{job_id}/final.mp4``."""
    return f"{job_output_prefix(job_id)}final.mp4"


def input_prefix(job_id: JobId) -> str:
    """``input/{job_id}/``: a job's uploaded inputs."""
    return f"{VIDEO_INPUT_PREFIX}{parse_job_id(job_id)}/"
