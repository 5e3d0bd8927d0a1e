"""A backup mid-feed restores on "another machine": a stack (`local_stack up` in a data folder of its own on free
ports) fed ETL files and records messages, `pipelines backup` while files are in flight, more files landing after it;
then `pipelines restore` into a fresh data folder, `up` there, the files that landed after the backup re-landed into
the restored store. Every record of the backup is back, and the whole feed completes once: each ETL file merged once
(in one manifest, its lines once in the date's Parquet), every granule written, nothing offered twice."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from benchmarks.server_load import stack
from deployments import dynamodb_local
from tests.helpers.crashpoints import REPO_ROOT
from tests.helpers.landing import record_messages

pytestmark = pytest.mark.sweep  # two whole stacks, one after the other: ~10 minutes

BEFORE, AFTER = 24, 12  # ETL files landed before the backup (some still in flight at it) and after it
LINES = 1200  # ~150 KB: inside the ETL's accepted sizes


def _stack_env(data: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(REPO_ROOT),
        "PIPELINES_DATA_DIR": str(data),
        "DYNAMODB_LOCAL_PORT": str(dynamodb_local.free_port()),
        "PREFECT_SERVER_PORT": str(dynamodb_local.free_port()),
        "PREFECT_POSTGRES_PORT": str(dynamodb_local.free_port()),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


def _client_env(env: dict[str, str]) -> dict[str, str]:
    """The stack's own environment (its local.env, as `make up` writes it) over ``env``."""
    exported = Path(env["PIPELINES_DATA_DIR"]) / "local.env"
    lines = exported.read_text().splitlines()
    return {**env, **dict(line.removeprefix("export ").split("=", 1) for line in lines)}


def _python(env: dict[str, str], code: str, timeout: float = 300) -> dict:
    """Run ``code`` (which prints one JSON value last) as a client of the stack in ``env``; the value."""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _cli(env: dict[str, str], *args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "deployments.cli", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(result.stdout)


def _etl_files(objects: Path, date: str, names: list[str]) -> None:
    from deployments.samples import etl as etl_sample
    from tasks.etl import keys as etl_keys

    body = ("\n".join(etl_sample._records(random.Random(7), LINES)) + "\n").encode()
    for name in names:
        path = objects / etl_keys.input_key(date, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{name}.part")
        staged.write_bytes(body)
        os.rename(staged, path)  # whole, as an upload lands


def _records_file(objects: Path, name: str, first: int) -> None:
    from tasks.records import keys as records_keys

    path = objects / f"{records_keys.RECORDS_INCOMING_PREFIX}{name}"
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{name}.part")
    staged.write_text(json.dumps(record_messages(first, 5)))
    os.rename(staged, path)


CHECK = """
import json, os, sys
from tasks.core import config, state_store
from tasks.etl import ingest as etl
date, names, granules = json.loads(os.environ["CHECK_ARGS"])
files = state_store.get_many(config.table_name(etl.TRACKING), [{"date_prefix": date, "file_key": n} for n in names])
found = state_store.get_many(config.table_name("granules"), [{"granuleId": g} for g in granules])
statuses = {i["file_key"]: etl.base_status(i) for i in files}
print(json.dumps({"etl": statuses, "granules": sorted(i["granuleId"] for i in found)}))
"""

FLUSH = """
import json
from prefect.deployments import run_deployment
print(json.dumps(str(run_deployment("ndjson-flush-orphans/local", timeout=0).id)))
"""


def _wait(env: dict[str, str], args: list, done, seconds: float) -> dict:
    deadline, seen = time.monotonic() + seconds, {}
    while time.monotonic() < deadline:
        seen = _python({**env, "CHECK_ARGS": json.dumps(args)}, CHECK)
        if done(seen):
            return seen
        time.sleep(10)
    return seen


def _backup_keys(backup: Path) -> dict[str, set[str]]:
    """Each table of the backup -> its items' keys (as JSON)."""
    keys = {}
    for folder in (backup / "dynamodb").iterdir():
        schema = json.loads((folder / "table.json").read_text())["create"]["KeySchema"]
        names = [k["AttributeName"] for k in schema]
        keys[folder.name] = set()
        for entry in (folder / "manifest-files.json").read_text().splitlines():
            data = gzip.decompress((folder / json.loads(entry)["dataFileS3Key"]).read_bytes()).decode()
            for line in data.splitlines():
                item = json.loads(line)["Item"]
                keys[folder.name].add(json.dumps({n: item[n] for n in names}, sort_keys=True))
    return keys


KEYS = """
import boto3, json, os
client = boto3.client("dynamodb")
out = {}
for table in json.loads(os.environ["CHECK_TABLES"]):
    schema = [k["AttributeName"] for k in client.describe_table(TableName=table)["Table"]["KeySchema"]]
    out[table] = [json.dumps({n: i[n] for n in schema}, sort_keys=True)
                  for page in client.get_paginator("scan").paginate(TableName=table) for i in page["Items"]]
print(json.dumps(out))
"""


def _etl_merged_once(objects: Path, date: str, names: list[str]) -> tuple[int, int]:
    """(files listed in two manifests or more, rows in the date's merged Parquet)."""
    import collections

    import pyarrow.parquet as pq

    from tasks.etl import keys as etl_keys

    listed = collections.Counter()
    for path in (objects / etl_keys.manifest_key(date, "x")).parent.glob("*.json"):
        for url in json.loads(path.read_text())["fileLocations"][0]["URIPrefixes"]:
            listed[url.rsplit("/", 1)[-1]] += 1
    rows = sum(
        pq.read_metadata(part).num_rows
        for part in (objects / etl_keys.merged_output_prefix(date)).parent.glob("**/*.parquet")
    )
    return sum(1 for n in names if listed[n] > 1), rows


@pytest.mark.timeout(2400)
def test_a_backup_taken_mid_feed_restores_into_a_fresh_folder_and_the_feed_completes_once():
    from datetime import UTC, datetime, timedelta

    folder = Path(tempfile.mkdtemp(prefix="backup-restore-"))
    folder.chmod(0o755)  # the `postgres` user (as root) reaches its cluster's folder
    first, second = _stack_env(folder / "a"), _stack_env(folder / "b")
    date = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")  # the flush closes its partial batch
    before = [f"bk-{i:03d}.ndjson" for i in range(BEFORE)]
    after = [f"bk-{i:03d}.ndjson" for i in range(BEFORE, BEFORE + AFTER)]
    granules_before = [f"LAND.G{i:03d}" for i in range(10)]
    granules_after = [f"LAND.G{i:03d}" for i in range(10, 15)]
    objects_a, objects_b = folder / "a" / "objects", folder / "b" / "objects"
    kept = False
    try:
        stack("up", first)
        client_a = _client_env(first)
        _records_file(objects_a, "bk-records-0.json", 0)
        _etl_files(objects_a, date, before[: BEFORE // 2])
        _records_file(objects_a, "bk-records-1.json", 5)
        _wait(client_a, [date, before[:10], granules_before], lambda s: len(s["etl"]) >= 10, 300)
        _etl_files(objects_a, date, before[BEFORE // 2 :])  # in flight when the backup begins
        summary = _cli(first, "backup", str(folder / "backup"))
        _etl_files(objects_a, date, after)  # landed after the backup: the restored stack never saw them
        _records_file(objects_a, "bk-records-2.json", 10)
        assert summary["tables"] and summary["objects"] > 0
        data_bytes = sum(p.stat().st_size for p in (folder / "a").rglob("*") if p.is_file() and not p.is_symlink())
        print(f"\nbackup: {json.dumps(summary)}; the data folder: {data_bytes / 2**20:.1f} MiB")
        stack("down", first)

        # another machine: a fresh data folder on other ports
        restored = _cli(second, "restore", str(folder / "backup"))
        assert restored["tables"] == summary["tables"]
        stack("up", second)
        client_b = _client_env(second)

        # every record of the backup is back (their statuses may move on since)
        saved = _backup_keys(folder / "backup")
        back = _python({**client_b, "CHECK_TABLES": json.dumps(sorted(saved))}, KEYS)
        for table, keys in saved.items():
            assert keys <= set(back[table]), f"{table}: {len(keys - set(back[table]))} record(s) of the backup lost"

        # the feed's remainder, re-landed into the restored store, and the earlier day's last partial batch closed
        _etl_files(objects_b, date, after)
        _records_file(objects_b, "bk-records-2.json", 10)
        everything = [date, before + after, granules_before + granules_after]
        _wait(client_b, everything, lambda s: len(s["etl"]) == BEFORE + AFTER, 300)
        _python(client_b, FLUSH)
        seen = _wait(
            client_b,
            everything,
            lambda s: set(s["etl"].values()) == {"completed"} and len(s["granules"]) == 15,
            600,
        )
        assert seen["etl"] == {name: "completed" for name in before + after}, seen["etl"]
        assert seen["granules"] == sorted(granules_before + granules_after)
        doubles, rows = _etl_merged_once(objects_b, date, before + after)
        assert (doubles, rows) == (0, LINES * (BEFORE + AFTER))
    except BaseException:
        kept = True  # the stacks' logs and data, for the failure's reader
        print(f"kept for inspection: {folder}")
        raise
    finally:
        for env in (first, second):
            try:
                stack("down", env)
            except Exception as error:  # noqa: BLE001 - a stack that never came up has nothing to stop
                print(f"down: {error}")
        if not kept:
            shutil.rmtree(folder, ignore_errors=True)
