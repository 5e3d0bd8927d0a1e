"""Seed 000, PHSpectra survey: task bodies as plain functions (the flow module wraps them as tasks).

split (cube -> chunk .npz + RUN and CHUNK items) -> fit chunk (guarded PENDING -> IN_PROGRESS ->
COMPLETED/FAILED, counters in the same transaction) -> slow lane (refit spectra that ran past the time
limit, patch the chunk's Parquet) -> finalize (run status and summary). Plus the seed's five access
patterns and the sweep of runs nobody drives and of chunks whose lease expired.

A claim on a chunk is a lease (``lease_expires_at``) that its live fitter renews: a chunk is stuck when its
lease expired, never merely because its fit is long.
"""

from __future__ import annotations

import io
import json
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from boto3.dynamodb.conditions import Attr, Key

from tasks.core import disk, keys, state_store
from tasks.core.config import object_store, table_name
from tasks.core.object_store import ObjectNotFound, ObjectStore, open_url
from tasks.core.runtime import iso_ago, now_iso, prefect_ids, run_logger, utc_now
from tasks.core.state_store import Condition, Increment, to_plain
from tasks.phspectra import keys as phspectra_keys
from tasks.phspectra import sealing
from tasks.phspectra.worker import TIMED_OUT, FitStopped, run_in_child, start_fork_server, validate_fit_params

PENDING, IN_PROGRESS, COMPLETED, FAILED = "PENDING", "IN_PROGRESS", "COMPLETED", "FAILED"
RUN_RUNNING, RUN_COMPLETED, RUN_FAILED = "RUNNING", "COMPLETED", "FAILED"
ERROR_BYTES = 1024
DEFAULT_CHUNK_SIZE = 500
DEFAULT_LEASE_S = 60.0  # a claim lasts this long unless its fitter renews it (every third of it)
NAN_FILL = 0.0  # NaN channels become 0.0 before fitting (fit_gaussians refuses NaN), and are counted
# a chunk whose result write met a full disk goes back to PENDING (never FAILED: the disk is no fault of the cube)
# with why it waits and since when, until `phspectra-sweep-stuck` fits it again once the disk has room
WAITING_FOR_SPACE = "waiting_for_space"
WAITING_SINCE = "waiting_for_space_since"

PARQUET_SCHEMA = pa.schema(
    [
        ("x", pa.int32()),
        ("y", pa.int32()),
        ("beta", pa.float64()),
        ("rms", pa.float64()),
        ("min_persistence", pa.float64()),
        ("n_components", pa.int32()),
        ("component_amplitudes", pa.list_(pa.float64())),
        ("component_means", pa.list_(pa.float64())),
        ("component_stddevs", pa.list_(pa.float64())),
    ]
)


# --------------------------------------------------------------------------- small helpers


def truncate_error(message: str, limit: int = ERROR_BYTES) -> str:
    """The message cut to ``limit`` UTF-8 bytes (the seed keeps 1 KB)."""
    return message.encode("utf-8")[:limit].decode("utf-8", errors="ignore")


def runs_table() -> str:
    """The physical name of the ``phspectra_runs`` table."""
    return table_name("phspectra_runs")


def run_key(run_id: str) -> dict[str, str]:
    """The key of a run's RUN item."""
    return {"PK": keys.safe_id(run_id, "run_id"), "SK": phspectra_keys.RUN_SK}


def chunk_key(run_id: str, start: int) -> dict[str, str]:
    """The key of the run's chunk item starting at spectrum ``start``."""
    return {"PK": keys.safe_id(run_id, "run_id"), "SK": phspectra_keys.chunk_sk(start)}


# --------------------------------------------------------------------------- the seed's access patterns


def get_run(run_id: str) -> dict[str, Any] | None:
    """1. GetItem(PK=run_id, SK="RUN")."""
    return state_store.get_item(runs_table(), run_key(run_id))


def _chunk_query(run_id: str, **extra: Any) -> list[dict[str, Any]]:
    condition = Key("PK").eq(keys.safe_id(run_id, "run_id")) & Key("SK").begins_with(phspectra_keys.CHUNK_SK_PREFIX)
    return list(state_store.query_all(runs_table(), KeyConditionExpression=condition, ConsistentRead=True, **extra))


def list_chunks(run_id: str) -> list[dict[str, Any]]:
    """2. Query(PK=run_id, SK begins_with "CHUNK#"), in spectrum order (past 10 million, SK order is not)."""
    return sorted(_chunk_query(run_id), key=lambda chunk: phspectra_keys.chunk_start_from_sk(chunk["SK"]))


def latest_run(survey: str, not_before: str | None = None) -> dict[str, Any] | None:
    """3. Query GSI1 (GSI1_PK=survey, GSI1_SK >= not_before), newest first, Limit 1: never a Scan."""
    condition = Key("GSI1_PK").eq(keys.safe_id(survey, "survey"))
    if not_before:
        condition = condition & Key("GSI1_SK").gte(not_before)
    items = state_store.query_all(
        runs_table(), limit=1, IndexName="GSI1", KeyConditionExpression=condition, ScanIndexForward=False, Limit=1
    )
    return next(iter(items), None)


def stuck_chunks(run_id: str, older_than_s: float = 15 * 60) -> list[dict[str, Any]]:
    """4. Chunks IN_PROGRESS whose ``started_at`` is older than the threshold (default 15 minutes)."""
    stale = Attr("status").eq(IN_PROGRESS) & Attr("started_at").lt(iso_ago(older_than_s))
    return _chunk_query(run_id, FilterExpression=stale)


def expired_leases(run_id: str, before: str | None = None) -> list[dict[str, Any]]:
    """Chunks IN_PROGRESS whose lease ran out before ``before`` (default now): their fitter stopped renewing."""
    return _chunk_query(
        run_id, FilterExpression=Attr("status").eq(IN_PROGRESS), keep=lambda c: lease_expired(c, before)
    )


def failures(run_id: str) -> list[dict[str, Any]]:
    """5. FAILED chunks, each with its truncated error and timing."""
    return _chunk_query(run_id, FilterExpression=Attr("status").eq(FAILED))


# --------------------------------------------------------------------------- split


def load_cube(cube_url: str) -> np.ndarray:
    """The cube at ``cube_url`` (FITS or .npy, spectral axis first) as float64; ValueError if it cannot be."""
    try:
        store, key = open_url(cube_url)
        with store.local_copy(key) as path:
            if key.lower().endswith(".npy"):
                data = np.load(path, allow_pickle=False)
            else:
                from astropy.io import fits

                with fits.open(path, memmap=False) as hdus:
                    data = next((h.data for h in hdus if h.data is not None and h.data.ndim > 0), None)
                if data is None:
                    raise ValueError("the FITS file has no data array")
            cube = np.asarray(data, dtype=np.float64)
    except ObjectNotFound:
        raise ValueError(f"cube not found: {cube_url}") from None
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"cannot read cube {cube_url}: {error}") from None
    if cube.ndim != 3:
        raise ValueError(f"cube {cube_url} has {cube.ndim} axes {cube.shape}; expected 3 (spectral, y, x)")
    if 0 in cube.shape:
        raise ValueError(f"cube {cube_url} is empty {cube.shape}")
    return cube


def prepare_spectra(cube: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Spectra (n, channels) in (y, x) order with NaN channels replaced, their x and y, and the NaN count."""
    n_channels, ny, nx = cube.shape
    missing = ~np.isfinite(cube)
    n_nan = int(missing.sum())
    if n_nan == cube.size:
        raise ValueError(f"cube is entirely NaN {cube.shape}: nothing to fit")
    spectra = np.ascontiguousarray(np.where(missing, NAN_FILL, cube).reshape(n_channels, ny * nx).T)
    index = np.arange(ny * nx)
    return spectra, (index % nx).astype(np.int32), (index // nx).astype(np.int32), n_nan


def validate_chunk_size(chunk_size: int) -> int:
    """``chunk_size`` if it is an integer >= 1, else ValueError."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    return chunk_size


def record_failed_run(run_id: str, survey: str, cube_url: str, error: str) -> None:
    """The RUN item of a run that failed before its chunks were written, with the reason."""
    now = now_iso()
    item = {
        **run_key(run_id),
        "GSI1_PK": survey,
        "GSI1_SK": now,
        "survey": survey,
        "created_at": now,
        "jobs_total": 0,
        "jobs_completed": 0,
        "jobs_failed": 0,
        "n_spectra": 0,
        "n_chunks": 0,
        "status": RUN_FAILED,
        "error": truncate_error(error),
        "cube_url": cube_url,
        "completed_at": now,
    }
    if not state_store.create_if_absent(runs_table(), item, ["PK", "SK"]).applied:
        # only a run that itself failed before its chunks existed takes the new reason; a real run is untouched
        state_store.transition(
            runs_table(),
            run_key(run_id),
            RUN_FAILED,
            RUN_FAILED,
            set={"error": truncate_error(error)},
            condition=Condition("#total = :zero", {"#total": "jobs_total"}, {":zero": 0}),
        )


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def chunk_starts(n_spectra: int, chunk_size: int) -> list[int]:
    """The start of every chunk of a run: derived from the split, never from the chunk items that exist."""
    return list(range(0, int(n_spectra), int(chunk_size)))


def driver_claim() -> dict[str, Any]:
    """The RUN item's record of who drives the run now (its Prefect flow run) and since when."""
    return {"driver_flow_run_id": prefect_ids().get("prefect_flow_run_id", "none"), "driven_at": now_iso()}


def _write_chunks(
    run_id: str,
    spectra: np.ndarray,
    xs: np.ndarray,
    ys: np.ndarray,
    starts: list[int],
    chunk_size: int,
    store: ObjectStore,
) -> None:
    """Each chunk's .npz, then every chunk's PENDING item (an item exists only once its file does)."""
    for start in starts:
        end = start + chunk_size
        store.put_bytes(
            phspectra_keys.chunk_npz_key(run_id, start),
            _npz_bytes(spectra=spectra[start:end], x=xs[start:end], y=ys[start:end]),
        )
    now = now_iso()
    chunk_items = [
        {
            **chunk_key(run_id, start),
            "status": PENDING,
            "chunk_key": phspectra_keys.chunk_npz_key(run_id, start),
            "n_spectra": min(chunk_size, len(spectra) - start),
            "created_at": now,
        }
        for start in starts
    ]
    state_store.create_many_if_absent(runs_table(), chunk_items, ["PK", "SK"])


def split_cube(
    run_id: str,
    survey: str,
    cube_url: str,
    chunk_size: int = 500,
    fit_params: Mapping[str, Any] | None = None,
    output_url: str | None = None,
) -> dict[str, Any]:
    """Validate everything, create the RUN item, then write chunk .npz files and every CHUNK item (PENDING).

    Bad input raises ValueError before any chunk is written; the RUN item records the reason. The RUN item
    comes first, so a second start with the same ``run_id`` stops before it can overwrite this run's chunks;
    a crash before the chunk items are all written is finished by ``complete_split`` (resume or sweeper).
    """
    keys.safe_id(run_id, "run_id"), keys.safe_id(survey, "survey")
    try:
        validate_chunk_size(chunk_size)
        params = validate_fit_params(fit_params)
        spectra, xs, ys, n_nan = prepare_spectra(load_cube(cube_url))
    except ValueError as error:
        record_failed_run(run_id, survey, cube_url, str(error))
        raise
    starts = chunk_starts(len(spectra), chunk_size)
    now = now_iso()
    run_item = {
        **run_key(run_id),
        "GSI1_PK": survey,
        "GSI1_SK": now,
        "survey": survey,
        "created_at": now,
        "jobs_total": len(starts),
        "jobs_completed": 0,
        "jobs_failed": 0,
        "n_spectra": len(spectra),
        "n_chunks": len(starts),
        "status": RUN_RUNNING,
        "cube_url": cube_url,
        "chunk_size": chunk_size,
        "n_channels": spectra.shape[1],
        "n_nan_channels": n_nan,
        **driver_claim(),
    }
    if params:
        run_item["params"] = json.dumps(params, sort_keys=True)
    if output_url:
        run_item["output_url"] = output_url
    run_item.update(sealing.seal_run(run_item))  # what it opens and writes is what this split chose
    created = state_store.create_if_absent(runs_table(), run_item, ["PK", "SK"])
    if not created.applied:
        raise ValueError(f"run {run_id} already exists: pass it as run_id to resume it")
    _write_chunks(run_id, spectra, xs, ys, starts, chunk_size, object_store(output_url))
    return {
        "run_id": run_id,
        "survey": survey,
        "n_spectra": len(spectra),
        "n_chunks": len(starts),
        "n_nan_channels": n_nan,
        "starts": starts,
        "params": params,
    }


def complete_split(run_id: str) -> list[int]:
    """Write the files and items of the chunks a crashed split did not (from the RUN item); their starts.

    ValueError when the cube no longer matches the run (it cannot be finished as split).
    """
    run = to_plain(get_run(run_id) or {})
    if not run.get("jobs_total"):
        return []
    have = {phspectra_keys.chunk_start_from_sk(chunk["SK"]) for chunk in _chunk_query(run_id)}
    missing = [start for start in chunk_starts(run["n_spectra"], run["chunk_size"]) if start not in have]
    if missing:
        sealing.check_run(run)  # SealBroken (a ValueError): a cube or store its split did not choose is never opened
        spectra, xs, ys, _ = prepare_spectra(load_cube(run["cube_url"]))
        if spectra.shape != (run["n_spectra"], run["n_channels"]):
            raise ValueError(
                f"run {run_id}: cube {run['cube_url']} is now "
                f"{spectra.shape[0]} spectra x {spectra.shape[1]} channels, "
                f"split as {run['n_spectra']} x {run['n_channels']}; its missing chunks cannot be written"
            )
        _write_chunks(run_id, spectra, xs, ys, missing, run["chunk_size"], object_store(run.get("output_url")))
    return missing


# --------------------------------------------------------------------------- leases


def lease_until(lease_seconds: float) -> str:
    """The ``lease_expires_at`` of a lease taken or renewed now for ``lease_seconds``."""
    return now_iso(utc_now() + timedelta(seconds=lease_seconds))


def lease_expired(item: Mapping[str, Any], now: str | None = None) -> bool:
    """Whether a chunk's lease ran out before ``now`` (default now); a chunk without one has nobody renewing it."""
    return str(item.get("lease_expires_at") or "") < (now or now_iso())


def lease_expired_condition(now: str | None = None) -> Condition:
    """``lease_expired`` as a write condition, so a fitter that renews meanwhile wins."""
    return Condition(
        "attribute_not_exists(#lease) OR #lease < :now", {"#lease": "lease_expires_at"}, {":now": now or now_iso()}
    )


def _mine(started_at: str) -> Condition:
    """Only the claim that set this ``started_at`` may renew or finish the chunk (a re-driven chunk has another)."""
    return Condition("#started = :mine", {"#started": "started_at"}, {":mine": started_at})


class ChunkLease:
    """A fitter's claim on a chunk, renewed from a background thread a third of ``lease_seconds`` after the last
    renewal (the fitter's own renewals, at its fitting process's start and before it publishes, count too).

    ``lost`` is set once a renewal finds the chunk no longer held by this claim (taken after its lease
    expired, or failed by the reconciler): the fitter then stops its fit and publishes nothing.
    """

    def __init__(self, run_id: str, start: int, started_at: str, lease_seconds: float) -> None:
        self.key, self.started_at, self.lease_seconds = chunk_key(run_id, start), started_at, lease_seconds
        self.lost, self._done = threading.Event(), threading.Event()
        self._tried_at = time.monotonic()  # the claim itself took the lease
        self._thread = threading.Thread(target=self._keep, name=f"phspectra-lease-{run_id}-{start}", daemon=True)

    def renew(self, **extra: Any) -> bool:
        """Extend the lease (setting ``extra`` too) while this claim holds the chunk; False once it is lost."""
        self._tried_at = time.monotonic()
        renewed = state_store.transition(
            runs_table(),
            self.key,
            IN_PROGRESS,
            None,
            set={"lease_expires_at": lease_until(self.lease_seconds), **extra},
            condition=_mine(self.started_at),
        ).applied
        if not renewed:
            self.lost.set()
        return renewed

    def _keep(self) -> None:
        while not self.lost.is_set():
            if self._done.wait(max(0.0, self._tried_at + self.lease_seconds / 3 - time.monotonic())):
                return
            if time.monotonic() < self._tried_at + self.lease_seconds / 3:
                continue  # the fitter renewed meanwhile
            try:
                self.renew()
            except Exception as error:  # noqa: BLE001 - the keeper thread must outlive any failed renewal
                # e.g. DynamoDB unreachable: the next tick tries again, the final write decides
                run_logger(__name__).warning("%s: lease renewal failed (%s); retrying", self.key["SK"], error)

    def __enter__(self) -> ChunkLease:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._done.set()
        self._thread.join()


# --------------------------------------------------------------------------- fit one chunk


def claim_chunk(
    run_id: str, start: int, take_expired: bool = False, lease_seconds: float = DEFAULT_LEASE_S
) -> dict[str, Any] | None:
    """Move the chunk to IN_PROGRESS, with a lease, if it is PENDING, FAILED, a retry of this task run, or
    (``take_expired``) IN_PROGRESS with its lease expired.

    Returns the claimed item, or None when it is COMPLETED or being fitted by someone else.
    A FAILED chunk's ``jobs_failed`` is taken back in the same transaction, so counters stay exact.
    An expired lease is taken conditionally on the ``started_at`` seen and on the lease still being expired,
    so of two sweepers only one gets it, and never from a fitter that renewed meanwhile.
    """
    table, key = runs_table(), chunk_key(run_id, start)
    ids = prefect_ids()
    for _ in range(5):
        now = now_iso()
        claim = {
            "started_at": now,
            "lease_expires_at": lease_until(lease_seconds),
            "worker_host": socket.gethostname(),
            **ids,
        }
        result = state_store.transition(
            table, key, PENDING, IN_PROGRESS, set=claim, add={"attempts": 1}, remove=[WAITING_FOR_SPACE, WAITING_SINCE]
        )
        if result.applied:
            return to_plain(result.item)
        current = result.item
        if current is None:
            raise LookupError(f"no chunk {phspectra_keys.chunk_sk(start)} in run {run_id}")
        status = current.get("status")
        if status == COMPLETED:
            return None
        if status == FAILED:
            result = state_store.transition(
                table,
                key,
                FAILED,
                IN_PROGRESS,
                set=claim,
                add={"attempts": 1},
                remove=["error", "failed_at"],
                increments=[Increment(table, run_key(run_id), {"jobs_failed": -1})],
            )
        elif status == IN_PROGRESS:
            seen = _mine(current.get("started_at", ""))
            if ids.get("prefect_task_run_id") and current.get("prefect_task_run_id") == ids["prefect_task_run_id"]:
                condition = seen  # this task run's earlier attempt ended: its claim is ours
            elif take_expired and lease_expired(current, now):
                condition = seen & lease_expired_condition(now)
            else:
                return None
            result = state_store.transition(
                table, key, IN_PROGRESS, IN_PROGRESS, set=claim, add={"attempts": 1}, condition=condition
            )
        if result.applied:
            return to_plain(result.item)
    return None


def wait_for_space(run_id: str, start: int, started_at: str, error: str) -> str:
    """IN_PROGRESS -> PENDING for the claim that set ``started_at``, its lease given up, with why it waits: the
    chunk's Parquet met a full disk (its write removed what it had written, so nothing is published). No counter
    moves. The reason recorded."""
    reason = truncate_error(error)
    state_store.transition(
        runs_table(),
        chunk_key(run_id, start),
        IN_PROGRESS,
        PENDING,
        condition=_mine(started_at),
        set={WAITING_FOR_SPACE: reason, WAITING_SINCE: now_iso()},
        remove=["lease_expires_at"],
    )
    return reason


def short_of_space(run: Mapping[str, Any], waiting: list[Mapping[str, Any]]) -> disk.DiskUsage | None:
    """The reading of the run's output disk while it lacks room for the ``waiting`` chunks (their inputs' size, a
    bound on their Parquet); None once they can be fitted again."""
    store = object_store(run.get("output_url"))
    needed = 0
    for chunk in waiting:
        try:
            needed += store.size(chunk["chunk_key"])
        except ObjectNotFound:
            pass
    return disk.short_of_space(store.disk_folder(), needed)


def waiting_for_space(run_id: str) -> list[dict[str, Any]]:
    """The run's chunks waiting for space: PENDING after their fit's write met a full disk, or COMPLETED with the
    slow lane still owed after its write did."""
    return [c for c in list_chunks(run_id) if c.get("status") in (PENDING, COMPLETED) and WAITING_FOR_SPACE in c]


def rows_to_table(xs: np.ndarray, ys: np.ndarray, rows: list[dict[str, Any]]) -> pa.Table:
    """A chunk's Parquet table in the seed worker's schema, one row per spectrum in chunk order."""
    columns = {name: [row[name] for row in rows] for name in PARQUET_SCHEMA.names if name not in ("x", "y")}
    return pa.table({"x": xs.astype(np.int32), "y": ys.astype(np.int32), **columns}, schema=PARQUET_SCHEMA)


def write_parquet(store: ObjectStore, key: str, table: pa.Table) -> str:
    """One Snappy Parquet object at ``key``, written whole (atomic overwrite: deterministic keys)."""
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer, compression="snappy")
    return store.put_bytes(key, buffer.getvalue().to_pybytes())


def read_parquet(store: ObjectStore, key: str) -> pa.Table:
    """The Parquet object at ``key`` as a table with ``PARQUET_SCHEMA``."""
    return pq.read_table(io.BytesIO(store.get_bytes(key)), schema=PARQUET_SCHEMA)


def run_params(run: Mapping[str, Any]) -> dict[str, Any]:
    """The run's fit parameters decoded from its JSON ``params`` ({} when none)."""
    return to_plain(json.loads(run["params"])) if run.get("params") else {}


def fit_chunk(
    run_id: str,
    start: int,
    output_url: str | None = None,
    time_limit_s: float | None = 60.0,
    take_expired: bool = False,
    lease_seconds: float = DEFAULT_LEASE_S,
    fit_slots: int = 1,
) -> dict[str, Any]:
    """Claim one chunk, fit its spectra in child processes, write its Parquet, mark it COMPLETED (or FAILED).

    ``jobs_completed`` / ``jobs_failed`` move in the same transaction as the chunk's transition, and only
    the claim that set ``started_at`` can finish it, so retries and re-drives never count twice. The claim's
    lease is renewed while the fit runs; once it is lost the fit is stopped and nothing is published.
    ``fit_slots``: fitting processes this process runs at once, shared by the chunks it fits (its cores).
    """
    start_fork_server(fit_slots)  # before the claim: a lease is not spent waiting for the fitting processes' server
    claimed = claim_chunk(run_id, start, take_expired, lease_seconds)
    if claimed is None:
        current = state_store.get_item(runs_table(), chunk_key(run_id, start)) or {}
        return {"start": start, "outcome": "skipped", "status": current.get("status")}
    started_at, began = claimed["started_at"], time.perf_counter()
    table, key, increment_key = runs_table(), chunk_key(run_id, start), run_key(run_id)

    def elapsed_ms() -> int:
        """Milliseconds since the chunk was claimed."""
        return int((time.perf_counter() - began) * 1000)

    try:
        with ChunkLease(run_id, start, started_at, lease_seconds) as lease:
            rows, fit_seconds, output_key = _fit_under_lease(
                run_id, start, claimed, lease, output_url, time_limit_s, fit_slots
            )
        counts = {
            "n_spectra": len(rows),
            "n_components": sum(r["n_components"] for r in rows if r["n_components"] != TIMED_OUT),
            "n_timed_out": sum(r["n_components"] == TIMED_OUT for r in rows),
        }
        completed = {"completed_at": now_iso(), "duration_ms": elapsed_ms(), "fit_ms": int(fit_seconds * 1000)}
        done = state_store.transition(
            table,
            key,
            IN_PROGRESS,
            COMPLETED,
            condition=_mine(started_at),
            set={**completed, "output_key": output_key, **counts},
            increments=[Increment(table, increment_key, {"jobs_completed": 1})],
        )
    except FitStopped as stopped:
        run_logger(__name__).warning("%s; its new claim finishes it", stopped)
        return {"start": start, "outcome": "superseded", "duration_ms": elapsed_ms()}
    except Exception as error:
        if disk.is_disk_full(error):  # not retried here: minutes rarely free a disk; the sweep takes it again
            reason = wait_for_space(run_id, start, started_at, f"{type(error).__name__}: {error}")
            run_logger(__name__).warning("chunk %d of run %s waits for space: %s", start, run_id, reason)
            return {"start": start, "outcome": "waiting for space", "error": reason, "duration_ms": elapsed_ms()}
        state_store.transition(
            table,
            key,
            IN_PROGRESS,
            FAILED,
            condition=_mine(started_at),
            set={
                "error": truncate_error(f"{type(error).__name__}: {error}"),
                "failed_at": now_iso(),
                "duration_ms": elapsed_ms(),
            },
            increments=[Increment(table, increment_key, {"jobs_failed": 1})],
        )
        raise
    outcome = "completed" if done.applied else "superseded"  # re-driven meanwhile: same output, not counted twice
    return {"start": start, "outcome": outcome, **counts, "duration_ms": elapsed_ms()}


def _fit_under_lease(
    run_id: str,
    start: int,
    claimed: Mapping[str, Any],
    lease: ChunkLease,
    output_url: str | None,
    time_limit_s: float | None,
    fit_slots: int,
) -> tuple[list[dict[str, Any]], float, str]:
    """Fit the claimed chunk in child processes and write its Parquet while ``lease`` still holds it: its rows, fit
    seconds and output key."""
    run = get_run(run_id)
    if run is None:
        raise LookupError(f"run {run_id} has no RUN item")
    store = object_store(output_url)
    with store.local_copy(claimed["chunk_key"]) as path:

        def on_start(pid: int) -> None:
            """The fitting process is the worker: the chunk's lease names its pid."""
            lease.renew(worker_pid=pid)

        rows, fit_seconds, _ = run_in_child(
            path, run_params(run), time_limit_s, on_start=on_start, stop=lease.lost, slots=fit_slots
        )
        with np.load(path) as data:
            xs, ys = data["x"], data["y"]
    if not lease.renew():  # published only under a lease just confirmed, so nobody else holds the chunk
        raise FitStopped(f"chunk {start} of run {run_id} was taken from this fit")
    output_key = phspectra_keys.decomposition_key(run["survey"], run_id, start)
    write_parquet(store, output_key, rows_to_table(xs, ys, rows))
    return rows, fit_seconds, output_key


# --------------------------------------------------------------------------- slow lane


def refit_timed_out(run_id: str, start: int, output_url: str | None = None, fit_slots: int = 1) -> dict[str, Any]:
    """The slow lane: refit a COMPLETED chunk's timed-out spectra without a limit and patch its Parquet."""
    table, key = runs_table(), chunk_key(run_id, start)
    chunk = to_plain(state_store.get_item(table, key) or {})
    if chunk.get("status") != COMPLETED or not chunk.get("n_timed_out"):
        return {"start": start, "refitted": 0}
    run = get_run(run_id)
    store = object_store(output_url)
    output = read_parquet(store, chunk["output_key"]).to_pylist()
    slow = [i for i, row in enumerate(output) if row["n_components"] == TIMED_OUT]
    with store.local_copy(chunk["chunk_key"]) as path, tempfile.TemporaryDirectory(prefix="phspectra-slow-") as tmp:
        with np.load(path) as data:
            subset = Path(tmp, "slow.npz")
            np.savez(subset, spectra=data["spectra"][slow])
        rows = run_in_child(subset, run_params(run), None, slots=fit_slots).rows
    for index, row in zip(slow, rows):
        output[index].update(row)
    seen = Condition("#t = :seen", {"#t": "n_timed_out"}, {":seen": chunk["n_timed_out"]})
    try:
        write_parquet(store, chunk["output_key"], pa.Table.from_pylist(output, schema=PARQUET_SCHEMA))
    except Exception as error:
        if not disk.is_disk_full(error):
            raise
        # the chunk keeps its Parquet as it was and its n_timed_out (the slow lane is still owed), waiting for space
        reason = truncate_error(f"{type(error).__name__}: {error}")
        waiting = {WAITING_FOR_SPACE: reason, WAITING_SINCE: now_iso()}
        state_store.transition(table, key, COMPLETED, None, set=waiting, condition=seen)
        run_logger(__name__).warning("slow lane of chunk %d of run %s waits for space: %s", start, run_id, reason)
        return {"start": start, "refitted": 0, "waiting_for_space": reason}
    n_components = sum(row["n_components"] for row in output)
    state_store.transition(
        table,
        key,
        COMPLETED,
        None,
        set={"n_timed_out": 0, "n_slow_refit": len(slow), "n_components": n_components, "slow_lane_at": now_iso()},
        remove=[WAITING_FOR_SPACE, WAITING_SINCE],
        condition=seen,
    )
    return {"start": start, "refitted": len(slow)}


# --------------------------------------------------------------------------- resume, sweep, finalize


def chunks_to_fit(run_id: str, now: str | None = None) -> tuple[list[int], list[int]]:
    """(starts to fit: PENDING, FAILED or IN_PROGRESS with an expired lease; starts needing the slow lane:
    COMPLETED with timeouts)."""
    fit, slow = [], []
    now = now or now_iso()
    for chunk in list_chunks(run_id):
        start, status = phspectra_keys.chunk_start_from_sk(chunk["SK"]), chunk.get("status")
        if status in (PENDING, FAILED) or (status == IN_PROGRESS and lease_expired(chunk, now)):
            fit.append(start)
        elif status == COMPLETED and chunk.get("n_timed_out"):
            slow.append(start)
    return sorted(fit), sorted(slow)


def reopen_run(
    run_id: str,
    survey: str | None = None,
    fit_params: Mapping[str, Any] | None = None,
    **given: Any,
) -> dict[str, Any]:
    """An existing run, back to RUNNING for a resume with the parameters stored on its RUN item.

    ValueError if it cannot be resumed, or if a parameter given (``survey``, ``fit_params``, ``cube_url``,
    ``chunk_size``, ``output_url``; None: not given) differs from the run's own.
    """
    run = get_run(run_id)
    if run is None:
        raise ValueError(f"no run {run_id} to resume")
    run = to_plain(run)
    if not run.get("jobs_total"):
        raise ValueError(f"run {run_id} failed before its chunks were written ({run.get('error')}); start a new run")
    try:
        sealing.check_run(run)
    except sealing.SealBroken as error:
        give_up(run_id, str(error))
        raise
    asked = {"survey": survey, **given, "fit_params": validate_fit_params(fit_params) if fit_params else None}
    stored = {name: run.get(name) for name in asked} | {"fit_params": run_params(run)}
    conflicts = [
        f"{name}={asked[name]!r} "
        f"(the run's: {'the default object store' if stored[name] is None else repr(stored[name])})"
        for name in asked
        if asked[name] is not None and asked[name] != stored[name]
    ]
    if conflicts:
        raise ValueError(
            f"run {run_id} resumes with the parameters it was started with, and these differ: {'; '.join(conflicts)}. "
            "Leave them out (run_id is enough) or start a new run"
        )
    state_store.transition(
        runs_table(),
        run_key(run_id),
        [RUN_RUNNING, RUN_COMPLETED, RUN_FAILED],
        RUN_RUNNING,
        set={**driver_claim(), "sweep_attempts": 0},
        remove=["error", "ttl"],  # live again: no retention
    )
    return run


def active_runs(survey: str | None = None) -> list[dict[str, Any]]:
    """RUNNING runs: of one survey through GSI1, or of every survey (a maintenance Scan, RUN items kept in code)."""

    def running(item: Mapping[str, Any]) -> bool:
        return item.get("status") == RUN_RUNNING

    if survey:
        condition = Key("GSI1_PK").eq(keys.safe_id(survey, "survey"))
        return list(
            state_store.query_all(runs_table(), keep=running, IndexName="GSI1", KeyConditionExpression=condition)
        )
    return list(
        state_store.scan_all(runs_table(), keep=lambda item: item["SK"] == phspectra_keys.RUN_SK and running(item))
    )


def summarize(run_id: str) -> dict[str, Any]:
    """The run's figures from its chunk items: spectra, components, failures, time, per-chunk rows."""
    run = to_plain(get_run(run_id) or {})
    chunks = [to_plain(c) for c in list_chunks(run_id)]
    statuses = Counter(c.get("status") for c in chunks)
    done = [c for c in chunks if c.get("status") == COMPLETED]
    return {
        "run_id": run_id,
        "survey": run.get("survey"),
        "status": run.get("status"),
        "jobs_total": run.get("jobs_total", 0),
        "jobs_completed": run.get("jobs_completed", 0),
        "jobs_failed": run.get("jobs_failed", 0),
        "n_spectra": run.get("n_spectra", 0),
        "spectra_fitted": sum(c.get("n_spectra", 0) for c in done),
        "n_components": sum(c.get("n_components", 0) for c in done),
        "n_timed_out": sum(c.get("n_timed_out", 0) for c in done),
        "n_slow_refit": sum(c.get("n_slow_refit", 0) for c in done),
        "n_chunk_items": len(chunks),
        "chunk_statuses": dict(statuses),
        "n_waiting_for_space": sum(WAITING_FOR_SPACE in c for c in chunks if c.get("status") in (PENDING, COMPLETED)),
        "fit_seconds": sum(c.get("duration_ms", 0) for c in chunks) / 1000,
        "chunks": [
            {
                "chunk": c["SK"].removeprefix(phspectra_keys.CHUNK_SK_PREFIX),
                "status": c.get("status"),
                "n_spectra": c.get("n_spectra"),
                "n_components": c.get("n_components"),
                "n_timed_out": c.get("n_timed_out"),
                "duration_ms": c.get("duration_ms"),
                "attempts": c.get("attempts"),
                "error": c.get("error"),
            }
            for c in chunks
        ],
    }


def finalize_run(run_id: str) -> dict[str, Any]:
    """Close the run when every chunk has ended: COMPLETED, or FAILED naming how many chunks failed."""
    summary = summarize(run_id)
    statuses = summary["chunk_statuses"]
    if statuses.get(PENDING) or statuses.get(IN_PROGRESS) or summary["n_timed_out"]:
        return summary  # still running (or stuck: the sweeper will finish it)
    if summary["n_chunk_items"] != summary["jobs_total"]:
        return summary  # the split never finished: resume or the sweeper writes the missing chunks first
    sets: dict[str, Any] = {"completed_at": now_iso(), "n_components": summary["n_components"]}
    if statuses.get(FAILED):
        sets["error"] = f"{statuses[FAILED]} of {summary['jobs_total']} chunks failed"
    new = RUN_FAILED if statuses.get(FAILED) else RUN_COMPLETED
    if state_store.transition(runs_table(), run_key(run_id), RUN_RUNNING, new, set=sets).applied:
        summary["status"] = new
    return summary


# --------------------------------------------------------------------------- the sweeper: no run stays RUNNING


def last_activity(run: Mapping[str, Any], chunks: list[Mapping[str, Any]]) -> str:
    """The latest timestamp the run or any of its chunks carries: when anything last moved."""
    stamps = [run.get(a) or "" for a in ("created_at", "driven_at")]
    stamps += [
        c.get(a) or ""
        for c in chunks
        for a in ("created_at", "started_at", "completed_at", "failed_at", "slow_lane_at")
    ]
    return max(stamps)


def orphaned(run: Mapping[str, Any], driver_ended: bool, quiet_before: str) -> bool:
    """Whether nobody drives a RUNNING run: no chunk's lease is live, and its driving flow run ended or nothing
    moved since ``quiet_before``."""
    chunks = list_chunks(run["PK"])
    if any(c.get("status") == IN_PROGRESS and not lease_expired(c) for c in chunks):
        return False  # a fitter still renews its lease: the run is worked on (its driver's end is not the fit's)
    return driver_ended or last_activity(run, chunks) < quiet_before


def take_over(run: Mapping[str, Any], for_space: bool = False) -> bool:
    """Become the driver of an orphaned run, counting one sweep (``for_space``: a run whose chunks waited for space,
    counted in ``space_sweeps`` instead, as a full disk is no reason to give it up); False if another sweeper or a
    resume was first."""
    seen = {a: run.get(a) for a in ("driver_flow_run_id", "driven_at")}
    return state_store.transition(
        runs_table(),
        run_key(run["PK"]),
        RUN_RUNNING,
        None,
        set=driver_claim(),
        add={"space_sweeps" if for_space else "sweep_attempts": 1},
        condition=state_store.unchanged(seen),
    ).applied


def give_up(run_id: str, reason: str) -> dict[str, Any]:
    """Close a RUNNING run that cannot be finished as FAILED with ``reason``; its summary."""
    summary = summarize(run_id)
    sets = {"error": truncate_error(reason), "completed_at": now_iso(), "n_components": summary["n_components"]}
    if state_store.transition(runs_table(), run_key(run_id), RUN_RUNNING, RUN_FAILED, set=sets).applied:
        summary["status"] = RUN_FAILED
    return summary


def unfinished(summary: Mapping[str, Any]) -> str:
    """What keeps a run from finishing, in words (for a FAILED run's reason)."""
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(summary["chunk_statuses"].items()))
    missing = summary["jobs_total"] - summary["n_chunk_items"]
    timed_out, waiting = summary["n_timed_out"], summary.get("n_waiting_for_space")
    return (
        f"chunks {statuses or 'none'} of {summary['jobs_total']}"
        + (f", {waiting} waiting for space (a full disk)" if waiting else "")
        + (f", {missing} never written" if missing > 0 else "")
        + (f", {timed_out} spectra still past the time limit" if timed_out else "")
    )
