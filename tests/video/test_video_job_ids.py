"""A video job id is checked once, where it comes in, and travels inward as a ``JobId`` that nothing checks again;
a raw id that could escape its prefix is refused at every edge (flow parameter, upload key, segment key, new job)."""

from __future__ import annotations

import copy
import inspect
import pickle
from pathlib import Path

import pytest

from flows.video import video_delete_cleanup, video_process, video_reassemble
from tasks.core import state_store
from tasks.core.keys import InvalidKey
from tasks.core.object_store import LocalStore
from tasks.video import jobs as v
from tasks.video import keys as video_keys
from tasks.video.ffmpeg import make_test_video
from tasks.video.keys import JobId, parse_job_id

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

BAD = ["../escape", "a/b", "..", "x/../../y", "", "a\\b"]


@pytest.fixture
def checks(monkeypatch) -> list[str]:
    """Every job id ``safe_id`` checks from now on (``tasks.video.keys`` is the one module that calls it for them)."""
    seen: list[str] = []
    real = video_keys.safe_id

    def counted(value, what="id"):
        seen.append(value)
        return real(value, what)

    monkeypatch.setattr(video_keys, "safe_id", counted)
    return seen


@pytest.mark.parametrize("bad", BAD)
def test_a_raw_bad_id_is_refused_at_every_edge(tables, store_root, bad):
    with pytest.raises(InvalidKey, match="invalid job_id"):
        v.create_job(bad)
    with pytest.raises(InvalidKey):
        video_keys.parse_source_key(f"input/{bad}/source.mp4")
    with pytest.raises(InvalidKey):
        video_keys.parse_segment_key(f"segments/{bad}/00000_00001_identity.mp4")
    with pytest.raises(InvalidKey, match="invalid job_id"):
        JobId(bad)
    for builder in (video_keys.source_key, video_keys.input_prefix, video_keys.final_key, video_keys.segments_prefix):
        with pytest.raises(InvalidKey, match="invalid job_id"):
            builder(bad)  # a raw string handed to a builder still goes through the one check
    assert list(LocalStore(store_root).list("")) == [] and list(state_store.scan_all(tables["video_jobs"])) == []


def test_every_flow_parameter_is_an_edge(tables, store_root):
    for flow in (video_process, video_reassemble, video_delete_cleanup):
        with pytest.raises(InvalidKey, match="invalid job_id '../escape'"):
            flow(job_id="../escape")
    assert list(LocalStore(store_root).list("")) == [] and list(state_store.scan_all(tables["video_jobs"])) == []


def test_builders_and_job_steps_take_a_job_id():
    builders = [f for _, f in inspect.getmembers(video_keys, inspect.isfunction) if f.__module__ == video_keys.__name__]
    steps = [f for _, f in inspect.getmembers(v, inspect.isfunction) if f.__module__ == v.__name__]
    typed = [f for f in builders + steps if "job_id" in inspect.signature(f).parameters]
    assert len(typed) > 25
    untyped = [f.__name__ for f in typed if inspect.signature(f).parameters["job_id"].annotation != "JobId"]
    assert untyped == ["create_job"]  # the one that takes a raw id (or none) and makes the JobId


def test_a_job_id_is_not_checked_again(checks):
    job_id = parse_job_id("job-1")
    assert checks == ["job-1"] and parse_job_id(job_id) is job_id
    assert copy.copy(job_id) is job_id and copy.deepcopy({"job_id": job_id})["job_id"] is job_id  # Prefect copies
    keys = [
        video_keys.source_key(job_id),
        video_keys.input_prefix(job_id),
        video_keys.segment_key(job_id, 1, 3, "identity"),
        video_keys.output_segment_key(job_id, 1, 3, "identity"),
        video_keys.detections_key(job_id, 1, 3, "identity"),
        video_keys.final_key(job_id),
    ]
    assert checks == ["job-1"]
    assert keys == [
        "input/job-1/source.mp4",
        "input/job-1/",
        "segments/job-1/00001_00003_identity.mp4",
        "jobs/job-1/segments/00001_00003_identity.mp4",
        "jobs/job-1/detections/00001_00003_identity.json",
        "jobs/job-1/final.mp4",
    ]
    assert type(pickle.loads(pickle.dumps(job_id))) is JobId and checks == ["job-1", "job-1"]  # read back: checked


def test_one_run_checks_its_job_id_at_its_edges_only(tables, store_root, tmp_path, checks):
    clip = make_test_video(tmp_path / "clip.mp4", 2.0, 10, keyframe_seconds=1.0)
    job = v.create_job(mode="identity", segment_seconds=1.0)
    Path(job["upload_target"]).write_bytes(clip.read_bytes())
    checks.clear()
    done = video_process(job_id=job["job_id"], segment_seconds=1.0, segment_retry_delays=[0, 0])
    assert done["status"] == v.COMPLETED and done["total_segments"] == 2
    # the flow's parameter, then each segment task's key: before, every builder and store key checked it (36 times
    # for 3 segments)
    assert checks == [job["job_id"]] * 3
