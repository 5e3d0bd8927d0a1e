"""Video pipeline (seed 003): upload -> chunking -> map(inference) -> completion -> trigger -> reassembly -> final.

`video-process` chunks a job's source, runs ``infer_segment`` over every segment (each writes its
SegmentCompletion and runs the trigger-on-write), and reassembles in its own process when one of its completions
won the reassembly lock (no second flow-run process on the user's path); a reassembly still pending from a trigger
it did not win (an earlier run that died) goes to `video-reassemble`, which claims the lock the same way, so one
of them writes final.mp4. `video-delete-cleanup` removes what a soft-deleted job left behind.
"""

from __future__ import annotations

import os
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed

from blocks import VideoInference, load_config
from flows.policies import TRANSIENT_RETRIES, pipeline_flow
from tasks.core import limits
from tasks.core.disk import is_disk_full
from tasks.core.errors import RefusedInput
from tasks.landing.listener import listen_report, open_source
from tasks.video import inference as video_inference
from tasks.video import jobs as v
from tasks.video import keys as video_keys
from tasks.video import landing as video_landing
from tasks.video.keys import JobId

# RefusedInput: bad media, a bad id, ffmpeg's or the backend's refusal of the input
FINAL_ERRORS = (RefusedInput, LookupError, ValueError, v.JobFailed)


def _retry_unless_bad_input(task, task_run, state) -> bool:
    """Bad input (not a video, empty, truncated, bad id) and ffmpeg's refusals are final; a full disk is not retried
    (minutes rarely free it: the job waits for space, for `video-sweep-stuck`); all else is worth a retry."""
    error = state.result(raise_on_failure=False)
    return not isinstance(error, FINAL_ERRORS) and not is_disk_full(error)


# bookkeeping steps run once (their writes are guarded); work steps retry transient faults, not bad input
RETRIED = {**TRANSIENT_RETRIES, "cache_policy": NO_CACHE}
WORK_RETRIED = {**RETRIED, "retry_condition_fn": _retry_unless_bad_input}
# ffmpeg work: bounded per worker machine (its CPU slots) and per call (the seed's 15-minute Lambda ceiling)
CPU_HEAVY = {"timeout_seconds": limits.SEGMENT_TIMEOUT_S}

create_job_task = task(v.create_job, name="create-job", cache_policy=NO_CACHE)
import_source_task = task(v.import_source, name="import-source", **RETRIED)
# one task run opens the job: a new job's check for a failed attempt is one read inside it, not a run of its own
open_job_task = task(v.open_job, name="open-job", **WORK_RETRIED)
chunk_source_task = task(limits.holding_cpu_slot(v.chunk_source), name="chunk-source", **CPU_HEAVY, **WORK_RETRIED)


def infer_segment_here_or_remote(
    segment_key: str, backend: str | None = None, mode: str | None = None
) -> dict[str, Any]:
    """``infer_segment`` holding one of this machine's CPU slots, except for a remote backend (it only waits)."""
    backend = backend or load_config(VideoInference).backend
    if backend in video_inference.REMOTE_BACKENDS:
        return v.infer_segment(segment_key, backend, mode)
    return limits.holding_cpu_slot(v.infer_segment)(segment_key, backend, mode)


infer_segment_task = task(infer_segment_here_or_remote, name="infer-segment", **CPU_HEAVY, **WORK_RETRIED)
fail_job_task = task(v.fail_job, name="fail-job", cache_policy=NO_CACHE)
wait_for_space_task = task(v.wait_for_space, name="wait-for-space", **RETRIED)
reassemble_task = task(limits.holding_cpu_slot(v.reassemble), name="reassemble", **CPU_HEAVY, **WORK_RETRIED)
recover_stuck_task = task(v.recover_stuck_job, name="recover-stuck-job", **WORK_RETRIED)
cleanup_task = task(v.cleanup_deleted_job, name="cleanup-deleted-job", **RETRIED)


@pipeline_flow("video-reassemble")
def video_reassemble(job_id: str, stale_after_s: float = 900.0) -> dict[str, Any]:
    """Reassembly worker: claim the lock, concat from the completion store, final.mp4, job completed."""
    return _reassemble(video_keys.parse_job_id(job_id), stale_after_s)


def _reassemble(job_id: JobId, stale_after_s: float) -> dict[str, Any]:
    """The reassemble task in this flow run (it claims the lock first); a failure after retries fails the job."""
    try:
        result = reassemble_task(job_id, stale_after_s=stale_after_s)
    except v.JobFailed:
        raise
    except Exception as error:  # noqa: BLE001 - after retries, any failure: the job must not stay chunking_complete
        if is_disk_full(error):
            return _wait(job_id, "reassembly", error)
        _fail(job_id, f"reassembly failed: {error}")
    print(f"reassembly of {job_id}: {result}")
    return result


def start_reassembly(job_id: JobId, deployment: str | None, stale_after_s: float = 900.0) -> dict[str, Any]:
    """Send the job to reassembly: a `video-reassemble` deployment run when named, else the flow in-process."""
    if deployment:
        from prefect.deployments import run_deployment

        parameters = {"job_id": job_id, "stale_after_s": stale_after_s}
        run = run_deployment(deployment, parameters=parameters, timeout=0)
        v.note_reassembly_run(job_id, str(run.id))
        return {"job_id": job_id, "reassembly_flow_run_id": str(run.id)}
    return video_reassemble(job_id, stale_after_s)


def _bounded_submit(task_, items: list[str], limit: int, **kwargs: Any) -> list:
    """Submit ``task_`` for every item, at most ``limit`` running at once (a sliding window); futures in item order."""
    futures, running = [], []
    for item in items:
        while len(running) >= limit:
            running.remove(next(as_completed(running)))
        future = task_.submit(item, **kwargs)
        futures.append(future)
        running.append(future)
    return futures


def _fail(job_id: JobId, reason: str) -> None:
    reason = v.public_reason(reason)  # object keys, no secrets: the same text in the record, the log and alerts
    fail_job_task(job_id, reason)
    get_run_logger().error(f"video job {job_id} failed: {reason}")
    raise v.JobFailed(f"video job {job_id} failed: {reason}")


def _wait(job_id: JobId, step: str, error: BaseException) -> dict[str, Any]:
    """The job met a full disk in ``step``: it waits for space (not failed); the job record, for the run's result."""
    wait_for_space_task(job_id, f"{step} met a full disk: {error}")
    job = v.get_job(job_id)
    get_run_logger().warning(
        f"video job {job_id} waits for space ({job.get(v.WAITING_FOR_SPACE)}); "
        "video-sweep-stuck takes it again once the disk has room"
    )
    return job


@pipeline_flow("video-process")
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
    max_parallel_segments: int = 0,
) -> dict[str, Any]:
    """Chunk the job's source, process every segment, and let the last completion trigger reassembly.

    ``mode`` and ``segment_seconds``: this run's, else those the job was created with, else the block's.
    ``max_parallel_segments`` segments are processed at once (0: one per CPU core; raise it for the remote backends,
    http and sagemaker, which hold no CPU slot while they wait).
    The run whose completion wins the trigger reassembles itself; ``reassembly_deployment`` (none: a subflow here)
    takes a reassembly left pending by a run that died.
    """
    config = load_config(VideoInference)
    backend = backend or config.backend
    if source_url is not None:  # "pass a source_url and let the flow create the job"
        v.check_source_allowed(source_url)  # refused before any job exists
        job_id = create_job_task(job_id, mode, segment_seconds)["job_id"]
        try:
            import_source_task(job_id, source_url)
        except Exception as error:  # noqa: BLE001 - any failure of the import fails the job it created
            _fail(job_id, f"import of the source failed: {error}")
    if job_id is None:
        raise ValueError("give a job_id (source uploaded to input/{job_id}/source.mp4) or a source_url")
    job_id = video_keys.parse_job_id(job_id)  # the one check: every step below gets the JobId

    job = open_job_task(job_id)  # a failed job is reopened first (the documented re-run): old attempt cleared
    if job.pop("reopened"):
        print(f"video job {job_id} was failed: cleared and re-run")
    if job["status"] == v.COMPLETED:
        print(f"video job {job_id} is already completed: {job.get('final_key')}")
        return job
    segment_seconds = float(segment_seconds or job.get("segment_seconds") or config.segment_seconds)
    mode = mode or job.get("mode") or config.mode
    try:
        segment_keys = chunk_source_task(job_id, segment_seconds, mode)
    except Exception as error:  # noqa: BLE001 - bad input, ffmpeg or storage failure after retries: the job fails
        if is_disk_full(error):
            return _wait(job_id, "chunking", error)
        _fail(job_id, f"chunking failed: {error}")
    print(f"video job {job_id}: {len(segment_keys)} segments of {segment_seconds:g} s, mode {mode}, backend {backend}")

    infer = infer_segment_task.with_options(retries=segment_retries, retry_delay_seconds=segment_retry_delays)
    futures = _bounded_submit(
        infer, segment_keys, max_parallel_segments or os.cpu_count() or 1, backend=backend, mode=mode
    )
    results, errors = [], []
    for segment_key, future in zip(segment_keys, futures):
        try:
            results.append(future.result())
        except Exception as error:  # noqa: BLE001 - a segment's task may raise anything; every failure is reported
            errors.append((segment_key.rsplit("/", 1)[1], error))
    if errors and all(is_disk_full(error) for _, error in errors):  # the done segments stay done: taken again later
        return _wait(job_id, f"{len(errors)} of {len(segment_keys)} segments", errors[0][1])
    if errors:
        first = f"{errors[0][0]}: {errors[0][1]}"
        _fail(job_id, f"{len(errors)} of {len(segment_keys)} segments failed after retries; first: {first}")

    if any(r["triggered"] for r in results):  # this run wrote the last completion and created the lock
        _reassemble(job_id, reassembly_stale_after_s)  # here, in this process: no second run to wait for
    elif v.reassembly_pending(job_id):  # triggered by a run that is gone (a re-run or re-drive finds it)
        start_reassembly(job_id, reassembly_deployment, reassembly_stale_after_s)
    return v.get_job(job_id)


@pipeline_flow("video-sweep-stuck")
def video_sweep_stuck(stuck_minutes: float = 30.0) -> dict[str, dict[str, Any]]:
    """Jobs `chunking_complete` for longer than ``stuck_minutes`` whose Prefect runs all ended: reassemble,
    re-drive (a new run of the dead run's deployment, at most ``MAX_REDRIVES`` times) or fail with the reason.

    Jobs waiting for space are taken the same way once the store's disk has room (their re-drive not counted);
    while it has none they are left waiting, all named in one log line.

    A job whose process or reassembly run is still scheduled, pending or running is left alone. The same
    recovery runs at once when a run that held a job crashes (`records-prefect-state`); this sweep is the backstop.
    """
    from tasks.reconcile import TERMINAL, prefect_states

    candidates = v.stuck_candidates(stuck_minutes * 60)
    states = prefect_states([r for c in candidates for r in c["flow_run_ids"]], [])
    swept: dict[str, dict[str, Any]] = {}
    still_full: dict[str, str] = {}  # job -> its disk, for one line: no run, no task run per waiting job
    for candidate in candidates:
        alive = [r for r in candidate["flow_run_ids"] if r in states and states[r].type not in TERMINAL]
        if alive:
            print(f"video job {candidate['job_id']}: still held by run(s) {alive}, left alone")
            continue
        short = v.short_of_space(candidate["job_id"]) if candidate["waiting_for_space"] else None
        if short is not None:
            still_full[candidate["job_id"]] = short.describe()
            continue
        swept[candidate["job_id"]] = recover_stuck_task(candidate["job_id"])
        print(f"video job {candidate['job_id']}: {swept[candidate['job_id']]}")
    if still_full:
        disk_line = next(iter(still_full.values()))
        print(f"{len(still_full)} video job(s) wait for space, left waiting: {sorted(still_full)} ({disk_line})")
    return swept


@pipeline_flow("video-delete-cleanup")
def video_delete_cleanup(job_id: str | None = None) -> dict[str, dict[str, int]]:
    """Asynchronous cleanup after a soft delete: objects, completion records and the lock; the job row stays.

    With no ``job_id`` (the scheduled run) it sweeps every deleted job whose cleanup has not finished.
    """
    job_ids = [video_keys.parse_job_id(job_id)] if job_id else v.deleted_jobs_awaiting_cleanup()
    removed = {}
    for one in job_ids:
        removed[one] = cleanup_task(one)
        print(f"video job {one} cleaned up: {removed[one]}")
    return removed


@pipeline_flow("video-listen")
def video_listen(
    source: str = "local",
    max_runtime_seconds: float = 0,
    batch_size: int = 10,
    batch_seconds: float = 0.0,
    wait_seconds: float = 20.0,
    process_deployment: str = video_landing.PROCESS_DEPLOYMENT,
) -> dict[str, int]:
    """Seed 003's upload event: an object at ``input/{job_id}/source.mp4`` starts one `video-process` run for the job.

    ``source``: "local" watches the object store's ``input/`` folder, "sqs" reads its S3 notifications.
    Every upload starts its own run, so a batch saves nothing: ``batch_seconds`` 0 hands each receive's arrivals
    over at once (the user waits for their video, not for a batch to fill).
    Runs for ``max_runtime_seconds`` (0: until cancelled); the deployment restarts it.
    """

    def events():
        return open_source(source, video_landing.PIPELINE, None, video_keys.VIDEO_INPUT_PREFIX, [".mp4"])

    return listen_report(
        "video-listen",
        events,
        lambda batch: video_landing.handle_uploads(batch, process_deployment),
        batch_size=batch_size,
        batch_seconds=batch_seconds,
        max_runtime_seconds=max_runtime_seconds,
        wait_seconds=wait_seconds,
    )
