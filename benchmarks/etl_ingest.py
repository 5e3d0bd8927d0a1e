"""Files tracked + claimed per second against DynamoDB Local: the ETL's bulk conditional writes vs per-file requests.

Both sides do the seed's per-file conditional semantics with 4 concurrent ingesters over the same files
(10% of the events delivered twice, to another ingester, as SQS may): track (``attribute_not_exists(file_key)``) and
claim
(``pending#N → manifested#N``).
- baseline: plain boto3, one conditional PutItem / UpdateItem per file keyed by its bare name (the seed Lambda's calls),
no manifests;
- ours: the ingest task bodies (validation; ``track_and_batch``: each full batch of new files created
  ``manifested#N`` in the transaction that creates its MANIFEST record, the rest ``pending#N``; claim-first
  batches, each claimed in one transaction with its record), then an orphan flush for the remainders.
Checks: zero double claims (every file in exactly one manifest). Goal: ≥ 250 files/s (seed: 3.9/s).

    .venv/bin/python benchmarks/etl_ingest.py           # 2,000 files (about 1-3 minutes)
    .venv/bin/python benchmarks/etl_ingest.py --quick   # 600 files (about 20 s)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["PIPELINES_USE_BLOCKS"] = "0"  # settings from defaults + env, no Prefect API needed
os.environ.update(ETL_EXPECTED_FILE_SIZE_MB="0.001", ETL_SIZE_TOLERANCE_PERCENT="99")

from deployments import dynamodb_keys, dynamodb_local

DATES = ["2026-01-01", "2026-01-02", "2026-01-03"]
WORKERS = 4


def make_files(root: Path, count: int) -> list[str]:
    from tasks.etl import keys

    urls = []
    for i in range(count):
        path = root / keys.input_key(DATES[i % len(DATES)], f"bench-{i:06d}.ndjson")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"i": i, "pad": "x" * 40}) + "\n")
        urls.append(path.as_uri())
    return urls


def use_tables(suffix: str) -> dict[str, str]:
    from blocks.base import clear_cache
    from tasks.core import state_store
    from tasks.core.registry import default_table_names

    names = {
        logical: f"{physical}-{suffix}"
        for logical, physical in default_table_names("bench").items()
        if logical.startswith("etl_")
    }
    for logical, physical in names.items():
        os.environ[f"TABLE_{logical.upper()}"] = physical
    clear_cache()
    state_store.reset_clients()
    from tasks.core.registry import table_specs
    from tasks.core.tables import ensure_table

    for logical, physical in names.items():
        ensure_table(physical, table_specs()[logical])
    return names


REDELIVERED = 0.1


def deliveries(urls: list[str]) -> list[list[str]]:
    """Each worker gets its quarter plus a slice of the next worker's quarter again (redelivered events)."""
    quarters = [urls[q::WORKERS] for q in range(WORKERS)]
    again = int(len(quarters[0]) * REDELIVERED)
    return [quarters[q] + quarters[(q + 1) % WORKERS][-again:] for q in range(WORKERS)]


def run_baseline(urls: list[str]) -> dict:
    """Per-file single conditional requests with plain boto3, as the seed's Lambda makes them: a stat of the file,
    ``put_item`` if absent, then a guarded ``update_item`` claim, keyed by the bare file name (the seed's key)."""
    from urllib.parse import urlsplit

    import boto3
    from botocore.config import Config

    client = boto3.client("dynamodb", config=Config(max_pool_connections=WORKERS * 2))
    table = os.environ["TABLE_ETL_FILE_TRACKING"]
    shards = int(os.environ.get("ETL_NUM_STATUS_SHARDS", "10"))

    def worker(batch: list[str]) -> int:
        won = 0
        keyed = []
        for url in batch:
            path = Path(urlsplit(url).path)
            date, name = path.parent.name, path.name
            shard = int(hashlib.md5(name.encode()).hexdigest(), 16) % shards
            keyed.append((date, name, shard))
            try:
                client.put_item(
                    TableName=table,
                    ConditionExpression="attribute_not_exists(file_key)",
                    Item={
                        "date_prefix": {"S": date},
                        "file_key": {"S": name},
                        "status": {"S": f"pending#{shard}"},
                        "file_size": {"N": str(path.stat().st_size)},
                        "file_path": {"S": url},
                    },
                )
            except client.exceptions.ConditionalCheckFailedException:
                pass
        for date, name, shard in keyed:
            try:
                client.update_item(
                    TableName=table,
                    Key={"date_prefix": {"S": date}, "file_key": {"S": name}},
                    ConditionExpression="#s = :pending",
                    UpdateExpression="SET #s = :manifested, manifest_path = :m",
                    ExpressionAttributeNames={"#s": "status"},
                    ExpressionAttributeValues={
                        ":pending": {"S": f"pending#{shard}"},
                        ":manifested": {"S": f"manifested#{shard}"},
                        ":m": {"S": "baseline"},
                    },
                )
                won += 1
            except client.exceptions.ConditionalCheckFailedException:
                pass
        return won

    with ThreadPoolExecutor(WORKERS) as pool:
        won = sum(pool.map(worker, deliveries(urls)))
    return {"claimed": won}


def run_ours(urls: list[str], today: str) -> dict:
    from tasks.etl import ingest as etl

    config = etl.settings()

    def worker(batch: list[str]) -> int:
        checks = etl.validate_files(batch, config)
        tracked = etl.track_and_batch([c for c in checks if c.valid], config)
        return len(tracked["manifests"]) + sum(
            len(etl.create_manifests(d, config.max_files_per_manifest, config, prefer=tracked["new_files"].get(d, [])))
            for d in tracked["dates"]
        )

    with ThreadPoolExecutor(WORKERS) as pool:
        manifests = sum(pool.map(worker, deliveries(urls)))
    for date_prefix in etl.orphan_dates(config, today):  # remainders: the flush's partial batches
        manifests += len(etl.create_manifests(date_prefix, config.min_files_for_partial_batch, config, partial=True))
    return {"manifests": manifests}


def check_exactly_once(root: Path, urls: list[str]) -> int:
    """Files listed in more than one manifest (0 expected) after asserting every file is listed."""
    from tasks.etl import ingest as etl

    listed = []
    for path in (root / "objects" / "manifests").rglob("*.json"):
        listed += json.loads(path.read_text())["fileLocations"][0]["URIPrefixes"]
    missing = set(urls) - set(listed)
    pending = [i for d in DATES for i in etl.file_records(d) if etl.base_status(i) != etl.MANIFESTED]
    if missing or pending:
        raise SystemExit(f"FAILED: {len(missing)} files in no manifest, {len(pending)} files not manifested")
    return len(listed) - len(set(listed))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="600 files")
    parser.add_argument("--files", type=int)
    parser.add_argument("--max-files-per-manifest", type=int, default=10)
    parser.add_argument("--redelivered", type=float, default=0.1, help="fraction of events delivered twice")
    args = parser.parse_args()
    global REDELIVERED
    REDELIVERED = args.redelivered
    count = args.files or (600 if args.quick else 2000)
    os.environ["ETL_MAX_FILES_PER_MANIFEST"] = str(args.max_files_per_manifest)
    work = Path(tempfile.mkdtemp(prefix="etl-ingest-bench-"))
    port = dynamodb_local.free_port()
    dynamodb_keys.use_fresh_key()  # its own DynamoDB Local's key
    process = dynamodb_local.start_private(port, db_path=None, log_path=work / "dynamodb.log")
    os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = f"http://127.0.0.1:{port}"
    try:
        urls = make_files(work / "in", count)
        print(
            f"{count} files on {len(DATES)} dates, {WORKERS} concurrent ingesters, {REDELIVERED:.0%} of events "
            "delivered twice, "
            f"{args.max_files_per_manifest} files per manifest, DynamoDB Local on :{port}"
        )
        rates = {}
        for name in ("baseline", "ours"):
            use_tables(uuid.uuid4().hex[:8])
            os.environ["OBJECT_STORE_BASE_URL"] = (work / "objects").as_uri()
            start = time.perf_counter()
            result = run_baseline(urls) if name == "baseline" else run_ours(urls, "2026-02-01")
            elapsed = time.perf_counter() - start
            rates[name] = count / elapsed
            print(f"  {name:8s}: {elapsed:6.1f} s, {rates[name]:7.1f} files/s tracked+claimed  {result}")
            if name == "baseline" and result["claimed"] != count:
                raise SystemExit(f"FAILED: baseline claimed {result['claimed']} of {count}")
        doubles = check_exactly_once(work, urls)
        print(f"double claims: {doubles} (every one of {count} files in exactly one manifest)")
        ratio = rates["ours"] / rates["baseline"]
        print(
            f"RATIO ours/baseline = {ratio:.2f}; ours {rates['ours']:.0f} files/s, goal >= 250: "
            f"{'met' if rates['ours'] >= 250 else 'NOT met'} (seed target 3.9/s)"
        )
        return 1 if doubles else 0
    finally:
        dynamodb_local.stop(process)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
