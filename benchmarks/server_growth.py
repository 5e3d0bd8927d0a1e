"""What each landed file costs the Prefect server: rows written and database bytes, per table, on SQLite.

A real ``prefect server start`` (its own SQLite file, `make up`'s retention settings) and DynamoDB Local; the
ETL listener (``ndjson-listen``, as its deployment runs it: a flow run, its task run per micro-batch, its logs and
events; merges announced by ``manifest.ready`` to an unserved deployment, so no merge runs) takes ``--files`` files
landing at ``--files-per-second`` (the seed's 3.9 by default). Afterwards: rows added to each server table and the
database's bytes in use (pages not free, WAL checkpointed), each divided by the files landed; and the figure per
day at that rate, which retention (3 days of ended runs and events) multiplies by at most 3 at steady state.
The baseline is the same run of the code in ``--before`` (a checkout of an older commit), same machine, same run.

    .venv/bin/python benchmarks/server_growth.py [--files 300] [--files-per-second 3.9] [--before DIR] [--json]
    .venv/bin/python benchmarks/server_growth.py --quick     # 40 files (make test-sweep); exit 1 if nothing was
    measured
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import landing as landing_bench
from benchmarks._common import dynamodb_local
from deployments.local_stack import server_retention_env, throwaway_prefect_server

REPO_ROOT = Path(__file__).resolve().parents[1]
TABLES = ("events", "event_resources", "log", "task_run", "task_run_state", "flow_run", "flow_run_state")
LISTENER = """
import sys
sys.path.insert(0, sys.argv[1])
from flows.etl import ndjson_listen
ndjson_listen(merge_deployment="ndjson-merge/bench", idle_exit_seconds=float(sys.argv[2]), max_runtime_seconds=3600)
"""


def database_usage(db: Path) -> dict[str, int]:
    """Rows in each of ``TABLES``, the bytes each uses with its indexes (``bytes:TABLE``) and the bytes the database
    uses (its pages less the free ones, WAL checkpointed)."""
    with sqlite3.connect(db, timeout=60) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        usage = {table: connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in TABLES}
        sizes = connection.execute(
            "SELECT m.tbl_name, SUM(d.pgsize) FROM dbstat d JOIN sqlite_master m ON m.name = d.name GROUP BY m.tbl_name"
        ).fetchall()
        usage.update({f"bytes:{table}": size for table, size in sizes if table in TABLES})
        page_size, pages, free = (
            connection.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_size", "page_count", "freelist_count")
        )
    usage["bytes"] = (pages - free) * page_size
    return usage


def one_run(code: Path, files: int, per_second: float, workdir: Path) -> dict[str, float]:
    """Land ``files`` files through the listener of ``code`` on a fresh server; what the server grew by, per file."""
    home, root = workdir / "prefect", workdir / "objects"
    home.mkdir(parents=True)
    root.mkdir()
    with throwaway_prefect_server(home, server_retention_env()) as base:
        api = f"{base}/api"
        env = {
            **os.environ,
            "PREFECT_API_URL": api,
            "OBJECT_STORE_BASE_URL": root.as_uri(),
            "ETL_MAX_FILES_PER_MANIFEST": "10",
        }
        env.pop("PREFECT_API_KEY", None)
        setup = (
            "from prefect.client.orchestration import get_client\n"
            "with get_client(sync_client=True) as c: c.create_deployment(c.create_flow_from_name('ndjson-merge'), "
            "'bench')"
        )
        subprocess.run([sys.executable, "-c", setup], env=env, check=True, cwd=code)
        time.sleep(5)  # the server's own start-up writes settle
        before = database_usage(home / "prefect.db")
        idle = 15.0
        listener = subprocess.Popen(
            [sys.executable, "-c", LISTENER, str(code), str(idle)],
            env=env,
            cwd=code,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(10)  # its start: the flow run, the catch-up listing of an empty folder
        started = time.monotonic()
        for i in range(files):
            time.sleep(max(0.0, started + i / per_second - time.monotonic()))
            landing_bench.land(root, i)
        if listener.wait(timeout=files / per_second + 600) != 0:
            raise SystemExit(f"the listener of {code} exited with {listener.returncode}")
        time.sleep(10)  # the server files the last events and logs in the background
        after = database_usage(home / "prefect.db")
    return {name: (after[name] - before.get(name, 0)) / files for name in after}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--files-per-second", type=float, default=3.9)
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with (the baseline)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="40 files: checks the benchmark still measures something")
    args = parser.parse_args()
    if args.quick:
        args.files = min(args.files, 40)
    results = {}
    with dynamodb_local():
        for label, code in ([("before", args.before)] if args.before else []) + [("now", REPO_ROOT)]:
            workdir = Path(tempfile.mkdtemp(prefix=f"server-growth-{label}-"))
            try:
                landing_bench.use_tables(label)
                results[label] = one_run(code.resolve(), args.files, args.files_per_second, workdir)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
    per_day = 86400 * args.files_per_second
    for label, per_file in results.items():
        rows = ", ".join(
            f"{table} {per_file[table]:.2f} ({per_file.get('bytes:' + table, 0):,.0f} B)" for table in TABLES
        )
        print(
            f"{label:6}: {per_file['bytes']:,.0f} bytes per landed file ({per_file['bytes'] * per_day / 1e6:,.0f} "
            "MB a day at "
            f"{args.files_per_second} files/s); rows (bytes with indexes) per file: {rows}"
        )
    if "before" in results:
        before, now = results["before"], results["now"]
        print(
            f"ratio now/before: bytes {now['bytes'] / before['bytes']:.2f}, events "
            f"{now['events'] / max(before['events'], 1e-9):.2f}"
        )
    if args.json:
        print(json.dumps({"files": args.files, "files_per_second": args.files_per_second, **results}))
    # the listener's run and its landed-file events must show up: none means the benchmark misses the path
    broken = [label for label, per_file in results.items() if per_file["events"] <= 0 or per_file["flow_run"] <= 0]
    if broken:
        print(f"WRONG: no listener run or no events recorded for {broken}")
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
