"""Task bodies of the video pipeline (seed 003), plain functions callable without Prefect.

upload -> chunking -> segment processing (inference) -> segment completion -> reassembly trigger ->
reassembly -> final output; plus soft delete and cleanup. The job store (``video_jobs``) is authoritative
for status: created -> chunking_in_progress -> chunking_complete -> completed, or failed, or deleted.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from boto3.dynamodb.conditions import Key

from blocks import VideoInference, load_config
from tasks.core import disk, faults, state_store
from tasks.core.config import object_store, table_name
from tasks.core.errors import PipelineError, RefusedInput
from tasks.core.object_store import LocalStore, ObjectNotFound, ObjectStore, open_url
from tasks.core.redact import redact, url_secrets
from tasks.core.runtime import iso_ago, now_iso, prefect_ids
from tasks.core.state_store import Condition, Outcome
from tasks.video import ffmpeg as video_ffmpeg
from tasks.video import inference as video_inference
from tasks.video import keys as video_keys
from tasks.video.keys import JobId, parse_job_id

CREATED = "created"
CHUNKING = "chunking_in_progress"
CHUNKED = "chunking_complete"
COMPLETED = "completed"
FAILED = "failed"
DELETED = "deleted"
ACTIVE = (CREATED, CHUNKING, CHUNKED)
DELETABLE = (COMPLETED, FAILED)
# a job that met a full disk stays active, its writes undone, with why it waits (and since when) until
# `video-sweep-stuck` takes it again: a full disk is no fault of the upload, so it never fails the job
WAITING_FOR_SPACE = "waiting_for_space"
WAITING_SINCE = "waiting_for_space_since"
SPACE_REDRIVES = "space_redrives"  # re-runs after a wait for space: not counted against MAX_REDRIVES
ROOM_PER_SOURCE_BYTE = 4  # a job writes its segments, their outputs, the final and a normalised copy: each ~ source


class JobFailed(PipelineError, RuntimeError):
    """The job was marked failed; the message is the recorded reason."""


class SourceRefused(RefusedInput):
    """A ``source_url`` outside the VideoInference block's ``source_prefixes`` allow-list."""


def _jobs() -> str:
    return table_name("video_jobs")


def _completions() -> str:
    return table_name("video_segment_completions")


def _locks() -> str:
    return table_name("video_reassembly_locks")


def _key(job_id: JobId) -> dict[str, str]:
    """The job's key in every video table (a JobId is not checked again; a plain string from a script is, here)."""
    return {"job_id": parse_job_id(job_id)}


@contextlib.contextmanager
def local_path(store: ObjectStore, key: str) -> Iterator[Path]:
    """A readable local path with the object's bytes: the file itself for a local store, else a temporary copy."""
    if isinstance(store, LocalStore):
        path = store.path(key)
        if not path.is_file():
            raise ObjectNotFound(store.url_for(key))
        yield path
    else:
        with store.local_copy(key) as path:
            yield path


@contextlib.contextmanager
def scratch_dir(store: ObjectStore, prefix: str) -> Iterator[Path]:
    """A temporary folder, beside a local store's root when possible (so finished files can be renamed in)."""
    parent = None
    if isinstance(store, LocalStore):
        with contextlib.suppress(OSError):
            store.root.parent.mkdir(parents=True, exist_ok=True)
            parent = store.root.parent if os.access(store.root.parent, os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix=f".{prefix}", dir=parent) as tmp:
        yield Path(tmp)


def put_finished_file(store: ObjectStore, key: str, path: Path) -> None:
    """Store a finished local file at ``key``: renamed in (atomic, no copy) on a local store, else uploaded."""
    if isinstance(store, LocalStore):
        target = store.path(key)
        with disk.full_disk_as_unavailable(store.url_for(key)):
            target.parent.mkdir(parents=True, exist_ok=True)
            disk.sync_file(path)  # the bytes reach the disk before the name does, as in every store write
        with contextlib.suppress(OSError), _write_point("put_file", key):  # EXDEV: another filesystem, copy instead
            os.replace(path, target)
            disk.sync_folder(target.parent)
            return
    store.put_file(key, path)


def copy_object(store: ObjectStore, src: str, dst: str) -> None:
    """``dst`` gets ``src``'s bytes: a hard link on a local store (no object is rewritten in place), else a copy."""
    if isinstance(store, LocalStore):
        source, target = store.path(src), store.path(dst)
        if not source.is_file():
            raise ObjectNotFound(store.url_for(src))
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
        with contextlib.suppress(OSError), _write_point("copy", dst):
            os.link(source, staged)
            os.replace(staged, target)
            return
    store.copy(src, dst)


@contextlib.contextmanager
def _write_point(operation: str, key: str) -> Iterator[None]:
    """The local fast paths (rename, hard link) are object writes too: crash points like ``put_file``/``copy``."""
    number = faults.before("objects", operation, key) if faults.armed else 0
    yield
    if faults.armed:
        faults.after(number, operation, key)


# --------------------------------------------------------------------------- job store


def create_job(
    job_id: str | None = None, mode: str | None = None, segment_seconds: float | None = None
) -> dict[str, Any]:
    """Create a job (status ``created``); returns its id and the upload target for ``input/{job_id}/source.mp4``."""
    job_id = parse_job_id(uuid.uuid4().hex if job_id is None else job_id)
    if mode is not None and mode not in video_ffmpeg.FILTERS:
        raise ValueError(f"unknown mode {mode!r}: choose one of {sorted(video_ffmpeg.FILTERS)}")
    item = {"job_id": job_id, "status": CREATED, "created_at": now_iso(), "source_key": video_keys.source_key(job_id)}
    if mode:
        item["mode"] = mode
    if segment_seconds:
        item["segment_seconds"] = float(segment_seconds)
    result = state_store.create_if_absent(_jobs(), item, ["job_id"])
    if not result.applied:
        raise ValueError(f"video job {job_id!r} already exists (status {result.item.get('status')})")
    target = object_store().presign_put(video_keys.source_key(job_id))
    return {"job_id": job_id, "status": CREATED, "source_key": item["source_key"], "upload_target": target}


UPLOAD_SEEN = "upload_seen_at"  # set once, when the upload's first event claims the job for a run
PROCESS_RUN = "process_run_id"  # the `video-process` run that claim started


def claim_upload(job_id: JobId, event_id: str) -> state_store.WriteResult:
    """Mark the job's upload seen (only a ``created`` job whose upload was not seen yet): APPLIED once per job."""
    return state_store.transition(
        _jobs(),
        _key(job_id),
        CREATED,
        None,
        set={UPLOAD_SEEN: now_iso(), "upload_event_id": event_id},
        condition=Condition("attribute_not_exists(#seen)", {"#seen": UPLOAD_SEEN}),
    )


def note_process_run(job_id: JobId, flow_run_id: str) -> None:
    """Record on the job the `video-process` run its upload started (once; a second writer finds it there)."""
    state_store.transition(
        _jobs(),
        _key(job_id),
        None,
        None,
        set={PROCESS_RUN: flow_run_id},
        condition=Condition("attribute_not_exists(#run)", {"#run": PROCESS_RUN}),
    )


def _normal_url(url: str) -> str:
    """``url`` spelt one way for prefix checks: ``file://`` paths resolved (no ``..``, no symlinks), ``s3://`` as is."""
    parsed = urlparse(url)
    if parsed.scheme == "s3" and parsed.netloc:
        return f"s3://{parsed.netloc}{parsed.path or '/'}"
    if parsed.scheme in ("file", ""):
        return Path(unquote(parsed.path) if parsed.scheme else url).resolve().as_uri()
    raise SourceRefused(f"unsupported source_url {url!r}: use file:// or s3://")


def check_source_allowed(source_url: str, prefixes: list[str] | None = None) -> str:
    """``source_url`` if it lies under one of ``prefixes`` (default: the block's ``source_prefixes``; empty = any).

    Prefixes match whole path segments: ``s3://b/uploads/`` admits ``s3://b/uploads/x.mp4``, not ``s3://b/uploads-x/``.
    """
    prefixes = load_config(VideoInference).source_prefixes if prefixes is None else prefixes
    normal = _normal_url(source_url)
    if not prefixes:
        return source_url
    for prefix in prefixes:
        base = _normal_url(prefix).rstrip("/")
        if normal == base or normal.startswith(base + "/"):
            return source_url
    raise SourceRefused(
        f"source_url {source_url!r} is not under an allowed prefix ({', '.join(prefixes)}); "
        "set VideoInference.source_prefixes (VIDEO_INFERENCE_SOURCE_PREFIXES) to allow it"
    )


def import_source(job_id: JobId, source_url: str) -> str:
    """Copy a source under the allow-list (file://, s3://, path) to ``input/{job_id}/source.mp4``; returns its key."""
    check_source_allowed(source_url)
    store = object_store()
    source_store, source = open_url(source_url)
    try:
        with local_path(source_store, source) as path:
            store.put_file(video_keys.source_key(job_id), path)
    except ObjectNotFound:
        raise video_ffmpeg.InvalidMedia(f"no source at {source}") from None
    return video_keys.source_key(job_id)


def get_job(job_id: JobId) -> dict[str, Any]:
    """The job record; LookupError when it does not exist or was deleted (a deleted job is never served)."""
    item = state_store.get_item(_jobs(), _key(job_id))
    if item is None or item.get("status") == DELETED:
        raise LookupError(f"video job {job_id!r} not found")
    return state_store.to_plain(item)


def list_jobs(status: str | None = None) -> list[dict[str, Any]]:
    """Jobs that are not deleted (optionally of one status), oldest first."""
    if status == DELETED:
        raise ValueError("deleted jobs are not listed")
    items = state_store.scan_all(
        _jobs(), keep=lambda item: item.get("status") != DELETED and (status is None or item.get("status") == status)
    )
    return sorted((state_store.to_plain(i) for i in items), key=lambda i: i.get("created_at", ""))


# an absolute path (optionally a file:// URL), not part of another URL; group 1 is its last component
_ABSOLUTE_PATH = re.compile(r"(?<![\w./:])(?:file://)?/(?:[^\s'\"()\[\]:,;]+/)+([^\s'\"()\[\]:,;/]+)")


def public_reason(reason: str) -> str:
    """A failure message fit for records, logs and notifications: object keys instead of local paths, no secrets."""
    store = object_store()
    if isinstance(store, LocalStore):
        reason = reason.replace(store.url + "/", "").replace(f"{store.root}/", "")
    reason = _ABSOLUTE_PATH.sub(r"\1", reason)
    config = load_config(VideoInference)
    secrets = [config.api_key.get_secret_value() if config.api_key else None, VideoInference.env_raw("api_key")]
    return redact(reason, secrets + url_secrets(config.endpoint_url))[:2000]


def fail_job(job_id: JobId, reason: str) -> str | None:
    """Move an active job to ``failed`` with the (public) reason; returns it, or None when the job was not active."""
    reason = public_reason(reason)
    result = state_store.transition(
        _jobs(), _key(job_id), ACTIVE, FAILED, set={"failure_reason": reason, "failed_at": now_iso()}
    )
    return reason if result.applied else None


# attributes of one attempt, removed when a failed job is opened again
_ATTEMPT_ATTRS = (
    "failure_reason",
    "failed_at",
    "total_segments",
    "segment_frames",
    "segment_durations",
    "source_duration",
    "source_frames",
    "source_has_audio",
    "source_audio_start",
    "source_audio_duration",
    "source_size",
    "output_size",
    "normalised",
    "chunking_started_at",
    "chunking_completed_at",
    "final_key",
    "final_frames",
    "final_duration",
    "final_size",
    "final_audio_duration",
    "completed_at",
    "reconciled_at",
    "redrives",
    "redriven_at",
    "ttl",  # a finished job's retention (tasks/retention)
    WAITING_FOR_SPACE,
    WAITING_SINCE,
    SPACE_REDRIVES,
)


def clear_job_outputs(job_id: JobId) -> dict[str, int]:
    """Remove a job's segments, outputs, completion records and lock (its input stays)."""
    store = object_store()
    objects = sum(
        store.delete_prefix(prefix)
        for prefix in (video_keys.segments_prefix(job_id), video_keys.job_output_prefix(job_id))
    )
    records = state_store.batch_delete(
        _completions(), [{"job_id": job_id, "segment_index": r["segment_index"]} for r in completions(job_id)]
    )
    lock = state_store.delete_if(_locks(), _key(job_id)).item is not None
    return {"objects": objects, "completion_records": records, "locks": int(lock)}


def reopen_failed_job(job_id: JobId) -> bool:
    """A re-run of a failed job: clear its old segments, outputs, completions and lock, then failed -> created.

    Clearing comes first and is idempotent, so a crash in between leaves the job failed and the next re-run
    clears again. True when the job was reopened; False when it was not failed (nothing changed).
    """
    job = state_store.get_item(_jobs(), _key(job_id))
    if job is None or job.get("status") != FAILED:
        return False
    clear_job_outputs(job_id)
    result = state_store.transition(
        _jobs(),
        _key(job_id),
        FAILED,
        CREATED,
        set={"previous_failure_reason": job.get("failure_reason", ""), "reopened_at": now_iso()},
        add={"attempts": 1},
        remove=[a for a in _ATTEMPT_ATTRS if a in job],
    )
    if not result.applied:
        status = None if result.item is None else result.item.get("status")
        if status != CREATED:
            raise ValueError(f"video job {job_id!r} is {status}: it cannot be re-run")
    return True


# --------------------------------------------------------------------------- chunking


def start_chunking(job_id: JobId) -> dict[str, Any]:
    """created -> chunking_in_progress (a retry finds it already there), recording the Prefect run ids."""
    result = state_store.transition(
        _jobs(),
        _key(job_id),
        (CREATED, CHUNKING),
        CHUNKING,
        set={"chunking_started_at": now_iso(), **prefect_ids()},
        remove=[WAITING_FOR_SPACE, WAITING_SINCE],  # a run that takes a waiting job again: it no longer waits
    )
    if result.applied:
        return state_store.to_plain(result.item)
    if result.item is None:
        raise LookupError(f"video job {job_id!r} not found")
    status = result.item.get("status")
    if status in (CHUNKED, COMPLETED):  # a re-run: chunking is done, later steps are idempotent
        return state_store.to_plain(result.item)
    raise ValueError(f"video job {job_id!r} is {status}: it cannot be processed")


def open_job(job_id: JobId) -> dict[str, Any]:
    """A run's first step on its job: a failed job reopened (the documented re-run), then created -> chunking.

    One read decides for a new job (not failed: nothing to clear); ``reopened`` in the result says whether this run
    cleared a failed attempt. Both steps are idempotent, so a retry or a re-run after a crash in between redoes them.
    """
    reopened = reopen_failed_job(job_id)
    job = start_chunking(job_id)
    if WAITING_FOR_SPACE in job:  # a chunked job waiting for space, taken by a run: it no longer waits
        end_wait(job_id)
        job = {k: v for k, v in job.items() if k not in (WAITING_FOR_SPACE, WAITING_SINCE)}
    return {**job, "reopened": reopened}


def segment_keys_of(job: dict[str, Any]) -> list[str]:
    """The object keys of the job's ``total_segments`` segments, in order."""
    total = int(job["total_segments"])
    return [video_keys.segment_key(job["job_id"], i, total, job["mode"]) for i in range(total)]


def chunk_source(job_id: JobId, segment_seconds: float, mode: str) -> list[str]:
    """Split the source into segments (stream copy), upload them, then set total_segments + chunking_complete at
    once."""
    if mode not in video_ffmpeg.FILTERS:
        raise ValueError(f"unknown mode {mode!r}: choose one of {sorted(video_ffmpeg.FILTERS)}")
    if not segment_seconds or segment_seconds <= 0:
        raise ValueError(f"segment_seconds must be > 0, got {segment_seconds!r}")
    job = state_store.to_plain(state_store.get_item(_jobs(), _key(job_id)) or {})
    if job.get("status") in (CHUNKED, COMPLETED):
        return segment_keys_of(job)
    store = object_store()
    source = video_keys.source_key(job_id)
    with scratch_dir(store, "video-chunk-") as tmp:
        try:
            with local_path(store, source) as path:
                info = video_ffmpeg.probe(path, source)
                normalised = video_ffmpeg.normalisation(info)
                demuxer = info.demuxer
                if normalised:  # rotated, odd-sized or not mp4-borne: one upright, even-sided h264 picture first
                    video_ffmpeg.normalise(path, tmp / "normalised.mp4", segment_seconds, demuxer)
                    path, demuxer = tmp / "normalised.mp4", video_ffmpeg.OWN_DEMUXER
                parts = video_ffmpeg.segment(path, tmp / "parts", segment_seconds, demuxer)
        except ObjectNotFound:
            raise video_ffmpeg.InvalidMedia(f"no upload at {source}") from None
        total = len(parts)
        segment_keys = [video_keys.segment_key(job_id, i, total, mode) for i in range(total)]
        # each segment probed once here; its output must match (frames, duration) before it counts as done
        probes = [video_ffmpeg.probe(part, key) for part, key in zip(parts, segment_keys)]
        if sum(p.frames for p in probes) != info.frames:
            raise video_ffmpeg.InvalidMedia(
                f"segmenting {source} kept {sum(p.frames for p in probes)} of its {info.frames} frames"
            )
        for part, key in zip(parts, segment_keys):
            put_finished_file(store, key, part)
    picture = video_ffmpeg.even_size(*info.display_size) if normalised else info.display_size
    attempt = {
        "source_audio_start": round(info.audio_start, 6),
        "source_audio_duration": round(info.audio_duration, 6),
        "source_size": "{}x{}".format(*info.display_size),
        "source_format": info.demuxer,  # reassembly reads the source's audio with the demuxer its probe accepted
        "output_size": "{}x{}".format(*video_ffmpeg.output_size(mode, *picture)),
    }
    if normalised:
        attempt["normalised"] = normalised
    result = state_store.transition(
        _jobs(),
        _key(job_id),
        CHUNKING,
        CHUNKED,
        set={
            "total_segments": total,
            "mode": mode,
            "segment_seconds": float(segment_seconds),
            "source_duration": info.duration,
            "source_frames": info.frames,
            "source_has_audio": info.has_audio,
            "segment_frames": [p.frames for p in probes],
            "segment_durations": [round(p.duration, 6) for p in probes],
            "chunking_completed_at": now_iso(),
            **attempt,
        },
    )
    if not result.applied:
        current = result.item or {}
        if current.get("status") in (CHUNKED, COMPLETED) and int(current.get("total_segments", -1)) == total:
            return segment_keys
        raise RuntimeError(
            f"video job {job_id!r} left chunking_in_progress while chunking (now {current.get('status')})"
        )
    return segment_keys


# --------------------------------------------------------------------------- segments and the trigger


def count_completions(job_id: JobId) -> int:
    """count(SegmentCompletions) for the job: Query with Select=COUNT, strongly consistent, all pages."""
    return state_store.count(
        _completions(), KeyConditionExpression=Key("job_id").eq(parse_job_id(job_id)), ConsistentRead=True
    )


def completions(job_id: JobId) -> list[dict[str, Any]]:
    """The job's SegmentCompletion records in segment order (strongly consistent)."""
    items = state_store.query_all(
        _completions(), KeyConditionExpression=Key("job_id").eq(parse_job_id(job_id)), ConsistentRead=True
    )
    return [state_store.to_plain(i) for i in items]


def record_completion(segment: video_keys.SegmentKey, output_key: str) -> Outcome:
    """Write the segment's SegmentCompletion once (a retry or duplicate finds it there)."""
    item = {
        "job_id": segment.job_id,
        "segment_index": segment.segment_index,
        "total_segments": segment.total_segments,
        "segment_key": video_keys.segment_key(
            segment.job_id, segment.segment_index, segment.total_segments, segment.mode
        ),
        "output_key": output_key,
        "completed_at": now_iso(),
        **prefect_ids(),
    }
    return state_store.create_if_absent(_completions(), item, ["job_id", "segment_index"]).outcome


def trigger_on_write(job_id: JobId, total: int | None = None) -> bool:
    """After a completion put: if chunking_complete and all segments are done, create the lock. True for the one
    winner.

    ``total``: the job's ``total_segments`` as the caller read it at ``chunking_complete`` (a segment's task): the
    count comes first and the job is read only once it reaches ``total``, so every segment but the last skips that
    read; the job read still decides (status and total as they are now).
    """
    counted = None if total is None else count_completions(job_id)
    if counted is not None and counted != total:
        return False
    job = state_store.get_item(_jobs(), _key(job_id))
    if job is None or job.get("status") != CHUNKED:
        return False
    if (count_completions(job_id) if counted is None else counted) != int(job["total_segments"]):
        return False
    lock = {"job_id": job_id, "triggered_at": now_iso(), **prefect_ids()}
    return state_store.create_if_absent(_locks(), lock, ["job_id"]).applied


def check_output(path: Path, output_key: str, index: int, job: dict[str, Any], backend: str) -> None:
    """The backend's output is the segment's video: same frame count, same duration (within a frame).

    A backend that answers 200 with something else (a JSON error body, a cut-short file) raises InferenceError
    here, before anything records the segment as done.
    """
    frames, durations = job.get("segment_frames"), job.get("segment_durations")
    try:
        info = video_ffmpeg.probe(path, output_key)
    except video_ffmpeg.InvalidMedia as error:
        raise video_inference.InferenceError(
            f"{backend} backend output for segment {index} is no video: {error}"
        ) from None
    if frames is None or durations is None:  # a job chunked before segments were probed
        return
    want_frames, want_duration = int(frames[index]), float(durations[index])
    tolerance = 1.5 / info.fps if info.fps else 0.1
    if info.frames != want_frames or abs(info.duration - want_duration) > tolerance:
        raise video_inference.InferenceError(
            f"{backend} backend output for segment {index} has {info.frames} frames / {info.duration:.3f} s; "
            f"the segment has {want_frames} frames / {want_duration:.3f} s"
        )


def infer_segment(segment_key: str, backend: str | None = None, mode: str | None = None) -> dict[str, Any]:
    """Run the backend on one segment, store its output, record the completion, then run the trigger."""
    segment = video_keys.parse_segment_key(segment_key)
    config = load_config(VideoInference)
    backend = backend or config.backend
    mode = mode or segment.mode
    job = state_store.get_item(_jobs(), _key(segment.job_id))
    if job is None or job.get("status") != CHUNKED:
        status = None if job is None else job.get("status")
        return {"segment_index": segment.segment_index, "skipped": f"job is {status}", "triggered": False}
    store = object_store()
    output = video_keys.output_segment_key(segment.job_id, segment.segment_index, segment.total_segments, mode)
    if not store.exists(output):  # outputs are written atomically: present means complete
        if backend == "ffmpeg" and mode == "identity":
            copy_object(store, segment_key, output)  # identity: the output is the segment, unchanged
        else:
            with scratch_dir(store, "video-infer-") as tmp, local_path(store, segment_key) as path:
                target = tmp / "output.mp4"
                api_key = config.api_key.get_secret_value() if config.api_key else None
                video_inference.infer(
                    backend,
                    path,
                    target,
                    mode,
                    endpoint_url=config.endpoint_url,
                    timeout_s=config.timeout_s,
                    api_key=api_key,
                    source_url=store.url_for(segment_key),
                    endpoint_name=config.endpoint_name,
                    batch_size=config.batch_size,
                )
                check_output(target, output, segment.segment_index, job, backend)
                found = video_inference.detections_file(target)
                if found.is_file():  # before the output: a present output means the segment is finished
                    store.put_file(
                        video_keys.detections_key(segment.job_id, segment.segment_index, segment.total_segments, mode),
                        found,
                    )
                put_finished_file(store, output, target)
    outcome = record_completion(segment, output)
    return {
        "segment_index": segment.segment_index,
        "output_key": output,
        "completion": outcome.value,
        "triggered": trigger_on_write(segment.job_id, int(job["total_segments"])),
    }


# --------------------------------------------------------------------------- reassembly


def claim_reassembly(job_id: JobId, owner: str, stale_after_s: float = 900.0) -> state_store.WriteResult:
    """Set ``reassembly_started_at`` on the lock only if unset (or ours, or stale): one worker reassembles."""
    stale = iso_ago(stale_after_s)
    return state_store.transition(
        _locks(),
        _key(job_id),
        None,
        None,
        set={"reassembly_started_at": now_iso(), "reassembly_owner": owner, **prefect_ids()},
        condition=Condition(
            "attribute_not_exists(#started) OR #owner = :owner OR #started < :stale",
            names={"#started": "reassembly_started_at", "#owner": "reassembly_owner"},
            values={":owner": owner, ":stale": stale},
        ),
    )


def reassembly_pending(job_id: JobId) -> bool:
    """The trigger fired but no reassembly finished (e.g. the worker died): a re-run should reassemble."""
    job = state_store.get_item(_jobs(), _key(job_id))
    lock = state_store.get_item(_locks(), _key(job_id))
    return bool(job and job.get("status") == CHUNKED and lock and "reassembly_completed_at" not in lock)


DURATION_TOLERANCE_S = 0.1  # how far the final's picture and sound may end from the source's


def final_problems(info: video_ffmpeg.MediaInfo, job: dict[str, Any]) -> list[str]:
    """How the final output differs from the job's source (frames, duration, picture size, audio); empty if it
    matches."""
    problems, tolerance = [], DURATION_TOLERANCE_S
    if "source_frames" in job and info.frames != int(job["source_frames"]):
        problems.append(f"{info.frames} frames, the source {int(job['source_frames'])}")
    if "source_duration" in job and abs(info.duration - float(job["source_duration"])) > tolerance:
        problems.append(f"{info.duration:.3f} s of picture, the source {float(job['source_duration']):.3f} s")
    if job.get("output_size") and "{}x{}".format(*info.display_size) != job["output_size"]:
        problems.append("a {}x{} picture, {} expected".format(*info.display_size, job["output_size"]))
    if "source_has_audio" in job and info.has_audio != bool(job["source_has_audio"]):
        problems.append("no audio, the source has audio" if job["source_has_audio"] else "audio the source has not")
    elif info.has_audio and "source_audio_duration" in job:
        want_start, want_length = float(job["source_audio_start"]), float(job["source_audio_duration"])
        if abs(info.audio_duration - want_length) > tolerance or abs(info.audio_start - want_start) > tolerance:
            problems.append(
                f"audio {info.audio_duration:.3f} s from {info.audio_start:.3f} s, "
                f"the source's {want_length:.3f} s from {want_start:.3f} s"
            )
    return problems


def _valid_final(store: ObjectStore, key: str, job: dict[str, Any]) -> video_ffmpeg.MediaInfo | None:
    """The probe of an existing final.mp4 that matches the source (a finished earlier attempt), else None."""
    if not store.exists(key):
        return None
    with local_path(store, key) as path:
        try:
            info = video_ffmpeg.probe(path, key)
        except video_ffmpeg.InvalidMedia:
            return None
    return None if final_problems(info, job) else info


@dataclass(frozen=True)
class ReassemblyWork:
    """What a reassembly works from once it holds the lock: the job as read (plain values) and its completions."""

    job_id: JobId
    job: dict[str, Any]
    completions: list[dict[str, Any]]

    @property
    def total(self) -> int:
        """The job's ``total_segments``."""
        return int(self.job["total_segments"])


def take_reassembly(job_id: JobId, owner: str, stale_after_s: float) -> ReassemblyWork | dict[str, Any]:
    """Read the job, claim the lock, read the completions (in that order: they are read only once the lock is held);
    the work, or the answer when there is none (already completed, another worker holds the lock)."""
    item = state_store.get_item(_jobs(), _key(job_id))
    if item is None:
        raise LookupError(f"video job {job_id!r} not found")
    job = state_store.to_plain(item)
    if job["status"] == COMPLETED:
        return {"job_id": job_id, "status": COMPLETED, "final_key": video_keys.final_key(job_id), "reassembled": False}
    if job["status"] != CHUNKED:
        raise ValueError(f"video job {job_id!r} is {job['status']}: nothing to reassemble")
    claim = claim_reassembly(job_id, owner, stale_after_s)
    if not claim.applied:
        if claim.item is None:
            raise LookupError(f"video job {job_id!r} has no reassembly lock: the trigger has not fired")
        return {"job_id": job_id, "status": CHUNKED, "reassembled": False, "skipped": "another worker holds the lock"}
    work = ReassemblyWork(job_id, job, completions(job_id))
    indices = [r["segment_index"] for r in work.completions]
    if indices != list(range(work.total)):
        raise RuntimeError(f"video job {job_id!r}: completions {indices} do not cover segments 0..{work.total - 1}")
    return work


def _source_format(work: ReassemblyWork, source: Path | None) -> str:
    """The demuxer the source's probe accepted: as chunking recorded it, else (a job chunked before it was
    recorded) from probing the source again."""
    if source is None:
        return video_ffmpeg.OWN_DEMUXER
    return work.job.get("source_format") or video_ffmpeg.probe(source, video_keys.source_key(work.job_id)).demuxer


def _write_final(store: ObjectStore, final: str, work: ReassemblyWork) -> video_ffmpeg.MediaInfo:
    """Concat the completed outputs (with the source's own audio) into ``final``, checked against the source;
    bad media cannot get better by retrying, so it fails the job with the reason (JobFailed)."""
    try:
        with scratch_dir(store, "video-concat-") as tmp, contextlib.ExitStack() as stack:
            parts = [stack.enter_context(local_path(store, r["output_key"])) for r in work.completions]
            # the source's own audio track, whole, onto the joined picture (segments carry no audio)
            audio = (
                stack.enter_context(local_path(store, video_keys.source_key(work.job_id)))
                if work.job.get("source_has_audio")
                else None
            )
            target = tmp / "final.mp4"
            video_ffmpeg.concat(parts, target, audio, _source_format(work, audio))
            info = video_ffmpeg.probe(target, final)
            problems = final_problems(info, work.job)
            if problems:
                raise video_ffmpeg.InvalidMedia(f"{final} does not match the source: it has {'; '.join(problems)}")
            put_finished_file(store, final, target)
    except (video_ffmpeg.FfmpegError, video_ffmpeg.InvalidMedia, ObjectNotFound) as error:
        reason = fail_job(work.job_id, f"reassembly failed: {error}")
        raise JobFailed(f"video job {work.job_id} failed: {reason or public_reason(str(error))}") from None
    return info


def finish_reassembly(job_id: JobId, final: str, info: video_ffmpeg.MediaInfo) -> None:
    """chunking_complete -> completed with the final's figures, and the lock marked done, in one transaction; when
    it cannot land (the job moved, the lock is gone) the two writes go one by one, as each stands."""
    done = {
        "final_key": final,
        "completed_at": now_iso(),
        "final_duration": info.duration,
        "final_frames": info.frames,
        "final_size": "{}x{}".format(*info.display_size),
        "final_audio_duration": round(info.audio_duration, 6),
    }
    lock_done = {"reassembly_completed_at": now_iso()}
    lock_entry = state_store.transition_entry(_locks(), _key(job_id), None, None, lock_done)
    if state_store.transition_all(_jobs(), [(_key(job_id), CHUNKED, COMPLETED, done)], also=[lock_entry]):
        return
    moved = state_store.transition(_jobs(), _key(job_id), CHUNKED, COMPLETED, set=done)
    if not moved.applied and (moved.item or {}).get("status") != COMPLETED:
        raise RuntimeError(
            f"video job {job_id!r} left chunking_complete during reassembly ({(moved.item or {}).get('status')})"
        )
    state_store.transition(_locks(), _key(job_id), None, None, set=lock_done)


def reassemble(job_id: JobId, owner: str | None = None, stale_after_s: float = 900.0) -> dict[str, Any]:
    """Claim the lock, concat the outputs listed by the completion store, write final.mp4, mark the job completed."""
    owner = owner or prefect_ids().get("prefect_flow_run_id") or uuid.uuid4().hex
    work = take_reassembly(job_id, owner, stale_after_s)
    if not isinstance(work, ReassemblyWork):
        return work
    store, final = object_store(), video_keys.final_key(job_id)
    info = _valid_final(store, final, work.job)
    reused = info is not None
    if info is None:
        info = _write_final(store, final, work)
    finish_reassembly(job_id, final, info)
    return {
        "job_id": job_id,
        "status": COMPLETED,
        "final_key": final,
        "reassembled": not reused,
        "duration": info.duration,
        "frames": info.frames,
        "segments": work.total,
    }


# --------------------------------------------------------------------------- removal


def request_delete(job_id: JobId) -> dict[str, Any]:
    """Soft delete: completed/failed -> deleted. A running job is refused; a deleted one is not found."""
    result = state_store.transition(_jobs(), _key(job_id), DELETABLE, DELETED, set={"deleted_at": now_iso()})
    if result.applied:
        return {"job_id": job_id, "status": DELETED, "message": "Job removed. Cleanup in progress."}
    status = None if result.item is None else result.item.get("status")
    if status in (None, DELETED):
        raise LookupError(f"video job {job_id!r} not found")
    raise ValueError(f"video job {job_id!r} is {status}: only completed or failed jobs can be deleted")


def cleanup_deleted_job(job_id: JobId) -> dict[str, int]:
    """Remove a deleted job's input, segments, outputs, completion and lock records; the job row stays."""
    job = state_store.get_item(_jobs(), _key(job_id))
    if job is None or job.get("status") != DELETED:
        status = None if job is None else job.get("status")
        raise ValueError(f"video job {job_id!r} is {status}: only deleted jobs are cleaned up")
    inputs = object_store().delete_prefix(video_keys.input_prefix(job_id))
    removed = clear_job_outputs(job_id)
    # the row stays `deleted`; cleaned_up_at tells the scheduled sweep this job needs nothing more
    state_store.transition(_jobs(), _key(job_id), DELETED, None, set={"cleaned_up_at": now_iso()})
    return {**removed, "objects": removed["objects"] + inputs}


def deleted_jobs_awaiting_cleanup() -> list[JobId]:
    """Ids of soft-deleted jobs whose cleanup has not finished (the scheduled sweep's work list)."""
    items = state_store.scan_all(
        _jobs(), keep=lambda item: item.get("status") == DELETED and not item.get("cleaned_up_at")
    )
    return sorted(parse_job_id(item["job_id"]) for item in items)


# --------------------------------------------------------------------------- a full disk: the job waits


def wait_for_space(job_id: JobId, reason: str) -> bool:
    """A job whose chunking, segment or reassembly met a full disk: what it published half-way removed (the segments
    of a chunking that stopped; an output or final.mp4 is only ever renamed in whole), and the job left active with
    ``waiting_for_space`` (the public reason) and its time, for `video-sweep-stuck` to take it again once the disk
    has room. True when recorded; False when the job is no longer active (nothing changed)."""
    job = state_store.get_item(_jobs(), _key(job_id))
    if job is None or job.get("status") not in (CHUNKING, CHUNKED):
        return False
    if job.get("status") == CHUNKING:  # its segments are not the job's until chunking_complete records them
        object_store().delete_prefix(video_keys.segments_prefix(job_id))
    return state_store.transition(
        _jobs(),
        _key(job_id),
        (CHUNKING, CHUNKED),
        None,
        set={WAITING_FOR_SPACE: public_reason(reason)[:1000], WAITING_SINCE: now_iso()},
    ).applied


def end_wait(job_id: JobId) -> bool:
    """The job no longer waits for space (it is taken again); True when it was waiting."""
    return state_store.transition(
        _jobs(),
        _key(job_id),
        (CHUNKING, CHUNKED),
        None,
        remove=[WAITING_FOR_SPACE, WAITING_SINCE],
        condition=Condition("attribute_exists(#waiting)", {"#waiting": WAITING_FOR_SPACE}),
    ).applied


def short_of_space(job_id: JobId) -> disk.DiskUsage | None:
    """The reading of the store's disk while it lacks room for the job's writes (about ``ROOM_PER_SOURCE_BYTE``
    times its source); None once the job can be taken again."""
    store = object_store()
    try:
        source_bytes = store.size(video_keys.source_key(job_id))
    except ObjectNotFound:
        source_bytes = 0
    return disk.short_of_space(store.disk_folder(), ROOM_PER_SOURCE_BYTE * source_bytes)


# --------------------------------------------------------------------------- stuck jobs


def note_reassembly_run(job_id: JobId, flow_run_id: str) -> None:
    """Record on the lock the `video-reassemble` run that was queued, so the stuck-job sweep knows it is alive."""
    state_store.transition(_locks(), _key(job_id), None, None, set={"reassembly_flow_run_id": flow_run_id})


MAX_REDRIVES = 2  # re-runs a job gets after its runs died, before it is failed with the reason


def holders(job: dict[str, Any], lock: dict[str, Any] | None) -> list[str]:
    """The Prefect flow runs that may be working on a job: its process run, and the reassembly runs of its lock."""
    lock = lock or {}
    runs = {job.get("prefect_flow_run_id"), lock.get("prefect_flow_run_id"), lock.get("reassembly_flow_run_id")}
    return sorted(str(r) for r in runs if r)


def stuck_candidates(older_than_s: float) -> list[dict[str, Any]]:
    """Jobs ``chunking_complete`` for longer than ``older_than_s``, and jobs waiting for space (at any age), with the
    Prefect flow runs that may hold them and whether they wait for space."""
    cutoff = iso_ago(older_than_s)

    def stuck(item: dict[str, Any]) -> bool:
        if item.get("status") in (CHUNKING, CHUNKED) and WAITING_FOR_SPACE in item:
            return True
        return item.get("status") == CHUNKED and str(item.get("chunking_completed_at", "")) < cutoff

    jobs = sorted(state_store.scan_all(_jobs(), keep=stuck), key=lambda i: i["job_id"])
    locks = {lock["job_id"]: lock for lock in state_store.get_many(_locks(), (_key(job["job_id"]) for job in jobs))}
    return [
        {
            "job_id": parse_job_id(job["job_id"]),
            "flow_run_ids": holders(job, locks.get(job["job_id"])),
            "waiting_for_space": WAITING_FOR_SPACE in job,
        }
        for job in jobs
    ]


def redrive_run(job_id: JobId, ended_run_id: str) -> str | None:
    """A new run of the deployment whose run ``ended_run_id`` held the job, with that run's parameters for this job;
    its id, or None when that run had no deployment. Idempotent: a second call for the same ended run gets the
    same new run (so two handlers of one crash start one run)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound as RunNotFound

    with get_client(sync_client=True) as client:
        try:
            ended = client.read_flow_run(uuid.UUID(str(ended_run_id)))
        except (RunNotFound, ValueError):
            return None
        if ended.deployment_id is None:
            return None
        parameters = {k: v for k, v in (ended.parameters or {}).items() if k != "source_url"}  # imported already
        run = client.create_flow_run_from_deployment(
            ended.deployment_id,
            parameters={**parameters, "job_id": job_id},
            idempotency_key=f"video-redrive-{job_id}-{ended_run_id}",
        )
    return str(run.id)


def recover_stuck_job(
    job_id: JobId, owner: str | None = None, why: str = "", max_redrives: int = MAX_REDRIVES
) -> dict[str, Any]:
    """A job left chunking (or ``chunking_complete``) with no live run: reassemble when every segment is done, else
    re-drive it (a new run of its deployment, at most ``max_redrives`` times), else fail it with the reason.

    A job waiting for space is left waiting while the disk lacks room; once it has room it is taken the same way,
    its re-drive not counted against ``max_redrives`` (a full disk is not the job's fault, so it never fails it).
    The caller has checked that no Prefect run holding the job is alive, so a reassembly claim is taken over.
    ``owner``: act only while the job is still held by that run (a re-driven job belongs to its new run).
    """
    job = state_store.get_item(_jobs(), _key(job_id))
    status = None if job is None else job.get("status")
    if job is None or status not in (CHUNKING, CHUNKED) or (owner and job.get("prefect_flow_run_id") != owner):
        return {"job_id": job_id, "status": status, "action": "none"}
    waiting = WAITING_FOR_SPACE in job
    short = short_of_space(job_id) if waiting else None
    if short is not None:
        return {"job_id": job_id, "status": status, "action": "waiting for space", "disk": short.describe()}
    total, done = (int(job["total_segments"]), count_completions(job_id)) if status == CHUNKED else (None, 0)
    if done == total:
        return _reassemble_stuck(job_id, waiting)
    if waiting:
        return _redrive_after_wait(job_id, job)
    progress = "chunking" if total is None else f"{done} of {total} segments done"
    redrives, ended = int(job.get("redrives", 0)), job.get("prefect_flow_run_id")
    new_run = redrive_run(job_id, ended) if ended and redrives < max_redrives else None
    if new_run:
        moved = _hand_to_run(job_id, job, new_run, "redrives", {"redrives": job.get("redrives")})
        action = "re-driven" if moved else "none"
        return {"job_id": job_id, "status": status, "action": action, "flow_run_id": new_run, "redrives": redrives + 1}
    cause = f"after {redrives} re-drives" if redrives else "and no run working on it"
    reason = fail_job(
        job_id,
        f"stuck in {status} with {progress} {cause}{f' ({why})' if why else ''}; re-run video-process for the job",
    )
    return {
        "job_id": job_id,
        "status": FAILED if reason else status,
        "action": "failed" if reason else "none",
        "reason": reason,
    }


def _reassemble_stuck(job_id: JobId, waiting: bool) -> dict[str, Any]:
    """Every segment of a stuck job is done: reassemble it here (the trigger taken if its worker died before it); a
    full disk met again leaves it waiting."""
    if waiting:
        end_wait(job_id)
    lock = {"job_id": job_id, "triggered_at": now_iso(), **prefect_ids()}
    state_store.create_if_absent(_locks(), lock, ["job_id"])  # the trigger, if its worker died before it
    try:
        result = reassemble(job_id, owner=f"sweep-{uuid.uuid4().hex}", stale_after_s=0)
    except JobFailed as error:
        return {"job_id": job_id, "status": FAILED, "action": "reassembly failed", "reason": str(error)}
    except Exception as error:
        if not disk.is_disk_full(error):
            raise
        wait_for_space(job_id, f"reassembly met a full disk: {error}")
        return {"job_id": job_id, "status": CHUNKED, "action": "waiting for space", "reason": public_reason(str(error))}
    return {"job_id": job_id, "status": result["status"], "action": "reassembled"}


def _redrive_after_wait(job_id: JobId, job: dict[str, Any]) -> dict[str, Any]:
    """A job that waited for space, with room again: a new run of the deployment of the run that left it waiting,
    counted in ``space_redrives`` (not ``redrives``). With no deployment to re-run (its run was started by hand
    outside one) it stays waiting: a re-run of video-process takes it."""
    status, ended = job["status"], job.get("prefect_flow_run_id")
    new_run = redrive_run(job_id, ended) if ended else None
    if not new_run:
        return {"job_id": job_id, "status": status, "action": "none", "reason": "no deployment run to re-drive"}
    waited = {WAITING_SINCE: job.get(WAITING_SINCE)}
    moved = _hand_to_run(job_id, job, new_run, SPACE_REDRIVES, waited, [WAITING_FOR_SPACE, WAITING_SINCE])
    return {"job_id": job_id, "status": status, "action": "re-driven" if moved else "none", "flow_run_id": new_run}


def _hand_to_run(
    job_id: JobId, job: dict[str, Any], new_run: str, counter: str, guard: dict[str, Any], remove: tuple = ()
) -> bool:
    """The job now belongs to its re-drive run ``new_run`` (counted in ``counter``), if its run and ``guard`` are
    unchanged: a late or second report of the old run changes nothing. Whether it moved."""
    return state_store.transition(
        _jobs(),
        _key(job_id),
        job["status"],
        None,
        set={"prefect_flow_run_id": new_run, "redriven_at": now_iso()},
        add={counter: 1},
        remove=["prefect_task_run_id", *remove],
        condition=state_store.unchanged({"prefect_flow_run_id": job.get("prefect_flow_run_id"), **guard}, "r"),
    ).applied
