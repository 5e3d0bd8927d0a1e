"""PHSpectra survey (seed 000): split -> map(fit chunk) -> slow lane -> aggregate; and the stuck-chunk sweep.

    cube ─split─> RUN item, then chunks/{run_id}/chunk-*.npz + every CHUNK item (PENDING)    [before any fit]
         ─map(fit-chunk)─> decompositions/survey=…/run_id=…/chunk-*.parquet   CHUNK: IN_PROGRESS -> COMPLETED | FAILED
                           (jobs_completed / jobs_failed in the same transaction)
         ─slow lane─> spectra past the time limit refitted without it; the chunk's Parquet patched
         ─aggregate─> RUN status, progress / table / markdown artifacts

    A fitter holds its chunk by a lease (``lease_expires_at``) that it renews while it fits; a chunk is stuck
    only when its lease expired.

    phspectra-sweep-stuck: no run stays RUNNING. A run whose driving flow run ended (or that went quiet), with
    no live lease, is taken over conditionally and re-driven (a crashed split finished, PENDING/FAILED chunks
    and chunks whose lease expired fitted, the slow lane retried), at most ``max_sweeps`` times, then FAILED
    with the reason; in a live run, chunks whose lease expired are re-driven. Chunks are taken with
    conditional transitions, so two sweepers never fit the same chunk, and never one whose fitter renews it.

The fits run on a ThreadPool (``workers`` + 1 chunks in flight sharing ``workers`` fitting processes, the
oldest chunk first, see tasks/phspectra/worker.py) or, when the deployment names ``dask_address`` / ``dask_workers``,
on a DaskTaskRunner (one fitting process per Dask worker).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from prefect import get_run_logger, task, unmapped
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from flows.phspectra_catalog import survey_progress
from flows.policies import HEAVY_RETRIES, TRANSIENT_RETRIES, pipeline_flow
from tasks import reconcile
from tasks.core import limits
from tasks.core.runtime import artifact_key, iso_ago
from tasks.landing.listener import listen_report, open_source
from tasks.phspectra import keys
from tasks.phspectra import landing as ph_landing
from tasks.phspectra import sealing as run_seal
from tasks.phspectra import survey as ph
from tasks.phspectra.worker import warm_up

split_cube_task = task(ph.split_cube, name="split-cube", cache_policy=NO_CACHE)
# no cpu-heavy tag: a chunk's fit runs on its process's fitting slots (``fitting_slots``), not on a core of its own,
# and the tag's limit would cost two API round trips a chunk (about 2 s before the first fit)
fit_chunk_task = task(ph.fit_chunk, name="fit-chunk", **TRANSIENT_RETRIES, cache_policy=NO_CACHE)
slow_lane_task = task(
    limits.holding_cpu_slot(ph.refit_timed_out), name="slow-lane-refit", **HEAVY_RETRIES, cache_policy=NO_CACHE
)
aggregate_task = task(ph.finalize_run, name="aggregate-run", cache_policy=NO_CACHE)
find_expired_task = task(ph.expired_leases, name="find-expired-leases", cache_policy=NO_CACHE)
complete_split_task = task(ph.complete_split, name="complete-split", cache_policy=NO_CACHE)
give_up_task = task(ph.give_up, name="give-up-run", cache_policy=NO_CACHE)


def fitting_slots(workers: int = 0, dask_address: str | None = None, dask_workers: int = 0) -> int:
    """Fitting processes at once per process running fit-chunk: ``workers`` (default: its cores), 1 per Dask worker."""
    return 1 if dask_address or dask_workers else workers or os.cpu_count() or 1


def task_runner(workers: int = 0, dask_address: str | None = None, dask_workers: int = 0):
    """A Dask runner on an existing scheduler or a LocalCluster of ``dask_workers`` processes, else threads: one
    chunk more than the fitting slots, so while a chunk's bookkeeping runs a claimed chunk keeps every slot busy."""
    if dask_address or dask_workers:
        from prefect_dask import DaskTaskRunner

        if dask_address:
            return DaskTaskRunner(address=dask_address)
        return DaskTaskRunner(
            cluster_class="distributed.LocalCluster",
            cluster_kwargs={"n_workers": dask_workers, "threads_per_worker": 1, "processes": True},
        )
    return ThreadPoolTaskRunner(max_workers=fitting_slots(workers) + 1)


@pipeline_flow("phspectra-fit-chunks", alert=None)  # a subflow: the run that maps it alerts
def fit_chunks(
    run_id: str,
    starts: list[int],
    slow_starts: list[int] | None = None,
    output_url: str | None = None,
    time_limit_s: float | None = 60.0,
    take_expired: bool = False,
    lease_seconds: float = ph.DEFAULT_LEASE_S,
    progress_id: str | None = None,
    fit_slots: int = 1,
) -> list[dict[str, Any]]:
    """Map fit-chunk over the chunks (progress updated as each ends), then the slow lane.

    The chunks in flight share ``fit_slots`` fitting processes per process, the oldest chunk first.
    """
    logger = get_run_logger()
    futures = fit_chunk_task.map(
        unmapped(run_id),
        starts,
        output_url=unmapped(output_url),
        time_limit_s=unmapped(time_limit_s),
        take_expired=unmapped(take_expired),
        lease_seconds=unmapped(lease_seconds),
        fit_slots=unmapped(fit_slots),
    )
    results: list[dict[str, Any]] = []
    for done, future in enumerate(as_completed(futures), start=1):
        result = future.result(raise_on_failure=False)
        if isinstance(result, BaseException):
            logger.error("chunk failed after its retries: %s", result)
            result = {"outcome": "failed", "error": str(result)}
        results.append(result)
        if progress_id:
            update_progress_artifact(progress_id, progress=100.0 * done / max(len(futures), 1))
    slow = sorted(set(slow_starts or []) | {r["start"] for r in results if r.get("n_timed_out")})
    if slow:
        logger.info("slow lane: %d chunk(s) with spectra past the %ss limit", len(slow), time_limit_s)
        for future in slow_lane_task.map(
            unmapped(run_id), slow, output_url=unmapped(output_url), fit_slots=unmapped(fit_slots)
        ):
            outcome = future.result(raise_on_failure=False)
            if isinstance(outcome, BaseException):
                logger.error("slow lane failed (the chunk keeps n_timed_out; a resume retries it): %s", outcome)
    return results


def publish_summary(summary: dict[str, Any]) -> None:
    """The run's chunk table and markdown summary as Prefect artifacts; then its survey's (this run is a tile of it)."""
    run_id = summary["run_id"]
    create_table_artifact(
        key=artifact_key("phspectra-chunks", run_id), table=summary["chunks"], description=f"Chunks of run {run_id}"
    )
    create_markdown_artifact(
        key=artifact_key("phspectra-summary", run_id),
        markdown=(
            f"# PHSpectra run `{run_id}` ({summary['survey']})\n\n"
            f"| status | chunks completed / failed / total | spectra fitted / total | components | "
            f"timed out → slow lane | fit time (sum) |\n|---|---|---|---|---|---|\n"
            f"| {summary['status']} | {summary['jobs_completed']} / {summary['jobs_failed']} / "
            f"{summary['jobs_total']} | "
            f"{summary['spectra_fitted']} / {summary['n_spectra']} | {summary['n_components']} | "
            f"{summary['n_slow_refit']} | {summary['fit_seconds']:.1f} s |\n"
        ),
        description=f"Summary of run {run_id}",
    )
    if summary.get("survey"):
        survey_progress(summary["survey"])


@pipeline_flow("phspectra-survey")
def phspectra_survey(
    cube_url: str | None = None,
    survey: str | None = None,
    chunk_size: int | None = None,
    fit_params: dict[str, float] | None = None,
    output_url: str | None = None,
    run_id: str | None = None,
    time_limit_s: float = 60.0,
    workers: int = 0,
    dask_address: str | None = None,
    dask_workers: int = 0,
    lease_seconds: float = ph.DEFAULT_LEASE_S,
) -> dict[str, Any]:
    """Decompose every spectrum of a cube into Gaussians, one task per chunk, with per-chunk records.

    With the ``run_id`` of an existing run it resumes that run with the parameters stored on its RUN item
    (``cube_url``, ``survey``, ``chunk_size``, ``fit_params``, ``output_url``: given ones must match).
    """
    logger = get_run_logger()
    if run_id and ph.get_run(run_id) is not None:
        run = ph.reopen_run(run_id, survey, fit_params, cube_url=cube_url, chunk_size=chunk_size, output_url=output_url)
        output_url = run.get("output_url")
        missing = complete_split_task(run_id)
        if missing:
            logger.warning("run %s: the split had not finished; wrote %d missing chunk(s)", run_id, len(missing))
        starts, slow_starts = ph.chunks_to_fit(run_id)
        take_expired = True
        logger.info("resuming run %s: %d chunk(s) to fit, %d for the slow lane", run_id, len(starts), len(slow_starts))
    else:
        if not (cube_url and survey):
            raise ValueError(
                f"no run {run_id} to resume; a new run needs cube_url and survey"
                if run_id
                else "a new run needs cube_url and survey (a resume needs only run_id)"
            )
        if not (dask_address or dask_workers):
            warm_up(fitting_slots(workers))  # the fitting fork server starts while the cube is split
        run_id = run_id or str(uuid.uuid4())
        split = split_cube_task(run_id, survey, cube_url, chunk_size or ph.DEFAULT_CHUNK_SIZE, fit_params, output_url)
        starts, slow_starts, take_expired = split["starts"], [], False
        logger.info("run %s: %d spectra in %d chunks", run_id, split["n_spectra"], split["n_chunks"])
    progress_id = create_progress_artifact(
        0.0, key=artifact_key("phspectra-progress", run_id), description=f"Chunks of run {run_id} fitted"
    )
    if starts or slow_starts:
        fit_chunks.with_options(task_runner=task_runner(workers, dask_address, dask_workers))(
            run_id,
            starts,
            slow_starts,
            output_url,
            time_limit_s,
            take_expired,
            lease_seconds,
            str(progress_id),
            fitting_slots(workers, dask_address, dask_workers),
        )
    else:
        update_progress_artifact(progress_id, progress=100.0)
    summary = aggregate_task(run_id)
    publish_summary(summary)
    if summary["status"] == ph.RUN_FAILED:
        raise RuntimeError(
            f"run {run_id}: {summary['jobs_failed']} of {summary['jobs_total']} chunks failed; "
            f"see `python -m deployments.cli phspectra failures --run-id {run_id}`"
        )
    if summary["status"] == ph.RUN_RUNNING:  # e.g. the slow lane failed, a full disk: Prefect must not say Completed
        raise RuntimeError(f"run {run_id} is unfinished ({ph.unfinished(summary)}); phspectra-sweep-stuck re-drives it")
    return {k: v for k, v in summary.items() if k != "chunks"}


@pipeline_flow("phspectra-sweep-stuck")
def phspectra_sweep_stuck(
    survey: str | None = None,
    time_limit_s: float = 60.0,
    workers: int = 0,
    max_sweeps: int = 3,
    lease_seconds: float = ph.DEFAULT_LEASE_S,
    quiet_minutes: float = 15.0,
) -> dict[str, Any]:
    """No run stays RUNNING: re-drive runs nobody drives any more (bounded by ``max_sweeps``), else FAILED.

    A RUNNING run is orphaned when no chunk's lease is live and the Prefect flow run driving it ended
    (crashed, cancelled, failed, or completed with the slow lane failed) or nothing in it moved for
    ``quiet_minutes``. The sweeper takes it over conditionally (one sweeper per run), writes the chunks a
    crashed split never wrote, fits every chunk not COMPLETED (PENDING, FAILED, IN_PROGRESS with an expired
    lease) into the run's own ``output_url``, runs the slow lane and finalizes it. In a run still driven, only
    chunks whose lease expired are re-driven. Its own fits hold leases of ``lease_seconds``.

    A run whose chunks wait for space (their Parquet met a full disk) is left as it is while the output disk lacks
    room (one log line for all such runs, no sweep counted); once it has room it is taken over the same way, not
    counted against ``max_sweeps``.
    """
    swept: dict[str, Any] = {}
    runs = ph.active_runs(survey)
    drivers = reconcile.prefect_states([r.get("driver_flow_run_id") for r in runs], [])
    still_full: dict[str, str] = {}  # run -> its disk, for one line: nothing fitted, no sweep counted
    for run in runs:
        run_id = run["PK"]
        refused = run_seal.broken(run)  # an item its split did not write as it is now: closed, nothing opened
        if refused:
            swept[run_id] = _close_run(run_id, refused, logged=True)
            continue
        waiting = ph.waiting_for_space(run_id)
        short = ph.short_of_space(run, waiting) if waiting else None
        if short is not None:
            still_full[run_id] = f"{len(waiting)} chunk(s); {short.describe()}"
            continue
        driver = drivers.get(str(run.get("driver_flow_run_id")))
        if ph.orphaned(run, driver is not None and driver.type in reconcile.TERMINAL, iso_ago(quiet_minutes * 60)):
            reason = _why_close(run, driver, max_sweeps, bool(waiting))
            work = _close_run(run_id, reason, logged=True) if reason else _take_orphan(run, driver, bool(waiting))
        else:
            work = _expired_chunks(run_id)
        if isinstance(work, dict):  # closed
            swept[run_id] = work
        elif work is not None:
            swept[run_id] = _redrive(run, *work, time_limit_s, workers, lease_seconds)
    if still_full:
        get_run_logger().warning("runs waiting for space, left waiting: %s", still_full)
    return swept


def _why_close(run: dict[str, Any], driver: Any, max_sweeps: int, waited: bool = False) -> str | None:
    """Why an orphaned run is closed, not re-driven: a person cancelled its flow run, or its sweeps ran out (not
    for a run whose chunks ``waited`` for space and now have room: a full disk never closes a run)."""
    run_id, attempts = run["PK"], int(run.get("sweep_attempts", 0))
    if driver is not None and driver.type == "CANCELLED":  # a person stopped it: finish it as FAILED, not re-drive
        return f"its flow run {driver.id} was cancelled ({ph.unfinished(ph.summarize(run_id))}); resume with run_id"
    if attempts >= max_sweeps and not waited:
        return f"gave up after {attempts} sweeps: {ph.unfinished(ph.summarize(run_id))}"
    return None


def _close_run(run_id: str, reason: str, logged: bool = False) -> dict[str, Any]:
    """Close the run with ``reason`` (the give-up task) and show its summary; the sweep's entry for it."""
    summary = give_up_task(run_id, reason)
    if logged:
        get_run_logger().error("run %s closed as %s: %s", run_id, summary.get("status"), reason)
    publish_summary(summary)
    return {"redriven": [], "status": summary["status"]}


def _take_orphan(
    run: dict[str, Any], driver: Any, for_space: bool = False
) -> tuple[list[int], list[int]] | dict[str, Any] | None:
    """Take an orphaned run over (``for_space``: its chunks waited for space, not counted as a sweep) and finish its
    split: the chunks to fit and its slow lane; the sweep's entry when the split cannot finish (closed); None when
    another sweeper (or a resume) took it first."""
    run_id = run["PK"]
    if not ph.take_over(run, for_space):
        return None
    try:
        complete_split_task(run_id)
    except ValueError as error:
        return _close_run(run_id, str(error))
    stuck, slow = ph.chunks_to_fit(run_id)  # the dead driver's IN_PROGRESS chunks too: their leases expired
    why = f"driver {driver.name}" if driver is not None and driver.type in reconcile.TERMINAL else "quiet"
    get_run_logger().warning(
        "run %s orphaned (%s): re-driving %d chunk(s), slow lane %d", run_id, why, len(stuck), len(slow)
    )
    return stuck, slow


def _expired_chunks(run_id: str) -> tuple[list[int], list[int]] | None:
    """In a run still driven: the chunks whose lease expired (no slow lane), or None when there are none."""
    stuck = [ph.keys.chunk_start_from_sk(c["SK"]) for c in find_expired_task(run_id)]
    if not stuck:
        return None
    get_run_logger().warning("run %s: %d chunk(s) whose lease expired %s, re-driving", run_id, len(stuck), stuck)
    return stuck, []


def _redrive(
    run: dict[str, Any], stuck: list[int], slow: list[int], time_limit_s: float, workers: int, lease_seconds: float
) -> dict[str, Any]:
    """Fit the chunks and the slow lane again (own leases of ``lease_seconds``), aggregate: the run's sweep entry."""
    run_id, results = run["PK"], []
    if stuck or slow:
        results = fit_chunks.with_options(task_runner=task_runner(workers))(
            run_id,
            stuck,
            slow,
            run.get("output_url"),
            time_limit_s,
            take_expired=True,
            lease_seconds=lease_seconds,
            fit_slots=fitting_slots(workers),
        )
    summary = aggregate_task(run_id)
    if summary["status"] != ph.RUN_RUNNING:
        publish_summary(summary)
    return {
        "redriven": sorted(r["start"] for r in results if r.get("outcome") == "completed"),
        "status": summary["status"],
    }


@pipeline_flow("phspectra-listen")
def phspectra_listen(
    source: str = "local",
    max_runtime_seconds: float = 0,
    batch_size: int = 10,
    batch_seconds: float = 1.0,
    wait_seconds: float = 20.0,
    survey_deployment: str = ph_landing.SURVEY_DEPLOYMENT,
) -> dict[str, int]:
    """A cube (``surveys/incoming/{survey}/*.fits``) or a survey manifest (``surveys/incoming/…/*.json``) landing
    starts `phspectra-survey`: one run per cube, for the survey it carries; the same landing twice starts nothing.

    ``source``: "local" watches the object store's ``surveys/incoming/``, "sqs" reads its S3 notifications.
    Runs for ``max_runtime_seconds`` (0: until cancelled); the deployment restarts it.
    """

    def events():
        return open_source(source, ph_landing.PIPELINE, None, keys.SURVEY_INCOMING_PREFIX, None)

    return listen_report(
        "phspectra-listen",
        events,
        lambda batch: ph_landing.handle_landings(batch, survey_deployment),
        batch_size=batch_size,
        batch_seconds=batch_seconds,
        max_runtime_seconds=max_runtime_seconds,
        wait_seconds=wait_seconds,
    )
