"""The Prefect server under load, on SQLite (``PREFECT_SERVER_DB=sqlite``) and on PostgreSQL (make up's default
where installed).

    .venv/bin/python benchmarks/server_load.py [--per-pipeline 2] [--databases sqlite,postgres] [--timeout 900]
    [--quick]

For each database: a whole local stack of its own (``deployments.local_stack up`` in a temporary data folder, on
free loopback ports: DynamoDB Local, the Prefect server, the process worker, every deployment and its schedules),
then ``--per-pipeline`` concurrent runs of each of the five pipelines (the demo's samples) started at once, plus
what they start (merges, reassembly) and the schedules. It waits for every run to end, then reports the server's
errors (its log: "database is locked", ERROR lines) and the runs' final states, and stops the stack.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deployments.dynamodb_local import free_port  # run as a script: after the repository root is on the path

# (sample module, deployment) of each pipeline: the load starts the pipelines' own deployments directly
PIPELINES = [
    ("phspectra", "phspectra-survey/local"),
    ("etl", "ndjson-ingest/local"),
    ("video", "video-process/local"),
    ("gpu", "gpu-job/local"),
    ("records", "records-ingest/local"),
]

REPO_ROOT = Path(__file__).resolve().parents[1]
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
SERVER_ERRORS = {
    "database is locked": re.compile(r"database is locked"),
    "ERROR lines": re.compile(r"\bERROR\b"),
    "tracebacks": re.compile(r"^Traceback"),
}


def stack(command: str, env: dict[str, str]) -> str:
    """``python -m deployments.local_stack COMMAND`` for the stack in ``env``; its output (raises on failure)."""
    result = subprocess.run(
        [sys.executable, "-m", "deployments.local_stack", command],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(f"local_stack {command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def parameters(pipeline: str, workdir: Path, copy: int) -> dict:
    """The demo sample's parameters for one run, unique per copy."""
    import importlib

    params = importlib.import_module(f"deployments.samples.{pipeline}").make(workdir / f"{pipeline}-{copy}")
    if pipeline == "gpu":
        params.update(
            job_id=f"load-gpu-{copy}-{int(time.time())}", command=params["command"].replace(" --fail-first-attempt", "")
        )
    if pipeline == "video":
        params["job_id"] = f"load-video-{copy}-{int(time.time())}"
    return params


def submit(per_pipeline: int, workdir: Path) -> tuple[list[str], collections.Counter]:
    """Start ``per_pipeline`` runs of every pipeline at once (no waiting); their flow-run ids and refused requests."""
    from prefect.deployments import run_deployment

    ids, refused = [], collections.Counter()
    for copy in range(per_pipeline):
        for pipeline, deployment in PIPELINES:
            try:
                ids.append(
                    str(run_deployment(deployment, parameters=parameters(pipeline, workdir, copy), timeout=0).id)
                )
            except Exception as error:  # noqa: BLE001 - the server refused (e.g. 503 under load): an outcome to report
                refused[f"{deployment}: {type(error).__name__}: {str(error)[:80]}"] += 1
    return ids, refused


def wait_for_runs(since: datetime, timeout_s: float) -> list:
    """Every flow run due since ``since``, once none of the non-scheduled ones is pending or running (or at the
    timeout)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterExpectedStartTime

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            now = datetime.now(UTC)
            window = FlowRunFilter(expected_start_time=FlowRunFilterExpectedStartTime(after_=since, before_=now))
            runs, page = [], None
            while page is None or len(page) == 200:  # the API returns at most 200 per call
                page = client.read_flow_runs(flow_run_filter=window, limit=200, offset=len(runs))
                runs += page
            # the submitted runs and what they started; the schedules' runs are reported, not waited for
            live = [
                r for r in runs if not r.auto_scheduled and (r.state_type is None or r.state_type.value not in TERMINAL)
            ]
            if not live or time.monotonic() > deadline:
                flows = {f.id: f.name for f in client.read_flows(limit=200)}
                return [(flows.get(r.flow_id, "?"), r.state_name or "?", r) for r in runs]
            time.sleep(3)


def server_errors(log: Path, offset: int) -> dict[str, int]:
    """Counts of the server log's error kinds after byte ``offset``."""
    text = log.read_bytes()[offset:].decode(errors="replace") if log.exists() else ""
    return {
        name: sum(1 for line in text.splitlines() if pattern.search(line)) for name, pattern in SERVER_ERRORS.items()
    }


def measure(database: str, per_pipeline: int, timeout_s: float, root: Path) -> dict:
    """One database: stack up, the load, the figures, stack down (this process's environment as it was)."""
    saved = dict(os.environ)  # the stack's local.env is applied below: the next stack, or a caller, must not see it
    try:
        return _measure(database, per_pipeline, timeout_s, root)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _measure(database: str, per_pipeline: int, timeout_s: float, root: Path) -> dict:
    data = root / database
    env = {
        **os.environ,
        "PIPELINES_DATA_DIR": str(data),
        "PREFECT_SERVER_DB": database,
        "DYNAMODB_LOCAL_PORT": str(free_port()),
        "PREFECT_SERVER_PORT": str(free_port()),
        "PREFECT_POSTGRES_PORT": str(free_port()),
    }
    env.pop("AWS_ENDPOINT_URL_DYNAMODB", None)
    env.pop("PREFECT_API_URL", None)
    started = time.monotonic()
    print(f"== {database}: starting a stack in {data} ...", flush=True)
    try:
        stack("up", env)
        up_s = time.monotonic() - started
        from prefect.settings import PREFECT_API_URL, temporary_settings

        for line in (data / "local.env").read_text().splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            os.environ[name] = value
        log = data / "logs" / "prefect-server.log"
        offset = log.stat().st_size if log.exists() else 0
        since = datetime.now(UTC)
        t0 = time.monotonic()
        with temporary_settings(updates={PREFECT_API_URL: os.environ["PREFECT_API_URL"]}):  # this stack's server
            submitted, refused = submit(per_pipeline, root / f"{database}-inputs")
            runs = wait_for_runs(since, timeout_s)
        load_s = time.monotonic() - t0
        errors = server_errors(log, offset)
        worker_errors = server_errors(data / "logs" / "worker.log", 0)["ERROR lines"]
    finally:
        print(stack("down", env).strip(), flush=True)
    outcomes = collections.Counter((flow, state) for flow, state, _ in runs)
    mine = collections.Counter(state for _, state, run in runs if str(run.id) in set(submitted))
    return {
        "database": database,
        "up_s": round(up_s, 1),
        "load_s": round(load_s, 1),
        "submitted": len(submitted),
        "refused_submissions": dict(refused),
        "submitted_outcomes": dict(mine),
        "runs": len(runs),
        "errors": errors,
        "worker_error_lines": worker_errors,
        "outcomes": {f"{flow}: {state}": n for (flow, state), n in sorted(outcomes.items())},
    }


def main() -> int:
    """Measure each database and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-pipeline", type=int, default=2, help="concurrent runs of each pipeline (default 2)")
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for the runs to end")
    parser.add_argument("--quick", action="store_true", help="SQLite only, one run of each pipeline")
    args = parser.parse_args()
    if args.quick:
        args.databases, args.per_pipeline = "sqlite", 1
    root = Path(tempfile.mkdtemp(prefix="server-load-"))
    if os.geteuid() == 0:  # PostgreSQL runs as `postgres`: it must be able to reach its folder
        root.chmod(0o755)
    results = []
    try:
        for database in args.databases.split(","):
            results.append(measure(database.strip(), args.per_pipeline, args.timeout, root))
            print(json.dumps(results[-1], indent=2), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n{'database':10} {'refused':>7} {'runs':>5} {'completed':>9} {'not completed':>13} {'db locked':>9} "
        f"{'ERROR lines':>11} {'load s':>7}"
    )
    for r in results:
        done = sum(n for k, n in r["outcomes"].items() if k.endswith(": Completed"))
        print(
            f"{r['database']:10} {sum(r['refused_submissions'].values()):7} {r['runs']:5} {done:9} "
            f"{r['runs'] - done:13} {r['errors']['database is locked']:9} "
            f"{r['errors']['ERROR lines']:11} {r['load_s']:7}"
        )
    if len(results) == 2:
        a, b = results
        print(
            f"RATIO server ERROR lines {b['database']} / {a['database']} = "
            f"{b['errors']['ERROR lines']}/{a['errors']['ERROR lines']}; load time "
            f"{b['load_s'] / max(a['load_s'], 0.1):.2f}"
        )
    wrong = {r["database"]: {s: n for s, n in r["submitted_outcomes"].items() if s != "Completed"} for r in results}
    wrong = {database: states for database, states in wrong.items() if states}
    if wrong:  # a pipeline's run that did not complete under load is a wrong result, a slow one is not
        print(f"FAILED: submitted runs that did not complete: {wrong}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
