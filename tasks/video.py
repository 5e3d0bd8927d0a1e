"""Task bodies of the video pipeline (seed 003), plain functions callable without Prefect.

upload -> chunking -> segment processing (inference) -> segment completion -> reassembly trigger ->
reassembly -> final output; plus soft delete and cleanup. The job store (``video_jobs``) is authoritative
for status: created -> chunking_in_progress -> chunking_complete -> completed, or failed, or deleted.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from boto3.dynamodb.conditions import Key

from blocks import VideoInference, load_config
from tasks import keys, state_store, video_ffmpeg, video_inference
from tasks.config import object_store, table_name
from tasks.object_store import LocalStore, ObjectNotFound, ObjectStore, open_url
from tasks.state_store import Condition, Outcome

CREATED = "created"
CHUNKING = "chunking_in_progress"
CHUNKED = "chunking_complete"
COMPLETED = "completed"
FAILED = "failed"
DELETED = "deleted"
ACTIVE = (CREATED, CHUNKING, CHUNKED)
DELETABLE = (COMPLETED, FAILED)


class JobFailed(RuntimeError):
    """The job was marked failed; the message is the recorded reason."""


def _jobs() -> str:
    return table_name("video_jobs")


def _completions() -> str:
    return table_name("video_segment_completions")


def _locks() -> str:
    return table_name("video_reassembly_locks")


def now() -> str:
    """UTC timestamp with a fixed width, so strings order like times."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def prefect_ids() -> dict[str, str]:
    """The current Prefect flow run / task run ids (as strings), skipping those that are None."""
    from prefect.runtime import flow_run, task_run

    ids = {"prefect_flow_run_id": flow_run.id, "prefect_task_run_id": task_run.id}
    return {name: str(value) for name, value in ids.items() if value}


def _key(job_id: str) -> dict[str, str]:
    return {"job_id": keys.safe_id(job_id, "job_id")}


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
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # EXDEV: another filesystem, copy instead
            os.replace(path, target)
            return
    store.put_file(key, path)


def copy_object(store: ObjectStore, src: str, dst: str) -> None:
    """``dst`` gets ``src``'s bytes: a hard link on a local store (objects are never rewritten in place), else a copy."""
    if isinstance(store, LocalStore):
        source, target = store.path(src), store.path(dst)
        if not source.is_file():
            raise ObjectNotFound(store.url_for(src))
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
        with contextlib.suppress(OSError):
            os.link(source, staged)
            os.replace(staged, target)
            return
    store.copy(src, dst)


# --------------------------------------------------------------------------- job store


def create_job(
    job_id: str | None = None, mode: str | None = None, segment_seconds: float | None = None
) -> dict[str, Any]:
    """Create a job (status ``created``); returns its id and the upload target for ``input/{job_id}/source.mp4``."""
    job_id = keys.safe_id(uuid.uuid4().hex if job_id is None else job_id, "job_id")
    if mode is not None and mode not in video_ffmpeg.FILTERS:
        raise ValueError(f"unknown mode {mode!r}: choose one of {sorted(video_ffmpeg.FILTERS)}")
    item = {"job_id": job_id, "status": CREATED, "created_at": now(), "source_key": keys.source_key(job_id)}
    if mode:
        item["mode"] = mode
    if segment_seconds:
        item["segment_seconds"] = float(segment_seconds)
    result = state_store.create_if_absent(_jobs(), item, ["job_id"])
    if not result.applied:
        raise ValueError(f"video job {job_id!r} already exists (status {result.item.get('status')})")
    target = object_store().presign_put(keys.source_key(job_id))
    return {"job_id": job_id, "status": CREATED, "source_key": item["source_key"], "upload_target": target}


def import_source(job_id: str, source_url: str) -> str:
    """Copy a source that lives anywhere (file://, s3://, path) to ``input/{job_id}/source.mp4``."""
    store = object_store()
    source_store, source = open_url(source_url)
    with local_path(source_store, source) as path:
        return store.put_file(keys.source_key(job_id), path)


def get_job(job_id: str) -> dict[str, Any]:
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


def fail_job(job_id: str, reason: str) -> bool:
    """Move an active job to ``failed`` with the reason; False when it was not active (nothing changed)."""
    result = state_store.transition(
        _jobs(), _key(job_id), ACTIVE, FAILED, set={"failure_reason": reason[:2000], "failed_at": now()}
    )
    return result.applied


# --------------------------------------------------------------------------- chunking


def start_chunking(job_id: str) -> dict[str, Any]:
    """created -> chunking_in_progress (a retry finds it already there), recording the Prefect run ids."""
    result = state_store.transition(
        _jobs(), _key(job_id), (CREATED, CHUNKING), CHUNKING, set={"chunking_started_at": now(), **prefect_ids()}
    )
    if result.applied:
        return state_store.to_plain(result.item)
    if result.item is None:
        raise LookupError(f"video job {job_id!r} not found")
    status = result.item.get("status")
    if status in (CHUNKED, COMPLETED):  # a re-run: chunking is done, later steps are idempotent
        return state_store.to_plain(result.item)
    raise ValueError(f"video job {job_id!r} is {status}: it cannot be processed")


def segment_keys_of(job: dict[str, Any]) -> list[str]:
    total = int(job["total_segments"])
    return [keys.segment_key(job["job_id"], i, total, job["mode"]) for i in range(total)]


def chunk_source(job_id: str, segment_seconds: float, mode: str) -> list[str]:
    """Split the source into segments (stream copy), upload them, then set total_segments + chunking_complete at once."""
    if mode not in video_ffmpeg.FILTERS:
        raise ValueError(f"unknown mode {mode!r}: choose one of {sorted(video_ffmpeg.FILTERS)}")
    if not segment_seconds or segment_seconds <= 0:
        raise ValueError(f"segment_seconds must be > 0, got {segment_seconds!r}")
    job = state_store.to_plain(state_store.get_item(_jobs(), _key(job_id)) or {})
    if job.get("status") in (CHUNKED, COMPLETED):
        return segment_keys_of(job)
    store = object_store()
    source = keys.source_key(job_id)
    with scratch_dir(store, "video-chunk-") as tmp:
        try:
            with local_path(store, source) as path:
                info = video_ffmpeg.probe(path)
                parts = video_ffmpeg.segment(path, tmp, segment_seconds)
        except ObjectNotFound:
            raise video_ffmpeg.InvalidMedia(f"no upload at {source}") from None
        total = len(parts)
        segment_keys = [keys.segment_key(job_id, i, total, mode) for i in range(total)]
        for part, key in zip(parts, segment_keys):
            put_finished_file(store, key, part)
    result = state_store.transition(
        _jobs(), _key(job_id), CHUNKING, CHUNKED,
        set={
            "total_segments": total, "mode": mode, "segment_seconds": float(segment_seconds),
            "source_duration": info.duration, "source_frames": info.frames, "source_has_audio": info.has_audio,
            "chunking_completed_at": now(),
        },
    )
    if not result.applied:
        current = result.item or {}
        if current.get("status") in (CHUNKED, COMPLETED) and int(current.get("total_segments", -1)) == total:
            return segment_keys
        raise RuntimeError(f"video job {job_id!r} left chunking_in_progress while chunking (now {current.get('status')})")
    return segment_keys


# --------------------------------------------------------------------------- segments and the trigger


def count_completions(job_id: str) -> int:
    """count(SegmentCompletions) for the job: Query with Select=COUNT, strongly consistent, all pages."""
    table = state_store.table(_completions())
    query: dict[str, Any] = dict(
        KeyConditionExpression=Key("job_id").eq(keys.safe_id(job_id, "job_id")), Select="COUNT", ConsistentRead=True
    )
    count = 0
    while True:
        page = table.query(**query)
        count += page["Count"]
        if "LastEvaluatedKey" not in page:
            return count
        query["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def completions(job_id: str) -> list[dict[str, Any]]:
    """The job's SegmentCompletion records in segment order (strongly consistent)."""
    items = state_store.query_all(
        _completions(), KeyConditionExpression=Key("job_id").eq(keys.safe_id(job_id, "job_id")), ConsistentRead=True
    )
    return [state_store.to_plain(i) for i in items]


def record_completion(segment: keys.SegmentKey, output_key: str) -> Outcome:
    """Write the segment's SegmentCompletion once (a retry or duplicate finds it there)."""
    item = {
        "job_id": segment.job_id, "segment_index": segment.segment_index, "total_segments": segment.total_segments,
        "segment_key": keys.segment_key(segment.job_id, segment.segment_index, segment.total_segments, segment.mode),
        "output_key": output_key, "completed_at": now(), **prefect_ids(),
    }
    return state_store.create_if_absent(_completions(), item, ["job_id", "segment_index"]).outcome


def trigger_on_write(job_id: str) -> bool:
    """After a completion put: if chunking_complete and all segments are done, create the lock. True for the one winner."""
    job = state_store.get_item(_jobs(), _key(job_id))
    if job is None or job.get("status") != CHUNKED:
        return False
    if count_completions(job_id) != int(job["total_segments"]):
        return False
    lock = {"job_id": job_id, "triggered_at": now(), **prefect_ids()}
    return state_store.create_if_absent(_locks(), lock, ["job_id"]).applied


def infer_segment(segment_key: str, backend: str | None = None, mode: str | None = None) -> dict[str, Any]:
    """Run the backend on one segment, store its output, record the completion, then run the trigger."""
    segment = keys.parse_segment_key(segment_key)
    config = load_config(VideoInference)
    backend = backend or config.backend
    mode = mode or segment.mode
    job = state_store.get_item(_jobs(), _key(segment.job_id))
    if job is None or job.get("status") != CHUNKED:
        status = None if job is None else job.get("status")
        return {"segment_index": segment.segment_index, "skipped": f"job is {status}", "triggered": False}
    store = object_store()
    output = keys.output_segment_key(segment.job_id, segment.segment_index, segment.total_segments, mode)
    if not store.exists(output):  # outputs are written atomically: present means complete
        if backend == "ffmpeg" and mode == "identity":
            copy_object(store, segment_key, output)  # identity: the output is the segment, unchanged
        else:
            with scratch_dir(store, "video-infer-") as tmp, local_path(store, segment_key) as path:
                target = tmp / "output.mp4"
                api_key = config.api_key.get_secret_value() if config.api_key else None
                video_inference.infer(
                    backend, path, target, mode, endpoint_url=config.endpoint_url, timeout_s=config.timeout_s,
                    api_key=api_key,
                )
                put_finished_file(store, output, target)
    outcome = record_completion(segment, output)
    return {
        "segment_index": segment.segment_index, "output_key": output, "completion": outcome.value,
        "triggered": trigger_on_write(segment.job_id),
    }


# --------------------------------------------------------------------------- reassembly


def claim_reassembly(job_id: str, owner: str, stale_after_s: float = 900.0) -> state_store.WriteResult:
    """Set ``reassembly_started_at`` on the lock only if unset (or ours, or stale): one worker reassembles."""
    stale = (datetime.now(timezone.utc) - timedelta(seconds=stale_after_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return state_store.transition(
        _locks(), _key(job_id), None, None,
        set={"reassembly_started_at": now(), "reassembly_owner": owner, **prefect_ids()},
        condition=Condition(
            "attribute_not_exists(#started) OR #owner = :owner OR #started < :stale",
            names={"#started": "reassembly_started_at", "#owner": "reassembly_owner"},
            values={":owner": owner, ":stale": stale},
        ),
    )


def reassembly_pending(job_id: str) -> bool:
    """The trigger fired but no reassembly finished (e.g. the worker died): a re-run should reassemble."""
    job = state_store.get_item(_jobs(), _key(job_id))
    lock = state_store.get_item(_locks(), _key(job_id))
    return bool(job and job.get("status") == CHUNKED and lock and "reassembly_completed_at" not in lock)


def _final_is_valid(store: ObjectStore, key: str, frames: int) -> bool:
    if not store.exists(key):
        return False
    with local_path(store, key) as path:
        try:
            return video_ffmpeg.probe(path).frames == frames
        except video_ffmpeg.InvalidMedia:
            return False


def reassemble(job_id: str, owner: str | None = None, stale_after_s: float = 900.0) -> dict[str, Any]:
    """Claim the lock, concat the outputs listed by the completion store, write final.mp4, mark the job completed."""
    job = state_store.get_item(_jobs(), _key(job_id))
    if job is None:
        raise LookupError(f"video job {job_id!r} not found")
    final = keys.final_key(job_id)
    if job["status"] == COMPLETED:
        return {"job_id": job_id, "status": COMPLETED, "final_key": final, "reassembled": False}
    if job["status"] != CHUNKED:
        raise ValueError(f"video job {job_id!r} is {job['status']}: nothing to reassemble")
    owner = owner or prefect_ids().get("prefect_flow_run_id") or uuid.uuid4().hex
    claim = claim_reassembly(job_id, owner, stale_after_s)
    if not claim.applied:
        if claim.item is None:
            raise LookupError(f"video job {job_id!r} has no reassembly lock: the trigger has not fired")
        return {"job_id": job_id, "status": CHUNKED, "reassembled": False, "skipped": "another worker holds the lock"}
    total = int(job["total_segments"])
    records = completions(job_id)
    indices = [r["segment_index"] for r in records]
    if indices != list(range(total)):
        raise RuntimeError(f"video job {job_id!r}: completions {indices} do not cover segments 0..{total - 1}")
    store = object_store()
    expected_frames = int(job.get("source_frames", 0))
    reused = _final_is_valid(store, final, expected_frames)
    if not reused:
        with scratch_dir(store, "video-concat-") as tmp, contextlib.ExitStack() as stack:
            parts = [stack.enter_context(local_path(store, r["output_key"])) for r in records]
            target = tmp / "final.mp4"
            video_ffmpeg.concat(parts, target)
            put_finished_file(store, final, target)
    with local_path(store, final) as path:
        info = video_ffmpeg.probe(path)
    done = state_store.transition(
        _jobs(), _key(job_id), CHUNKED, COMPLETED,
        set={"final_key": final, "completed_at": now(), "final_duration": info.duration, "final_frames": info.frames},
    )
    if not done.applied and (done.item or {}).get("status") != COMPLETED:
        raise RuntimeError(f"video job {job_id!r} left chunking_complete during reassembly ({(done.item or {}).get('status')})")
    state_store.transition(_locks(), _key(job_id), None, None, set={"reassembly_completed_at": now()})
    return {
        "job_id": job_id, "status": COMPLETED, "final_key": final, "reassembled": not reused,
        "duration": info.duration, "frames": info.frames, "segments": total,
    }


# --------------------------------------------------------------------------- removal


def request_delete(job_id: str) -> dict[str, Any]:
    """Soft delete: completed/failed -> deleted. A running job is refused; a deleted one is not found."""
    result = state_store.transition(_jobs(), _key(job_id), DELETABLE, DELETED, set={"deleted_at": now()})
    if result.applied:
        return {"job_id": job_id, "status": DELETED, "message": "Job removed. Cleanup in progress."}
    status = None if result.item is None else result.item.get("status")
    if status in (None, DELETED):
        raise LookupError(f"video job {job_id!r} not found")
    raise ValueError(f"video job {job_id!r} is {status}: only completed or failed jobs can be deleted")


def cleanup_deleted_job(job_id: str) -> dict[str, int]:
    """Remove a deleted job's input, segments, outputs, completion and lock records; the job row stays."""
    job = state_store.get_item(_jobs(), _key(job_id))
    if job is None or job.get("status") != DELETED:
        status = None if job is None else job.get("status")
        raise ValueError(f"video job {job_id!r} is {status}: only deleted jobs are cleaned up")
    store = object_store()
    objects = sum(
        store.delete_prefix(prefix)
        for prefix in (keys.input_prefix(job_id), keys.segments_prefix(job_id), keys.job_output_prefix(job_id))
    )
    records = state_store.batch_delete(
        _completions(), [{"job_id": job_id, "segment_index": r["segment_index"]} for r in completions(job_id)]
    )
    lock = state_store.delete_if(_locks(), _key(job_id)).item is not None
    # the row stays `deleted`; cleaned_up_at tells the scheduled sweep this job needs nothing more
    state_store.transition(_jobs(), _key(job_id), DELETED, None, set={"cleaned_up_at": now()})
    return {"objects": objects, "completion_records": records, "locks": int(lock)}


def deleted_jobs_awaiting_cleanup() -> list[str]:
    """Ids of soft-deleted jobs whose cleanup has not finished (the scheduled sweep's work list)."""
    items = state_store.scan_all(
        _jobs(), keep=lambda item: item.get("status") == DELETED and not item.get("cleaned_up_at")
    )
    return sorted(item["job_id"] for item in items)
