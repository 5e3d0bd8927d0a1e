"""The ETL's merge spread over a Dask cluster: merge MB/s of NDJSON in at 1, 2, 4, … workers, against a plain pool.

One manifest's worth of ~10 MB NDJSON files (the seed's size; ``etl_merge.make_files``), grouped into parts of
``--files-per-part`` files (``target_file_mb`` chosen so; at least 2 parts per worker at ``--max-workers``). For each
n in 1, 2, 4, … ``--max-workers`` (default: this machine's cores): a ``distributed.LocalCluster`` of n worker
processes × 1 thread, warmed (each worker has loaded the merge's modules and compiled kernels), then, interleaved,
best of ``--repeats``:
- ours: ``merge_manifest(..., scheduler=cluster.scheduler_address)`` (a Client per manifest, one Dask task a part,
  the summary back, staged parts published), as the ``ndjson-merge`` flow's ``dask_scheduler`` runs it;
- the plain tool a user would script: a warm ``concurrent.futures.ProcessPoolExecutor(n)``, one task a part doing
  ``pyarrow.json.read_json`` per file, ``concat_tables``, ``pyarrow.parquet.write_table`` (no string casting,
  metadata columns, rejects nor publish), each process's pyarrow on 1 thread (n processes: n cores, as ours).
Printed per n: MB/s, speedup over n = 1 and speedup ÷ n (goal: ≥ 0.8 of linear), for both, and ours ÷ the pool.
Exit code 1 when the merge's row count differs from the pool's.

    .venv/bin/python benchmarks/etl_merge_scaling.py                    # 1..cores workers, 3 repeats
    .venv/bin/python benchmarks/etl_merge_scaling.py --max-workers 16   # the 16-core machine
    .venv/bin/python benchmarks/etl_merge_scaling.py --quick            # 1-2 workers, 2 MB files, 1 repeat (~1 min)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")  # the cluster's start and stop, not its INFO lines

from benchmarks.etl_merge import DATE, make_files
from tasks.etl import merge as etl_merge

MANIFEST = "batch-0001-20260101-000000.json"


def worker_counts(most: int) -> list[int]:
    """1, 2, 4, … up to ``most``, and ``most`` itself."""
    counts, n = [], 1
    while n < most:
        counts.append(n)
        n *= 2
    return counts + [most]


def pool_part(paths: list[str], out: str) -> int:
    """One part the plain way: each file through pyarrow's JSON reader, one Parquet file written; the rows."""
    import pyarrow as pa
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    table = pa.concat_tables([pajson.read_json(p) for p in paths], promote_options="default")
    pq.write_table(table, out)
    return table.num_rows


def pool_merge(pool: ProcessPoolExecutor, parts: list[list[str]], out: Path) -> int:
    """Every part on the pool; the rows written."""
    paths = [[url[len("file://") :] for url in part] for part in parts]
    return sum(pool.map(pool_part, paths, [str(out / f"part-{i:05d}.parquet") for i in range(len(paths))]))


def one_arrow_thread() -> None:
    """A pool process computes on 1 thread, as each Dask worker here has 1: n processes use n cores."""
    import pyarrow as pa

    pa.set_cpu_count(1)


def warm_worker() -> int:
    """Load the merge's modules and its compiled reader in this process (a worker's first task pays this once)."""
    from tasks.etl.ndjson_text import parse_ndjson

    return parse_ndjson("file:///warm.ndjson", b'{"a": 1, "b": "x"}\n', etl_merge.user_column).rows


def started(_: int) -> int:
    """A pool task that keeps its process busy a moment, so that the pool starts all its processes before timing."""
    time.sleep(0.3)
    return os.getpid()


@contextlib.contextmanager
def cluster_of(n: int):
    """A LocalCluster of ``n`` worker processes × 1 thread, each warmed; its scheduler address and the seconds the
    warming took (a fresh worker's first merge pays it once: the merge's modules, Prefect among them, and kernels)."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.WARNING
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(n)
        start = time.perf_counter()
        client.run(warm_worker)
        yield cluster.scheduler_address, time.perf_counter() - start


def measure(n: int, urls: list[str], target_mb: float, repeats: int, work: Path) -> dict[str, list[float]]:
    """Seconds of each repeat at ``n`` workers, interleaved: ours on the cluster, the plain pool; with the rows."""
    parts = etl_merge.plan_parts(sorted(urls), target_mb)
    from distributed import Client

    times: dict[str, list[float]] = {"ours": [], "pool": [], "rows": [], "pool rows": [], "connect": []}
    with cluster_of(n) as (address, warming), ProcessPoolExecutor(n, initializer=one_arrow_thread) as pool:
        times["warming"] = [warming]
        start = time.perf_counter()
        with Client(address):  # what run_dask pays a manifest before its parts start
            times["connect"].append(time.perf_counter() - start)
        assert len(set(pool.map(started, range(n)))) == n, "the pool did not start its processes"
        for r in range(repeats):
            for name in ("ours", "pool") if r % 2 == 0 else ("pool", "ours"):
                out = work / f"out-{n}-{name}-{r}"
                out.mkdir()
                start = time.perf_counter()
                if name == "ours":
                    summary = etl_merge.merge_manifest(DATE, MANIFEST, urls, out.as_uri(), target_mb, address)
                    times["rows"].append(summary["rows"])
                else:
                    times["pool rows"].append(pool_merge(pool, parts, out))
                times[name].append(time.perf_counter() - start)
                shutil.rmtree(out)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1-2 workers, 2 MB files, 1 repeat (about a minute)")
    parser.add_argument("--max-workers", type=int, help="largest worker count (default: this machine's cores)")
    parser.add_argument("--mb-each", type=float, default=10, help="MB per NDJSON file (the seed's: 10)")
    parser.add_argument("--files-per-part", type=int, default=2, help="input files per output part")
    parser.add_argument("--parts-per-worker", type=int, default=2, help="parts per worker at --max-workers")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--nested", action="store_true", help="add a nested object and a list to every record")
    args = parser.parse_args()
    most = args.max_workers or (min(2, os.cpu_count() or 1) if args.quick else os.cpu_count() or 1)
    mb_each = 2 if args.quick and args.mb_each == 10 else args.mb_each
    repeats = args.repeats or (1 if args.quick else 3)
    files = most * args.parts_per_worker * args.files_per_part
    # a part's NDJSON budget is target / NDJSON_TO_PARQUET: half a file over files-per-part keeps the grouping exact
    target_mb = (args.files_per_part + 0.5) * mb_each * etl_merge.NDJSON_TO_PARQUET
    work = Path(tempfile.mkdtemp(prefix="etl-merge-scaling-"))
    try:
        urls = make_files(work / "in", files, mb_each, args.nested)
        mb = sum(Path(u[7:]).stat().st_size for u in urls) / 2**20
        parts = etl_merge.plan_parts(sorted(urls), target_mb)
        print(
            f"{files} NDJSON files of ~{mb_each:g} MB ({mb:.0f} MB{', nested values' if args.nested else ''}) in "
            f"{len(parts)} parts of {args.files_per_part} files; workers {worker_counts(most)} (processes × 1 thread); "
            f"best of {repeats}; machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start",
            flush=True,
        )
        best: dict[int, dict[str, float]] = {}
        wrong = False
        for n in worker_counts(most):
            times = measure(n, urls, target_mb, repeats, work)
            best[n] = {name: mb / min(times[name]) for name in ("ours", "pool")}
            if set(times["rows"]) != set(times["pool rows"]) or len(set(times["rows"])) != 1:
                print(f"  FAILED at {n} workers: the merge wrote {times['rows']} rows, the pool {times['pool rows']}")
                wrong = True
            runs = {name: ", ".join(f"{t:.2f}" for t in times[name]) for name in ("ours", "pool")}
            print(
                f"  {n:3d} workers: ours {best[n]['ours']:7.1f} MB/s (runs {runs['ours']} s; a Client's connect "
                f"{times['connect'][0]:.2f} s of it) | pool {best[n]['pool']:7.1f} MB/s (runs {runs['pool']} s); "
                f"before them, the workers' first load (once a worker): {times['warming'][0]:.1f} s",
                flush=True,
            )
        print(
            f"\n{'workers':>7} {'ours MB/s':>10} {'speedup':>8} {'of linear':>9} {'pool MB/s':>10} {'speedup':>8} "
            f"{'of linear':>9} {'ours/pool':>9}"
        )
        for n, rates in best.items():
            ours, pool = rates["ours"] / best[1]["ours"], rates["pool"] / best[1]["pool"]
            print(
                f"{n:7d} {rates['ours']:10.1f} {ours:8.2f} {ours / n:9.2f} {rates['pool']:10.1f} {pool:8.2f} "
                f"{pool / n:9.2f} {rates['ours'] / rates['pool']:9.2f}"
            )
        linear = best[most]["ours"] / best[1]["ours"] / most
        print(
            f"ours at {most} workers: {linear:.2f} of linear (goal >= 0.8: {'met' if linear >= 0.8 else 'NOT met'}); "
            f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other work counts)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
