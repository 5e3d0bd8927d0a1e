"""Video pipeline (seed 003): upload -> chunking -> map(inference) -> completion -> trigger -> reassembly -> final.

`video-process` chunks a job's source, runs ``infer_segment`` over every segment (each writes its
SegmentCompletion and runs the trigger-on-write), and starts `video-reassemble` for the one completion
that won the reassembly lock. `video-delete-cleanup` removes what a soft-deleted job left behind.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task, unmapped
from prefect.cache_policies import NO_CACHE

from blocks import VideoInference, load_config
from tasks import keys
from tasks import video as v
from tasks.video_ffmpeg import InvalidMedia
from tasks.notify import notify_on_failure


def _retry_unless_bad_input(task, task_run, state) -> bool:
    """Bad input (not a video, empty, truncated, bad id) is final; anything else is worth a retry."""
    error = state.result(raise_on_failure=False)
    return not isinstance(error, (InvalidMedia, keys.InvalidKey, LookupError, ValueError))


create_job_task = task(v.create_job, name="create-job", cache_policy=NO_CACHE)
import_source_task = task(v.import_source, name="import-source", retries=2, retry_delay_seconds=[2, 10], cache_policy=NO_CACHE)
start_chunking_task = task(v.start_chunking, name="start-chunking", cache_policy=NO_CACHE)
chunk_source_task = task(
    v.chunk_source, name="chunk-source", retries=2, retry_delay_seconds=[2, 10],
    retry_condition_fn=_retry_unless_bad_input, cache_policy=NO_CACHE,
)
infer_segment_task = task(
    v.infer_segment, name="infer-segment", retries=2, retry_delay_seconds=[2, 10],
    retry_condition_fn=_retry_unless_bad_input, cache_policy=NO_CACHE,
)
fail_job_task = task(v.fail_job, name="fail-job", cache_policy=NO_CACHE)
reassemble_task = task(v.reassemble, name="reassemble", retries=2, retry_delay_seconds=[2, 10], cache_policy=NO_CACHE)
cleanup_task = task(v.cleanup_deleted_job, name="cleanup-deleted-job", retries=2, retry_delay_seconds=[2, 10], cache_policy=NO_CACHE)


@flow(name="video-reassemble", log_prints=True, on_failure=[notify_on_failure], on_crashed=[notify_on_failure])
def video_reassemble(job_id: str, stale_after_s: float = 900.0) -> dict[str, Any]:
    """Reassembly worker: claim the lock, concat from the completion store, final.mp4, job completed."""
    result = reassemble_task(keys.safe_id(job_id, "job_id"), stale_after_s=stale_after_s)
    print(f"reassembly of {job_id}: {result}")
    return result


def start_reassembly(job_id: str, deployment: str | None, stale_after_s: float = 900.0) -> dict[str, Any]:
    """Send the job to reassembly: a `video-reassemble` deployment run when named, else the flow in-process."""
    if deployment:
        from prefect.deployments import run_deployment

        parameters = {"job_id": job_id, "stale_after_s": stale_after_s}
        run = run_deployment(deployment, parameters=parameters, timeout=0)
        return {"job_id": job_id, "reassembly_flow_run_id": str(run.id)}
    return video_reassemble(job_id, stale_after_s)


def _fail(job_id: str, reason: str) -> None:
    fail_job_task(job_id, reason)
    get_run_logger().error(f"video job {job_id} failed: {reason}")
    raise v.JobFailed(f"video job {job_id} failed: {reason}")


@flow(name="video-process", log_prints=True, on_failure=[notify_on_failure], on_crashed=[notify_on_failure])
def video_process(
    job_id: str | None = None,
    source_url: str | None = None,
    segment_seconds: float | None = None,
    mode: str | None = None,
    backend: str | None = None,
    segment_retries: int = 2,
    segment_retry_delays: list[float] = [2.0, 10.0],  # noqa: B006 - Prefect parameters are copied per run
    reassembly_deployment: str | None = None,
    reassembly_stale_after_s: float = 900.0,
) -> dict[str, Any]:
    """Chunk the job's source, process every segment, and let the last completion trigger reassembly."""
    config = load_config(VideoInference)
    segment_seconds = segment_seconds or config.segment_seconds
    mode = mode or config.mode
    backend = backend or config.backend
    if source_url is not None:  # "pass a source_url and let the flow create the job"
        job_id = create_job_task(job_id, mode, segment_seconds)["job_id"]
        import_source_task(job_id, source_url)
    if job_id is None:
        raise ValueError("give a job_id (source uploaded to input/{job_id}/source.mp4) or a source_url")
    keys.safe_id(job_id, "job_id")

    job = start_chunking_task(job_id)
    if job["status"] == v.COMPLETED:
        print(f"video job {job_id} is already completed: {job.get('final_key')}")
        return job
    try:
        segment_keys = chunk_source_task(job_id, segment_seconds, mode)
    except Exception as error:  # bad input or ffmpeg failure after retries
        _fail(job_id, f"chunking failed: {error}")
    print(f"video job {job_id}: {len(segment_keys)} segments of {segment_seconds:g} s, mode {mode}, backend {backend}")

    infer = infer_segment_task.with_options(retries=segment_retries, retry_delay_seconds=segment_retry_delays)
    futures = infer.map(segment_keys, backend=unmapped(backend), mode=unmapped(mode))
    results, errors = [], []
    for segment_key, future in zip(segment_keys, futures):
        try:
            results.append(future.result())
        except Exception as error:
            errors.append(f"{segment_key.rsplit('/', 1)[1]}: {error}")
    if errors:
        _fail(job_id, f"{len(errors)} of {len(segment_keys)} segments failed after retries; first: {errors[0]}")

    if any(r["triggered"] for r in results) or v.reassembly_pending(job_id):
        start_reassembly(job_id, reassembly_deployment, reassembly_stale_after_s)
    return v.get_job(job_id)


@flow(name="video-delete-cleanup", log_prints=True, on_failure=[notify_on_failure], on_crashed=[notify_on_failure])
def video_delete_cleanup(job_id: str | None = None) -> dict[str, dict[str, int]]:
    """Asynchronous cleanup after a soft delete: objects, completion records and the lock; the job row stays.

    With no ``job_id`` (the scheduled run) it sweeps every deleted job whose cleanup has not finished.
    """
    job_ids = [keys.safe_id(job_id, "job_id")] if job_id else v.deleted_jobs_awaiting_cleanup()
    removed = {}
    for one in job_ids:
        removed[one] = cleanup_task(one)
        print(f"video job {one} cleaned up: {removed[one]}")
    return removed
