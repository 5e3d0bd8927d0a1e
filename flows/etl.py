"""NDJSON→Parquet ETL (seed 001) as Prefect flows.

files ──> ndjson-ingest: validate ─┬─> quarantine (copy + reason, tracked quarantined#N)
                                   └─> manifest JSON ─> track + claim + MANIFEST# (pending) in one transaction
                                        (rest: pending#N, claimed in batches: pending#N → manifested#N + MANIFEST#)
                                        ─> manifest.ready (one per batch; none while a merge run is queued)
ndjson-merge: its manifest, then further pending ones (oldest first, each taken by its own conditional write;
              the drain: tasks/etl/drain.py):
              MANIFEST pending → processing ─> files still in it ─> Dask merge to staged Snappy Parquet (rejects)
              ─> publish (rename parts, publish record; a published manifest is skipped) ─> date's partition
                 in the catalog (Glue too on S3)
              ─> MANIFEST completed | failed + metric row (only while processing under this run) ─> (failed:
                 output removed) ─> files manifested#N → completed#N | failed#N (per 100 items) ─> (notify)
                 ─> report (logs/glue/…; ingest's in logs/lambda/…)
ndjson-listen (long-running): files landing under pipeline/input/{date}/ (watch or SQS) ─> micro-batches
              (count, age) ─> the ingest's validate → quarantine | track + claim-first batching ─> merges;
              one Prefect event per file
ndjson-flush-orphans (scheduled): dead claims released ─> pending#N of earlier dates ─> partial manifests
              ─> pending manifests restarted ─> dates whose catalog registration failed registered again
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Literal

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from flows.policies import TRANSIENT_RETRIES, pipeline_flow, retry_policy
from tasks.core import limits
from tasks.core.disk import is_disk_full
from tasks.core.notify import notify_on_failure
from tasks.core.object_store import ObjectNotFound
from tasks.core.runtime import own_deployment, today_iso, utc_now
from tasks.etl import breaker as etl_breaker
from tasks.etl import catalog as etl_catalog
from tasks.etl import drain
from tasks.etl import ingest as etl
from tasks.etl import landing as etl_landing
from tasks.etl import merge as etl_merge
from tasks.etl import ops as etl_ops
from tasks.etl import reports as etl_reports
from tasks.etl.ingest import ManifestRef
from tasks.etl.keys import INPUT_PREFIX
from tasks.landing.listener import listen, open_source

# --------------------------------------------------------------------------- tasks


def _capacity_error(task_, task_run, state) -> bool:
    """Retry only what more time can fix (memory, I/O, timeouts, a busy cluster), like the seed's Glue retries; a
    full disk is not retried here (minutes rarely free it): its manifest waits, pending, for the flush."""
    try:
        state.result()
    except ObjectNotFound:
        return False
    except OSError as error:
        return not is_disk_full(error)
    except MemoryError:
        return True
    except Exception:  # noqa: BLE001 - bad data or a bug: retrying would fail the same way
        return False
    return False


_side_effects = dict(cache_policy=NO_CACHE)
_dynamo = dict(**TRANSIENT_RETRIES, **_side_effects)  # DynamoDB and object-store calls: throttles clear in seconds

list_landing_task = task(etl.landing_objects, name="list-landing", **_dynamo)
validate_task = task(etl.validate_files, name="validate-files", **_side_effects)
quarantine_task = task(etl.quarantine_files, name="quarantine-files", **_dynamo)
track_task = task(
    etl.track_and_batch,
    name="track-and-batch-files",
    timeout_seconds=limits.task_timeouts()["track-and-batch-files"],
    **_dynamo,
)
create_manifests_task = task(
    etl.create_manifests,
    name="claim-and-create-manifests",
    timeout_seconds=limits.task_timeouts()["claim-and-create-manifests"],
    **_dynamo,
)
orphan_dates_task = task(etl.orphan_dates, name="find-orphaned-dates", **_dynamo)
retry_catalog_task = task(etl_catalog.retry_unregistered, name="retry-catalog-registrations", **_dynamo)
release_dead_claims_task = task(etl_ops.release_dead_claims, name="release-dead-claims", **_dynamo)
pending_manifests_task = task(etl.pending_manifests, name="find-pending-manifests", **_dynamo)
metric_task = task(etl.record_metric, name="record-metric", **_dynamo)
report_task = task(etl_reports.write_run_report, name="write-run-report", **_side_effects)
# the take (MANIFEST pending → processing) is a plain call, not a task run: its manifest's `dask-merge` task run,
# named after it, follows at once; it keeps the transient retries it had as a task run of its own
TAKE_RETRY_DELAYS_S = tuple(TRANSIENT_RETRIES["retry_delay_seconds"])
# the drain's first read of pending manifests, and its hand-on's, are task runs (seen in the UI)
_drain_with_tasks = partial(drain.Drain, scan=pending_manifests_task, take_retry_delays_s=TAKE_RETRY_DELAYS_S)
# seed 001's Step Functions retries: the Glue job 3 times, 60 s then ×2; the batch status updater twice, 5 s then ×2
MERGE_RETRY_DELAYS_S = [60, 120, 240]
STATUS_UPDATE_RETRY_DELAYS_S = [5, 10]
merge_task = task(  # reads the manifest and the files still in it first: one task run, not three
    etl_merge.merge_listed,
    name="dask-merge",
    task_run_name="dask-merge {manifest_name}",
    **retry_policy(*MERGE_RETRY_DELAYS_S),
    retry_condition_fn=_capacity_error,
    **_side_effects,
)
finish_task = task(
    etl_merge.finish_manifest,
    name="batch-status-update",
    task_run_name="batch-status-update {manifest_name}",
    timeout_seconds=limits.task_timeouts()["batch-status-update"],
    **retry_policy(*STATUS_UPDATE_RETRY_DELAYS_S),
    **_side_effects,
)
wait_for_space_task = task(etl_merge.wait_for_space, name="wait-for-space", **_dynamo)
notify_task = task(etl_merge.notify_failure, name="notify-failure", **_side_effects)
handle_landed_task = task(etl_landing.handle_landed, name="track-landed-files", **_side_effects)  # the pump retries


def _merge_inline(ref: ManifestRef) -> str:
    """Run the merge of ``ref`` as a subflow (raising as it does); the id of its flow run."""
    state = ndjson_merge(date_prefix=ref.date_prefix, manifest_name=ref.manifest_name, return_state=True)
    state.result()
    return str(state.state_details.flow_run_id)


def _launch(manifests: list[ManifestRef], merge_deployment: str | None) -> list[dict[str, Any]]:
    """Start each manifest's merge: the deployment (no waiting), or inline as a subflow when None."""
    if merge_deployment is None:
        launcher = _merge_inline
    else:
        launcher = etl.deployment_launcher(merge_deployment)
    return etl.launch_merges(manifests, launcher)


def _with_restarts(made: list[ManifestRef], restart_after_seconds: float) -> list[ManifestRef]:
    """The new manifests plus any left ``pending`` by a launch that failed (no manifest is ever orphaned)."""
    names = {ref.manifest_name for ref in made}
    stale = pending_manifests_task(older_than_seconds=restart_after_seconds)
    return made + [ref for ref in stale if ref.manifest_name not in names]


def _fail_timed_out_merge(flow, flow_run, state) -> None:
    """A merge past its timeout (Prefect: Failed/TimedOut): the MANIFESTs it still holds (``processing`` under its
    id) and their files are failed with the same words; one another run took is left to that run."""
    if state.name != "TimedOut":
        return  # any other failure was recorded by the flow itself
    params, holder = flow_run.parameters, str(flow_run.id)
    names = {params["manifest_name"]: params["date_prefix"]} | etl_merge.processing_under(holder)
    for manifest_name, date_prefix in names.items():  # the run's own manifest and those it took after it
        etl_merge.finish_manifest(date_prefix, manifest_name, None, error=state.message, holder=holder)
    notify_on_failure(flow, flow_run, state)


def _finish_best_effort(
    date_prefix: str,
    manifest_name: str,
    summary: dict[str, Any],
    manifest_path: str,
    metric: dict[str, Any],
    notify_block: str | None,
    holder: str | None,
) -> dict[str, Any]:
    """The status update after a published merge, best-effort as in the seed: its failure (after its retries) is
    logged and notified but does not fail the merge; the MANIFEST stays ``processing`` under this ended run, and
    ``records-reconcile`` completes it and its files from the published output."""
    try:  # the merge's figures quoted: Prefect would walk every file's record twice looking for futures in them
        return finish_task(
            date_prefix,
            manifest_name,
            quote(summary),
            manifest_path=manifest_path,
            listed=quote(summary["listed"]),
            metric=quote(metric),
            holder=holder,
            records=quote(summary.get("records")),
        )
    except Exception as error:  # noqa: BLE001 - the output is published; the reconciler writes the statuses
        message = (
            f"{manifest_name} ({date_prefix}): merged and published, but the status update failed "
            f"({type(error).__name__}: {error}); records-reconcile completes the manifest and its files"
        )
        get_run_logger().error(message)
        notify_task(message, notify_block, subject="STATUS UPDATE FAILED (ndjson-merge)")
        return {
            "manifest_status": etl_merge.PROCESSING,
            "files_completed": 0,
            "files_failed": 0,
            "status_update_error": message,
        }


# --------------------------------------------------------------------------- flows


@pipeline_flow("ndjson-ingest")
def ndjson_ingest(
    file_urls: list[str] | None = None,
    landing_url: str | None = None,
    merge_deployment: str | None = "ndjson-merge/local",
    restart_pending_after_seconds: float = 120.0,
    file_sizes: list[int | None] | None = None,
) -> dict[str, Any]:
    """Validate and track a batch of file events (or a landing prefix), batch full dates, start their merges.
    ``file_sizes`` (one per URL, from the events) and a landing listing's sizes spare a HEAD per file."""
    logger = get_run_logger()
    config = etl.settings()
    started = utc_now()
    if not file_urls:
        landing = landing_url or etl.store(config.input_store_url).url_for(INPUT_PREFIX)
        listed = list_landing_task(landing)
        file_urls, file_sizes = [o.url for o in listed], [o.size for o in listed]
    checks = validate_task(file_urls, config, file_sizes)
    refused = [c for c in checks if not c.valid]
    for check in refused:
        logger.warning("quarantined %s: %s", check.url, check.reason)
    quarantined = quarantine_task(refused, config) if refused else []
    tracked = track_task([c for c in checks if c.valid], config)
    made: list[ManifestRef] = list(tracked["manifests"])
    for date_prefix in tracked["dates"]:
        made += create_manifests_task(
            date_prefix, config.max_files_per_manifest, config, prefer=tracked["new_files"].get(date_prefix, [])
        )
    launches = _launch(_with_restarts(made, restart_pending_after_seconds), merge_deployment)
    summary = {
        "files": len(checks),
        "quarantined": len(quarantined),
        "tracked": tracked["tracked"],
        "already_tracked": tracked["already_tracked"],
        "revalidated": len(tracked["revalidated"]),
        "manifests": [ref.manifest_name for ref in made],
        "launched": sum(1 for launch in launches if launch["launched"]),
        "launch_failures": sum(1 for launch in launches if not launch["launched"] and not launch.get("held")),
        "held": sum(1 for launch in launches if launch.get("held")),
    }
    metric_task(
        "ingest", {k: v for k, v in summary.items() if k != "manifests"} | {"manifests_created": len(made)}, config
    )
    report_task(
        "lambda",
        started,
        {
            "status": "succeeded",
            **summary,
            "manifests": [ref.manifest_path for ref in made],
            "quarantined_files": [{"url": c.url, "reason": c.reason} for c in refused],
        },
        config,
    )
    print(
        f"ingest: {summary['files']} files, {summary['tracked']} tracked, {summary['quarantined']} quarantined, "
        f"{len(made)} manifests, {summary['launched']} merges started"
    )
    return summary


# a failed run has already sent its own, more detailed alert; a timed-out one is finished by its hook
@pipeline_flow("ndjson-merge", alert="crashed", on_failure=[_fail_timed_out_merge])
def ndjson_merge(
    date_prefix: str,
    manifest_name: str,
    target_file_mb: float | None = None,
    dask_scheduler: str = "threads",
    rerun: bool = False,
    more_manifests: int = 0,
    more_seconds: float = 120.0,
    parallel_manifests: int = 1,
    stay_for_more: bool = False,
) -> dict[str, Any]:
    """One manifest, then up to ``more_manifests`` further ``pending`` ones (oldest first, for ``more_seconds`` at most;
    each taken by the conditional ``pending → processing``, so no two runs merge one), ``parallel_manifests`` merges at
    a time. ``stay_for_more``: with none pending, the run looks again every ``STAY_POLL_S`` until ``more_seconds`` have
    passed (the launcher leaves new manifests to it, ``etl.taking_merge_run``), so a steady feed costs a run every
    ``more_seconds`` rather than one a batch. Each: MANIFEST processing → Dask/pyarrow merge (its own retries) →
    MANIFEST and file statuses with its metric row (notify on failure) → its run report. A failed manifest ends the
    taking: the merges in flight finish, then the run fails (one failed run per failing manifest at
    ``parallel_manifests`` 1, as the breaker counts). A run stopped by its bound or a failure with manifests still
    pending announces one (``etl.deployment_launcher``): the next run takes them.

    Returns the first manifest's outcome (``skipped`` when another run had it) with ``merged``: every manifest's."""
    config = etl.settings()
    deployment = etl_breaker.current_merge_deployment() if more_manifests > 0 else None
    if not etl_breaker.admitted_here(date_prefix, manifest_name):  # the deployment's circuit breaker is open
        return {"manifest": manifest_name, "skipped": True, "held": True, "merged": []}
    manifests = _drain_with_tasks(more_manifests, more_seconds, deployment, parallel_manifests, stay_for_more)
    own = manifests.take(date_prefix, manifest_name, rerun)  # MANIFEST pending → processing
    if own is None:
        print(f"{manifest_name}: already taken by another run")
    merge = partial(_merge, config=config, target_file_mb=target_file_mb, dask_scheduler=dask_scheduler)
    for taken, merging in manifests.merges(own, merge):  # its own manifest, then the further ones it takes
        manifests.record(_update_status(taken, merging, config))  # MANIFEST and file statuses, metric row, report
    manifests.hand_on()  # manifests still pending after a bound or a failure: the next run takes them
    if len(manifests.outcomes) > 1:
        _merge_summary_artifact(manifests.outcomes)
    return manifests.result(own, manifest_name)


def _merge(
    taken: drain.Taken, here: bool, *, config: Any, target_file_mb: float | None, dask_scheduler: str
) -> drain.Merging:
    """The manifest's merge (its own retries; task runs are named after their manifest): in this thread when
    ``here``, else a task future."""
    args = (
        taken.date_prefix,
        taken.manifest_name,
        taken.manifest_path,
        config.output_store_url,
        target_file_mb or config.target_file_mb,
        dask_scheduler,
    )
    return drain.MergedHere(lambda: merge_task(*args)) if here else merge_task.submit(*args)


def _update_status(taken: drain.Taken, merged: drain.Merging, config: Any) -> dict[str, Any]:
    """After one manifest's merge: its MANIFEST and file statuses, metric row and run report (failed: with the
    reason, notified). Returns its outcome; never raises for the merge's own failure (its neighbours go on)."""
    date_prefix, manifest_name, manifest_path = taken.date_prefix, taken.manifest_name, taken.manifest_path
    try:
        summary = merged.result()
    except Exception as error:  # recorded on the manifest (or re-driven); the run fails after its neighbours
        message = f"{manifest_name} ({date_prefix}): {type(error).__name__}: {error}"
        if is_disk_full(error) and wait_for_space_task(date_prefix, manifest_name, message, holder=taken.holder):
            get_run_logger().warning("%s: disk full; back to pending until space is freed (nothing published)", message)
            return {"manifest": manifest_name, "date_prefix": date_prefix, "manifest_status": etl_merge.PENDING}
        # the orchestrator or a store went away under the run (an upgrade's swap rotates the API's auth string), not
        # the input: the manifest goes back to pending for the next run, and this run ends with the error
        if _service_lost(error) and taken.holder:
            if etl_merge.redrive_manifest(date_prefix, manifest_name, taken.holder, message) is not None:
                raise
        finish_task(date_prefix, manifest_name, None, error=message, manifest_path=manifest_path, holder=taken.holder)
        notify_task(message, config.notify_block)
        etl_reports.write_run_report(
            "glue",
            taken.started,
            {
                "status": "failed",
                "manifest": manifest_name,
                "manifest_path": manifest_path,
                "date_prefix": date_prefix,
                "error": message,
            },
            config,
            taken.report_part,
        )
        return {
            "manifest": manifest_name,
            "date_prefix": date_prefix,
            "manifest_status": etl_merge.FAILED,
            "error": message,
        }
    metric = {
        "manifest": manifest_name,
        "date_prefix": date_prefix,
        "rows": summary["rows"],
        "rejected_lines": summary["rejected_lines"],
        "files_failed": summary["files_failed"],
        "files": len(summary["files"]),
        "input_mb": round(summary.get("input_bytes", 0) / 2**20, 3),
        "seconds": round(time.monotonic() - taken.merge_started, 3),
        "skipped": summary["already_published"],
    }
    statuses = _finish_best_effort(
        date_prefix, manifest_name, summary, manifest_path, metric, config.notify_block, taken.holder
    )
    if summary["files_failed"]:
        get_run_logger().warning(
            "%s: %d file(s) failed: %s",
            manifest_name,
            summary["files_failed"],
            [f"{f['url']}: {f['error']}" for f in summary["files"] if f["error"]],
        )
    etl_reports.write_run_report(
        "glue",
        taken.started,
        {
            "status": statuses["manifest_status"],
            "manifest": manifest_name,
            "manifest_path": manifest_path,
            "date_prefix": date_prefix,
            "rows": summary["rows"],
            "rejected_lines": summary["rejected_lines"],
            "files": len(summary["files"]),
            "files_failed": summary["files_failed"],
            "parts": summary["parts"],
            "rejects_path": summary["rejects_path"],
            "already_published": summary["already_published"],
            "partition": summary.get("partition"),
            "file_errors": [{"url": f["url"], "error": f["error"]} for f in summary["files"] if f["error"]],
        },
        config,
        taken.report_part,
    )
    print(
        f"{manifest_name}: {summary['rows']} rows in {len(summary['parts'])} part(s)"
        f"{' (published before: merge skipped)' if summary['already_published'] else ''}, "
        f"{summary['rejected_lines']} rejected lines, {statuses['files_completed']} files completed"
    )
    kept = {k: v for k, v in summary.items() if k != "records"}  # finish_manifest's, not the run's outcome
    return {"manifest": manifest_name, "date_prefix": date_prefix, **kept, **statuses}


def _service_lost(error: BaseException) -> bool:
    """Whether an error is a service the run needs going away (the Prefect API refusing a rotated auth string or not
    answering, a connection to a store lost), rather than the merge's own failure."""
    import httpx
    from botocore.exceptions import ConnectionError as StoreConnectionLost

    if isinstance(error, (httpx.TransportError, StoreConnectionLost)):
        return True
    return isinstance(error, httpx.HTTPStatusError) and error.response.status_code in (401, 403, 502, 503, 504)


def _merge_summary_artifact(outcomes: list[dict[str, Any]]) -> None:
    """The run's manifests in the UI: one table row each (status, rows, files, error)."""
    from prefect.artifacts import create_table_artifact

    create_table_artifact(
        table=[
            {
                "manifest": o["manifest"],
                "date": o["date_prefix"],
                "status": o["manifest_status"],
                "rows": o.get("rows", ""),
                "files": len(o.get("files", [])),
                "error": o.get("error", ""),
            }
            for o in outcomes
        ],
        description=f"ndjson-merge: {len(outcomes)} manifest(s) merged by this run",
    )


@pipeline_flow("ndjson-flush-orphans")
def ndjson_flush_orphans(
    today: str | None = None,
    merge_deployment: str | None = "ndjson-merge/local",
    restart_pending_after_seconds: float = 120.0,
    release_claims_after_seconds: float = 600.0,
) -> dict[str, Any]:
    """Release dead claims; partial manifests for pending files of earlier dates (every shard); restart manifests
    left pending; register again the dates whose catalog registration failed."""
    config = etl.settings()
    today = today or today_iso()
    released = release_dead_claims_task(release_claims_after_seconds)
    dates = orphan_dates_task(config, today)
    made: list[ManifestRef] = []
    for date_prefix in dates:
        made += create_manifests_task(date_prefix, config.min_files_for_partial_batch, config, partial=True)
    launches = _launch(_with_restarts(made, restart_pending_after_seconds), merge_deployment)
    catalog = retry_catalog_task()
    summary = {
        "catalog_registered": catalog["registered"],
        "catalog_still_failing": catalog["still_failing"],
        "released_claims": released["moved"],
        "orphaned_dates": dates,
        "manifests": [ref.manifest_name for ref in made],
        "launched": sum(1 for launch in launches if launch["launched"]),
        "launch_failures": sum(1 for launch in launches if not launch["launched"] and not launch.get("held")),
        "held": sum(1 for launch in launches if launch.get("held")),
    }
    metric_task(
        "flush",
        {"orphaned_files": sum(dates.values()), "manifests_created": len(made), "launched": summary["launched"]},
        config,
    )
    print(f"flush: {sum(dates.values())} orphaned files on {len(dates)} date(s) → {len(made)} partial manifests")
    return summary


@pipeline_flow("ndjson-merge-breaker", alert="crashed", timeout_seconds=limits.MAINTENANCE_TIMEOUT_S)
def ndjson_merge_breaker(
    merge_deployment: str = "ndjson-merge/local",
    action: Literal["trip", "check"] = "check",
    cool_down_seconds: float = etl_breaker.COOL_DOWN_S,
    reason: str = "",
    announce_after_seconds: float = etl_breaker.ANNOUNCE_AFTER_S,
    check_at: str | None = None,
) -> dict[str, Any]:
    """The merge deployment's circuit breaker (seed 001): ``trip`` when its failure trigger fires (OPEN: deployment
    paused, manifests wait pending); ``check`` when the step before scheduled it (``check_at``: the cool-down's end,
    HALF_OPEN trial, CLOSED on its success: resumed, waiting manifests started), when a trial ends, when a merge run
    ends Cancelled or Crashed, and on the backstop schedule. Every check makes the deployment's pause follow the
    state; a CLOSED one announces the manifests pending over ``announce_after_seconds`` that no queued run will take;
    an OPEN or HALF_OPEN one schedules the next check it needs on this run's deployment."""
    result = etl_breaker.step(
        merge_deployment,
        action,
        cool_down_seconds,
        reason,
        announce_after_seconds,
        check_deployment=own_deployment(),
        check_at=check_at,
    )
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(
        key=etl_breaker.variable_name(merge_deployment),
        markdown=f"**{merge_deployment}** circuit breaker: **{result['state']}** (was {result['before']})\n\n"
        + "\n".join(f"- {k}: {v}" for k, v in result.items() if k not in ("state", "before")),
        description="ETL merge circuit breaker",
    )
    print(f"circuit breaker of {merge_deployment}: {result['before']} -> {result['state']}")
    return result


@pipeline_flow("ndjson-listen")
def ndjson_listen(
    source: Literal["local", "sqs"] = "local",
    batch_size: int = 100,
    batch_seconds: float = 2.0,
    merge_deployment: str | None = "ndjson-merge/local",
    max_runtime_seconds: float = 0.0,
    idle_exit_seconds: float = 0.0,
    settle_seconds: float = 1.0,
    unchecked_settle_seconds: float = 60.0,
    rescan_seconds: float = 60.0,
    restart_pending_after_seconds: float = 120.0,
) -> dict[str, int]:
    """Files landing under ``pipeline/input/{date}/`` (a file watch locally, S3 notifications on SQS in AWS) go
    through the ingest in micro-batches and start their merges; runs until ``max_runtime_seconds`` or
    ``idle_exit_seconds`` without an arrival (0: forever; a catch-up run sets the idle exit)."""
    config = etl.settings()

    def events():
        return open_source(
            source,
            "etl",
            config.input_store_url,
            INPUT_PREFIX,
            settle_seconds=settle_seconds,
            unchecked_settle_seconds=unchecked_settle_seconds,
            rescan_seconds=rescan_seconds,
        )

    def launch(made: list[ManifestRef]) -> list[dict[str, Any]]:
        return _launch(_with_restarts(made, restart_pending_after_seconds), merge_deployment)

    print(
        f"listening for files under {INPUT_PREFIX}YYYY-MM-DD/ ({source}), batches of {batch_size} or {batch_seconds} s"
    )
    fill = etl_landing.ManifestFill(config.max_files_per_manifest)
    stats = listen(
        events,
        lambda batch: fill.handled(handle_landed_task(batch, config, launch)),
        batch_size=batch_size,
        batch_seconds=batch_seconds,
        max_runtime_seconds=max_runtime_seconds,
        idle_exit_seconds=idle_exit_seconds,
        batch_full=fill.full,
    )
    print(
        f"listener stopped: {stats.received} received, {stats.acked} done, {stats.released} offered again "
        f"in {stats.batches} batches"
    )
    return vars(stats)
