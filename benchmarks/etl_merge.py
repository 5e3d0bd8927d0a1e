"""Merge throughput (MB/s of NDJSON in) of the ETL's merge vs raw pyarrow and Spark local[2] on the same files.

Baselines, same files, same run: ``pyarrow.json.read_json`` + ``pyarrow.parquet.write_table`` per file (no
string casting, no metadata columns, no rejects handling); and, when pyspark is installed (the ``bench``
extra; Java 17), Spark local[2] doing the merge's job (read the NDJSON, every column to string with nested ones
as JSON, the two metadata columns, Snappy Parquet), timed on a warm JVM. Ours: ``merge_manifest`` (every value
as written, ``_processing_timestamp``/``_source_file``, Snappy, ~128 MB parts, rejects, staged then published).
Goals: ours/pyarrow ≥ 0.7, ours/spark ≥ 2.

    .venv/bin/python benchmarks/etl_merge.py            # ~200 MB, 3 repeats (about 2 minutes)
    .venv/bin/python benchmarks/etl_merge.py --quick    # ~30 MB, 2 repeats (about 20 s)
    .venv/bin/python benchmarks/etl_merge.py --nested   # records with a nested object and a list too
    .venv/bin/python benchmarks/etl_merge.py --flow     # also the ndjson-merge flow (Prefect + DynamoDB Local):
                                                        # its orchestration share (goal <= 5%)
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow.json as pajson  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from tasks.etl import merge as etl_merge
from tasks.core import keys

DATE = "2026-01-01"


def make_files(root: Path, files: int, mb_each: float, nested: bool) -> list[str]:
    """NDJSON files of about ``mb_each`` MB under pipeline/input/{DATE}/ with a realistic mix of types."""
    rng = random.Random(7)
    urls = []
    for f in range(files):
        path = root / keys.input_key(DATE, f"bench-{f:04d}.ndjson")
        path.parent.mkdir(parents=True, exist_ok=True)
        lines, size, i = [], 0, 0
        while size < mb_each * 1024 * 1024:
            record = {
                "event_id": f * 10_000_000 + i, "user": f"user-{rng.randrange(100000)}", "amount": round(rng.random() * 1000, 2),
                "flag": rng.random() < 0.5, "country": rng.choice(["FR", "DE", "US", "JP", "BR"]),
                "event_time": f"2026-01-01T{rng.randrange(24):02d}:{rng.randrange(60):02d}:00Z", "note": None,
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


def baseline(urls: list[str], out: Path) -> None:
    for n, url in enumerate(urls):
        pq.write_table(pajson.read_json(url[len("file://"):]), out / f"raw-{n:04d}.parquet")


class Spark:
    """A warm local[2] Spark session doing the merge's job (None when pyspark is not installed)."""

    def __init__(self):
        from pyspark.sql import SparkSession

        self.session = (SparkSession.builder.master("local[2]").appName("etl-merge-bench")
                        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
                        .config("spark.driver.memory", "2g").getOrCreate())
        self.session.sparkContext.setLogLevel("ERROR")

    def run(self, urls: list[str], out: Path) -> None:
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, MapType, StringType, StructType

        frame = self.session.read.json([u[len("file://"):] for u in urls], mode="PERMISSIVE")
        columns = [
            (F.to_json(F.col(f"`{f.name}`")) if isinstance(f.dataType, (StructType, ArrayType, MapType))
             else F.col(f"`{f.name}`").cast(StringType())).alias(f.name)
            for f in frame.schema.fields
        ]
        frame = frame.select(*columns).withColumn("_processing_timestamp", F.lit(time.strftime("%Y-%m-%dT%H:%M:%SZ"))) \
            .withColumn("_source_file", F.input_file_name())
        frame.write.mode("overwrite").option("compression", "snappy").parquet(str(out / "spark"))

    def stop(self) -> None:
        self.session.stop()


def start_spark() -> Spark | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("  (pyspark not installed: no Spark baseline; `pip install -e '.[bench]'`)")
        return None
    return Spark()


def ours(urls: list[str], out: Path) -> dict:
    return etl_merge.merge_manifest(DATE, "batch-0001-20260101-000000.json", urls, out.as_uri(), target_file_mb=128)


def flow_share(urls: list[str], files_root: Path, mb_each: float, work: Path, runs: int = 3) -> None:
    """Issue 16 goal 4: the ``ndjson-merge`` flow (ephemeral Prefect server, DynamoDB Local) against its merge alone.

    ``runs`` manifests of the same files (copies under other names): the first flow run of a process pays for
    loading the flow and its tasks once, so the share is taken from the median of the others.
    """
    import os
    import uuid

    from prefect.testing.utilities import prefect_test_harness

    from _common import dynamodb_local, ensure_table
    from tasks.core import state_store
    from tasks.core.tables import TABLE_SPECS, default_names

    batches = [urls] + [[_copy_as(url, f"-copy{r}") for url in urls] for r in range(1, runs)]
    with dynamodb_local():
        suffix = uuid.uuid4().hex[:6]
        names = {logical: f"{name}-bench-{suffix}" for logical, name in default_names("bench").items()}
        for logical in TABLE_SPECS:
            os.environ[f"TABLE_{logical.upper()}"] = names[logical]
        for logical in ("etl_file_tracking", "etl_metrics"):
            ensure_table(names[logical], TABLE_SPECS[logical])
        os.environ.update({
            "OBJECT_STORE_BASE_URL": files_root.as_uri(), "PIPELINES_USE_BLOCKS": "0",
            "EXPECTED_FILE_SIZE_MB": str(mb_each), "SIZE_TOLERANCE_PERCENT": "99",
            "MAX_FILES_PER_MANIFEST": str(len(urls)), "MIN_FILES_FOR_PARTIAL_BATCH": "1",
        })
        os.environ.pop("NOTIFY_BLOCK", None)
        with prefect_test_harness(server_startup_timeout=180):
            from flows.etl import ndjson_ingest, ndjson_merge

            manifests = []
            for batch in batches:  # one manifest each, tracked and left pending
                manifests += ndjson_ingest(file_urls=batch, merge_deployment="ndjson-merge/not-deployed")["manifests"]
            alone, flows = [], []
            for r, manifest in enumerate(manifests):  # interleaved: the merge alone (to another output), the flow
                out = work / f"alone-{r}"
                out.mkdir()
                start = time.perf_counter()
                etl_merge.merge_manifest(DATE, manifest, batches[r], out.as_uri(), target_file_mb=128)
                alone.append(time.perf_counter() - start)
                shutil.rmtree(out)
                start = time.perf_counter()
                summary = ndjson_merge(date_prefix=DATE, manifest_name=manifest)
                flows.append(time.perf_counter() - start)
                assert summary["files_completed"] == len(urls), summary
    merge_s, flow_s = statistics.median(alone[1:]), statistics.median(flows[1:])
    print(f"ndjson-merge flow (MANIFEST and {len(urls)} file records, six tasks, metric): {flow_s:.2f} s for "
          f"{summary['rows']} rows; the merge alone {merge_s:.2f} s (flow runs {', '.join(f'{t:.2f}' for t in flows)}; "
          f"merges alone {', '.join(f'{t:.2f}' for t in alone)}; the first of each is left out)")
    print(f"orchestration + bookkeeping share of the flow's wall time: {(1 - merge_s / flow_s) * 100:.1f}% (goal <= 5%); "
          f"fixed cost {flow_s - merge_s:.2f} s a manifest")


def _copy_as(url: str, suffix: str) -> str:
    """A copy of a local input file next to it, its name ending in ``suffix``."""
    source = Path(url[len("file://"):])
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
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark baseline even when pyspark is installed")
    parser.add_argument("--flow", action="store_true", help="also the ndjson-merge flow's orchestration share")
    args = parser.parse_args()
    files = args.files or (3 if args.quick else 20)
    repeats = args.repeats or (2 if args.quick else 3)
    work = Path(tempfile.mkdtemp(prefix="etl-merge-bench-"))
    try:
        urls = make_files(work / "in", files, args.mb_each, args.nested)
        mb = sum(Path(u[7:]).stat().st_size for u in urls) / 1024 / 1024
        print(f"{files} NDJSON files, {mb:.1f} MB{' (nested values)' if args.nested else ''}; {repeats} repeats, interleaved")
        spark = None if args.no_spark else start_spark()
        names = ["baseline", "ours"] + (["spark"] if spark else [])
        if spark:  # warm the JVM (class loading, JIT) on one file
            spark.run(urls[:1], work)
            shutil.rmtree(work / "spark")
        ours(urls[:1], work / "warm")  # and ours: Numba loads its compiled merge kernels once per process
        shutil.rmtree(work / "warm")
        times = {name: [] for name in names}
        rows = None
        for r in range(repeats):
            for name in names if r % 2 == 0 else names[::-1]:
                out = work / f"out-{name}-{r}"
                out.mkdir()
                start = time.perf_counter()
                if name == "baseline":
                    baseline(urls, out)
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
        print(f"rows merged per run: {rows}")
        print(f"RATIO ours/baseline = {ratio:.2f} (per-repeat {min(ratios):.2f}-{max(ratios):.2f}); goal >= 0.7: "
              f"{'met' if ratio >= 0.7 else 'NOT met'}")
        if "spark" in rates:
            spark_ratio = statistics.median(rates["ours"]) / statistics.median(rates["spark"])
            print(f"RATIO ours/spark = {spark_ratio:.2f}; goal >= 2: {'met' if spark_ratio >= 2 else 'NOT met'}")
        if args.flow:
            flow_share(urls, work / "in", args.mb_each, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
