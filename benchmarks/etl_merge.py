"""Merge throughput (MB/s of NDJSON in) of the ETL's merge vs raw pyarrow and Spark local[2] on the same files.

Baselines, same files, same run: ``pyarrow.json.read_json`` + ``pyarrow.parquet.write_table`` per file (no
string casting, no metadata columns, no rejects handling); and, when pyspark is installed (the ``bench``
extra; Java 17), Spark local[2] doing the merge's job (read the NDJSON, every column to string with nested ones
as JSON, the two metadata columns, Snappy Parquet), timed on a warm JVM. Ours: ``merge_manifest`` (every value
as written, ``_processing_timestamp``/``_source_file``, Snappy, ~128 MB parts, rejects, staged then published).
Goals: ours/pyarrow ≥ 0.7, ours/spark ≥ 2. Then the ``ndjson-merge`` flow (ephemeral Prefect server, DynamoDB
Local): its fixed cost a manifest (flow wall − its merge alone, on manifests of 5 tiny files; goal ≤ 0.1 s) and
what that makes of a 128 MB manifest merged at this run's speed (orchestration share, goal ≤ 5%).

    .venv/bin/python benchmarks/etl_merge.py            # ~200 MB, 3 repeats (about 2 minutes)
    .venv/bin/python benchmarks/etl_merge.py --quick    # ~30 MB, 2 repeats (about a minute with the flow's cost)
    .venv/bin/python benchmarks/etl_merge.py --nested   # records with a nested object and a list too
    .venv/bin/python benchmarks/etl_merge.py --flow     # also the flow on a 128 MB manifest: its share measured
    .venv/bin/python benchmarks/etl_merge.py --no-flow  # the merge ratios only (no Prefect server)
    .venv/bin/python benchmarks/etl_merge.py --drain 30 # one warm run draining 30 pending manifests of small files
    .venv/bin/python benchmarks/etl_merge.py --drain 30 --profile drain.prof  # the same under cProfile
    .venv/bin/python benchmarks/etl_merge.py --drain 30 --parts-before 1000  # a date hours into the seed's rate
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from tasks.etl import keys
from tasks.etl import merge as etl_merge
from tasks.etl.merge import PROCESSING_TIMESTAMP, SOURCE_FILE

DATE = "2026-01-01"
SHARE_MB = 128  # the manifest size the orchestration share goal is stated for


def make_files(root: Path, files: int, mb_each: float, nested: bool, stem: str = "bench") -> list[str]:
    """NDJSON files of about ``mb_each`` MB under pipeline/input/{DATE}/ with a realistic mix of types."""
    rng = random.Random(7)
    urls = []
    for f in range(files):
        path = root / keys.input_key(DATE, f"{stem}-{f:04d}.ndjson")
        path.parent.mkdir(parents=True, exist_ok=True)
        lines, size, i = [], 0, 0
        while size < mb_each * 1024 * 1024:
            record = {
                "event_id": f * 10_000_000 + i,
                "user": f"user-{rng.randrange(100000)}",
                "amount": round(rng.random() * 1000, 2),
                "flag": rng.random() < 0.5,
                "country": rng.choice(["FR", "DE", "US", "JP", "BR"]),
                "event_time": f"2026-01-01T{rng.randrange(24):02d}:{rng.randrange(60):02d}:00Z",
                "note": None,
            }
            if nested:
                record["device"] = {"os": rng.choice(["ios", "android"]), "version": rng.randrange(20)}
                record["tags"] = rng.sample(["a", "b", "c", "d"], 2)
            line = json.dumps(record)
            lines.append(line)
            size += len(line) + 1
            i += 1
        path.write_text("\n".join(lines) + "\n")
        urls.append(path.as_uri())
    return urls


def baseline(urls: list[str], out: Path) -> int:
    """pyarrow's JSON reader and Parquet writer per file; the rows written."""
    rows = 0
    for n, url in enumerate(urls):
        table = pajson.read_json(url[len("file://") :])
        pq.write_table(table, out / f"raw-{n:04d}.parquet")
        rows += table.num_rows
    return rows


class Spark:
    """A warm local[2] Spark session doing the merge's job (None when pyspark is not installed)."""

    def __init__(self):
        from pyspark.sql import SparkSession

        self.session = (
            SparkSession.builder.master("local[2]")
            .appName("etl-merge-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        self.session.sparkContext.setLogLevel("ERROR")

    def run(self, urls: list[str], out: Path) -> None:
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, MapType, StringType, StructType

        frame = self.session.read.json([u[len("file://") :] for u in urls], mode="PERMISSIVE")
        columns = [
            (
                F.to_json(F.col(f"`{f.name}`"))
                if isinstance(f.dataType, (StructType, ArrayType, MapType))
                else F.col(f"`{f.name}`").cast(StringType())
            ).alias(f.name)
            for f in frame.schema.fields
        ]
        frame = (
            frame.select(*columns)
            .withColumn("_processing_timestamp", F.lit(time.strftime("%Y-%m-%dT%H:%M:%SZ")))
            .withColumn("_source_file", F.input_file_name())
        )
        frame.write.mode("overwrite").option("compression", "snappy").parquet(str(out / "spark"))

    def stop(self) -> None:
        self.session.stop()


def start_spark() -> Spark | None:
    if importlib.util.find_spec("pyspark") is None:
        print("  (pyspark not installed: no Spark baseline; `pip install -e '.[bench]'`)")
        return None
    return Spark()


def ours(urls: list[str], out: Path) -> dict:
    return etl_merge.merge_manifest(DATE, "batch-0001-20260101-000000.json", urls, out.as_uri(), target_file_mb=128)


@contextlib.contextmanager
def merge_stack(files_root: Path):
    """Tables on DynamoDB Local, an ephemeral Prefect server and the ETL's settings for inputs under ``files_root``."""
    import os
    import uuid

    from _common import dynamodb_local, ensure_table
    from prefect.testing.utilities import prefect_test_harness

    from tasks.core.registry import default_table_names, table_specs

    with dynamodb_local():
        suffix = uuid.uuid4().hex[:6]
        names = {logical: f"{name}-bench-{suffix}" for logical, name in default_table_names("bench").items()}
        for logical in table_specs():
            os.environ[f"TABLE_{logical.upper()}"] = names[logical]
        for logical in ("etl_file_tracking", "etl_metrics"):
            ensure_table(names[logical], table_specs()[logical])
        os.environ.update(
            {
                "OBJECT_STORE_BASE_URL": files_root.as_uri(),
                "PIPELINES_USE_BLOCKS": "0",
                "ETL_SIZE_TOLERANCE_PERCENT": "99",
                "ETL_MIN_FILES_FOR_PARTIAL_BATCH": "1",
            }
        )
        os.environ.pop("ETL_NOTIFY_BLOCK", None)
        with prefect_test_harness(server_startup_timeout=180):
            yield


def flow_against_merge(batches: list[list[str]], work: Path) -> tuple[list[float], list[float], list[float]]:
    """Each batch made a manifest by ``ndjson-ingest``, then, interleaved: its merge alone (to another output),
    the ``ndjson-merge`` flow, and an empty flow (Prefect's own cost of a flow run); the three lists of seconds."""
    import os

    from prefect import flow

    from flows.etl import ndjson_ingest, ndjson_merge

    @flow(name="empty-flow")
    def empty_flow() -> None:
        """Nothing: a flow run's creation and its two state changes."""

    sizes = [Path(url[len("file://") :]).stat().st_size for url in batches[0]]
    os.environ.update(
        {
            "ETL_MAX_FILES_PER_MANIFEST": str(len(batches[0])),  # a batch is one full manifest
            "ETL_EXPECTED_FILE_SIZE_MB": str(statistics.mean(sizes) / 2**20),
        }
    )
    manifests = []
    for batch in batches:  # one manifest each, tracked and left pending
        manifests += ndjson_ingest(file_urls=batch, merge_deployment="ndjson-merge/not-deployed")["manifests"]
    alone, flows, empty = [], [], []
    for r, manifest in enumerate(manifests):
        out = work / f"alone-{r}"
        out.mkdir()
        start = time.perf_counter()
        etl_merge.merge_manifest(DATE, manifest, batches[r], out.as_uri(), target_file_mb=128)
        alone.append(time.perf_counter() - start)
        shutil.rmtree(out)
        start = time.perf_counter()
        summary = ndjson_merge(date_prefix=DATE, manifest_name=manifest)
        flows.append(time.perf_counter() - start)
        assert summary["files_completed"] == len(batches[r]), summary
        start = time.perf_counter()
        empty_flow()
        empty.append(time.perf_counter() - start)
    return alone, flows, empty


def fixed_cost(root: Path, work: Path, runs: int) -> dict[str, float]:
    """The flow's cost a manifest beyond its merge, on ``runs`` manifests of 5 tiny files (the first, which loads
    the flow's modules, left out): medians of flow − merge alone, and of an empty flow (Prefect's floor)."""
    batches = []
    for r in range(runs):
        batch = []
        for f in range(5):
            path = root / keys.input_key(DATE, f"tiny-{r:02d}-{f}.ndjson")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps({"id": f"{r}-{f}-{i}", "v": i}) + "\n" for i in range(20)))
            batch.append(path.as_uri())
        batches.append(batch)
    alone, flows, empty = flow_against_merge(batches, work)
    costs = [f - a for f, a in zip(flows[1:], alone[1:])]
    fixed, floor = statistics.median(costs), statistics.median(empty[1:])
    # a loaded machine only adds time (the ephemeral server's SQLite answers "database is locked" and the client
    # waits ~2 s), so the best run is shown too: what the work itself costs
    best, best_floor = min(costs), min(empty[1:])
    print(
        f"ndjson-merge fixed cost a manifest (flow − its merge, {runs - 1} manifests of 5 tiny files): median "
        f"{fixed:.3f} s, best {best:.3f} s (goal <= 0.1 s: {'met' if fixed <= 0.1 else 'NOT met'}); a Prefect flow "
        f"run itself (an empty flow): median {floor:.3f} s, best {best_floor:.3f} s; so the merge flow's own: median "
        f"{fixed - floor:.3f} s, best {best - best_floor:.3f} s (per run: {', '.join(f'{c:.2f}' for c in costs)})"
    )
    return {"fixed": fixed, "floor": floor}


def flow_share(urls: list[str], work: Path, runs: int = 3) -> None:
    """The ``ndjson-merge`` flow against its merge alone, on ``runs`` manifests of the same files (copies): the
    first flow run of a process pays for loading the flow and its tasks once, so the share is the others' median."""
    batches = [urls] + [[_copy_as(url, f"-copy{r}") for url in urls] for r in range(1, runs)]
    alone, flows, _ = flow_against_merge(batches, work)
    merge_s, flow_s = statistics.median(alone[1:]), statistics.median(flows[1:])
    print(
        f"ndjson-merge flow on a {sum(Path(u[7:]).stat().st_size for u in urls) / 2**20:.0f} MB manifest: "
        f"{flow_s:.2f} s; "
        f"the merge alone {merge_s:.2f} s (flow runs {', '.join(f'{t:.2f}' for t in flows)}; merges alone "
        f"{', '.join(f'{t:.2f}' for t in alone)}; the first of each left out)"
    )
    print(f"  measured orchestration share: {(1 - merge_s / flow_s) * 100:.1f}% (goal <= 5%)")


def earlier_parts(root: Path, parts: int) -> None:
    """``parts`` one-row Parquet parts already published in the date (as hours of earlier manifests leave them)."""
    table = pa.table({"id": ["0"], PROCESSING_TIMESTAMP: ["t"], SOURCE_FILE: ["f"]})
    for n in range(parts):
        path = root / keys.merged_part_key(DATE, f"batch-{n:04d}-20250101-000000.json", 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)


def drain(
    root: Path, manifests: int, files_each: int, kb_each: float, profile: str | None, parts_before: int = 0
) -> dict[str, float]:
    """One ``ndjson-merge`` run draining ``manifests`` pending manifests of ``files_each`` small files (as a warm
    run of the deployment does: ``more_manifests``), against plain pyarrow on the same files in the same run: the
    seconds a manifest of each, their ratio and the difference (the merge's fixed cost a manifest); with
    ``parts_before`` parts already published in the date (a date hours into the seed's rate)."""
    import cProfile
    import os
    import pstats

    from flows.etl import ndjson_ingest, ndjson_merge

    earlier_parts(root, parts_before)
    urls = make_files(root, (manifests + 1) * files_each, kb_each / 1024, nested=False, stem="drain")
    os.environ.update({"ETL_MAX_FILES_PER_MANIFEST": str(files_each), "ETL_EXPECTED_FILE_SIZE_MB": str(kb_each / 1024)})
    made = ndjson_ingest(file_urls=urls, merge_deployment="ndjson-merge/not-deployed")["manifests"]
    assert len(made) == manifests + 1, made
    ndjson_merge(date_prefix=DATE, manifest_name=made[0])  # loads the flow's modules: left out
    # the main thread's CPU, not the wall clock: what a loaded machine does not inflate
    profiler = cProfile.Profile(time.thread_time) if profile else None
    start, cpu_start = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    summary = ndjson_merge(date_prefix=DATE, manifest_name=made[1], more_manifests=manifests - 1, more_seconds=3600)
    if profiler:
        profiler.disable()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    merged = [m for m in summary["merged"] if m["status"] == etl_merge.COMPLETED]
    assert len(merged) == manifests, summary["merged"]
    out = root.parent / "drain-baseline"
    out.mkdir()
    start, cpu_start = time.perf_counter(), time.process_time()
    baseline(urls[files_each:], out)  # the same files: read and written by pyarrow, one Parquet file each
    plain, plain_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    shutil.rmtree(out)
    per, plain_per = wall / manifests, plain / manifests
    print(
        f"drain: one ndjson-merge run, {manifests} manifests of {files_each} files of {kb_each:.0f} KB "
        f"({parts_before} parts in the date before): {wall:.2f} s, "
        f"{per:.3f} s a manifest; plain pyarrow on the same files {plain_per:.3f} s a manifest; RATIO flow/pyarrow "
        f"{per / plain_per:.1f}; fixed cost a manifest (flow − pyarrow) {per - plain_per:.3f} s (goal <= 0.1 s: "
        f"{'met' if per - plain_per <= 0.1 else 'NOT met'})"
    )
    # CPU, which other work on a shared machine does not inflate: this process's (the flow, its tasks, the DynamoDB
    # and Prefect clients), not the server's nor DynamoDB Local's
    print(
        f"drain CPU of this process: {cpu / manifests * 1000:.0f} ms a manifest; pyarrow "
        f"{plain_cpu / manifests * 1000:.0f} ms; the flow's own CPU a manifest beyond pyarrow's "
        f"{(cpu - plain_cpu) / manifests * 1000:.0f} ms"
    )
    if profiler:
        profiler.dump_stats(profile)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    return {"per_manifest": per, "pyarrow": plain_per}


def _copy_as(url: str, suffix: str) -> str:
    """A copy of a local input file next to it, its name ending in ``suffix``."""
    source = Path(url[len("file://") :])
    target = source.with_name(source.stem + suffix + source.suffix)
    shutil.copyfile(source, target)
    return target.as_uri()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~30 MB, 2 repeats")
    parser.add_argument("--nested", action="store_true", help="add a nested object and a list to every record")
    parser.add_argument("--files", type=int)
    parser.add_argument("--mb-each", type=float, default=10)
    parser.add_argument("--repeats", type=int)
    parser.add_argument(
        "--no-spark", action="store_true", help="skip the Spark baseline even when pyspark is installed"
    )
    parser.add_argument("--manifests", type=int, help="small manifests for the fixed cost (the first is left out)")
    parser.add_argument(
        "--no-flow", action="store_true", help="skip the ndjson-merge flow's fixed cost (no Prefect server)"
    )
    parser.add_argument(
        "--flow",
        action="store_true",
        help="also run the flow on a 128 MB manifest of these files "
        "(3 runs) and measure its orchestration share directly",
    )
    parser.add_argument(
        "--drain", type=int, metavar="N", help="only: one warm run draining N pending manifests of small files"
    )
    parser.add_argument("--drain-files", type=int, default=10, help="files a drained manifest (default 10)")
    parser.add_argument("--drain-kb", type=float, default=150, help="KB a drained file (default 150)")
    parser.add_argument("--profile", metavar="FILE", help="with --drain: cProfile the draining run into FILE")
    parser.add_argument(
        "--parts-before", type=int, default=0, help="with --drain: parts already published in the date (default 0)"
    )
    args = parser.parse_args()
    if args.drain:
        work = Path(tempfile.mkdtemp(prefix="etl-merge-drain-"))
        try:
            with merge_stack(work / "in"):
                drain(work / "in", args.drain, args.drain_files, args.drain_kb, args.profile, args.parts_before)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    files = args.files or (3 if args.quick else 20)
    repeats = args.repeats or (2 if args.quick else 3)
    work = Path(tempfile.mkdtemp(prefix="etl-merge-bench-"))
    try:
        urls = make_files(work / "in", files, args.mb_each, args.nested)
        mb = sum(Path(u[7:]).stat().st_size for u in urls) / 1024 / 1024
        print(
            f"{files} NDJSON files, {mb:.1f} MB{' (nested values)' if args.nested else ''}; {repeats} repeats, "
            "interleaved"
        )
        spark = None if args.no_spark else start_spark()
        names = ["baseline", "ours"] + (["spark"] if spark else [])
        if spark:  # warm the JVM (class loading, JIT) on one file
            spark.run(urls[:1], work)
            shutil.rmtree(work / "spark")
        ours(urls[:1], work / "warm")  # and ours: Numba loads its compiled merge kernels once per process
        shutil.rmtree(work / "warm")
        times = {name: [] for name in names}
        rows, baseline_rows = None, None
        for r in range(repeats):
            for name in names if r % 2 == 0 else names[::-1]:
                out = work / f"out-{name}-{r}"
                out.mkdir()
                start = time.perf_counter()
                if name == "baseline":
                    baseline_rows = baseline(urls, out)
                elif name == "spark":
                    spark.run(urls, out)
                else:
                    summary = ours(urls, out)
                    rows = summary["rows"]
                times[name].append(time.perf_counter() - start)
                shutil.rmtree(out)
        if spark:
            spark.stop()
        rates = {name: [mb / t for t in ts] for name, ts in times.items()}
        for name, values in rates.items():
            print(f"  {name:8s}: {statistics.median(values):7.1f} MB/s (range {min(values):.1f}-{max(values):.1f})")
        ratio = statistics.median(rates["ours"]) / statistics.median(rates["baseline"])
        ratios = [o / b for o, b in zip(rates["ours"], rates["baseline"])]
        print(f"rows merged per run: {rows} (pyarrow read {baseline_rows})")
        if rows != baseline_rows:
            raise SystemExit(
                f"FAILED: the merge wrote {rows} rows where pyarrow read {baseline_rows} from the same files"
            )
        print(
            f"RATIO ours/baseline = {ratio:.2f} (per-repeat {min(ratios):.2f}-{max(ratios):.2f}); goal >= 0.7: "
            f"{'met' if ratio >= 0.7 else 'NOT met'}"
        )
        if "spark" in rates:
            spark_ratio = statistics.median(rates["ours"]) / statistics.median(rates["spark"])
            print(f"RATIO ours/spark = {spark_ratio:.2f}; goal >= 2: {'met' if spark_ratio >= 2 else 'NOT met'}")
        if not args.no_flow:
            with merge_stack(work / "in"):
                cost = fixed_cost(work / "in", work, runs=args.manifests or (4 if args.quick else 8))
                merge_s = SHARE_MB / statistics.median(rates["ours"])  # this run's merge speed
                share = cost["fixed"] / (cost["fixed"] + merge_s)
                print(
                    f"orchestration share of a {SHARE_MB} MB manifest (flow wall − merge, over flow wall; the merge at "
                    f"this run's {statistics.median(rates['ours']):.1f} MB/s: {merge_s:.2f} s): {share * 100:.1f}% "
                    f"(goal <= 5%: {'met' if share <= 0.05 else 'NOT met'}); without Prefect's own flow run "
                    f"{(cost['fixed'] - cost['floor']) / (cost['fixed'] + merge_s) * 100:.1f}%"
                )
                if args.quick:  # the drain mode too, small, so it cannot rot
                    drain(work / "in", 3, 5, 20, None)
                if args.flow:
                    sized = [
                        u
                        for n, u in enumerate(urls)
                        if sum(Path(v[7:]).stat().st_size for v in urls[:n]) < SHARE_MB * 2**20
                    ]
                    flow_share(sized, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
