"""What the worker's poll interval (``PREFECT_WORKER_QUERY_SECONDS``) buys: a run's start latency at each interval.

    .venv/bin/python benchmarks/worker_poll.py [--polls 1,2,5] [--runs 20]

A throwaway Prefect server, a process pool whose runs start as the local stack's do (a fork of the engine fork
server), and for each interval a worker polling at it. Then ``--runs`` runs of a flow that does nothing are created
one at a time, at random moments (so the poll's phase is spread), each waited for until it ends. Reported per
interval: created → Pending (the worker claimed it: what the poll decides) and created → Running (the flow's first
line: the claim plus the start), median, p90 and max, and the worker's polls a minute (what the interval costs: one
``POST /work_pools/{pool}/get_scheduled_flow_runs`` a poll, plus its heartbeat every 30 s).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefect import flow  # run as a script: after the repository root is on the path

REPO_ROOT = Path(__file__).resolve().parents[1]
FORKSERVER = REPO_ROOT / "deployments" / "engine_forkserver.py"


@flow(name="worker-poll-noop")
def noop() -> None:
    """A flow run that starts and ends: its latency is the worker's and the engine's alone."""


def _wait_state(client, run_id, done, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.read_flow_run(run_id)
        if done(run):
            return run
        time.sleep(0.1)
    raise TimeoutError(f"run {run_id}: {run.state_name} after {timeout} s")


def _latencies(client, run) -> tuple[float, float]:
    """(created → Pending, created → Running) of an ended run, from its state history on the server."""
    states = {s.type.value: s.timestamp for s in client.read_flow_run_states(run.id)}
    return (
        (states["PENDING"] - run.created).total_seconds(),
        (states["RUNNING"] - run.created).total_seconds(),
    )


def _figures(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(ordered):.2f} s, p90 {p90:.2f} s, max {ordered[-1]:.2f} s"


def measure(client, env: dict[str, str], pool: str, deployment_id, poll_s: float, runs: int, work: Path) -> str:
    """Start a worker polling every ``poll_s`` s, time ``runs`` runs one at a time, stop it: the report's line."""
    log = open(work / f"worker-{poll_s:g}.log", "wb")  # closed with the worker below
    worker = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"],
        cwd=REPO_ROOT,
        env={**env, "PREFECT_WORKER_QUERY_SECONDS": str(poll_s)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    claimed, started = [], []
    try:
        warm = client.create_flow_run_from_deployment(deployment_id)  # the worker's first poll and a first fork
        _wait_state(client, warm.id, lambda r: r.state.is_final(), timeout=300)
        for _ in range(runs):
            time.sleep(random.uniform(0, poll_s))  # a random phase against the worker's poll
            run = client.create_flow_run_from_deployment(deployment_id)
            run = _wait_state(client, run.id, lambda r: r.state.is_final())
            pending, running = _latencies(client, run)
            claimed.append(pending)
            started.append(running)
    finally:  # SIGKILL, as tests/helpers/prefect_runs.Worker.stop does: a SIGTERMed worker waits for its runs (> 60 s
        # seen on a loaded machine) and every run here has ended
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=60)
        log.close()
    return (
        f"poll {poll_s:g} s ({60 / poll_s:.0f} polls/min + 2 heartbeats): claimed {_figures(claimed)}; "
        f"running {_figures(started)} ({runs} runs)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", default="1,2,5", help="poll intervals to measure, seconds, comma-separated")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="a 1 s poll, 3 runs (make test-sweep)")
    args = parser.parse_args()
    if args.quick:
        args.polls, args.runs = "1", 3

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.local_stack import process_base_job_template, throwaway_prefect_server

    work = Path(tempfile.mkdtemp(prefix="worker-poll-"))  # 0700: the fork server's socket folder
    socket_path = str(work / "engine.sock")
    with throwaway_prefect_server(work / "prefect-home") as base:
        api = f"{base}/api"
        env = {**os.environ, "PREFECT_API_URL": api, "PYTHONPATH": str(REPO_ROOT)}
        forks = subprocess.Popen(
            [sys.executable, str(FORKSERVER), "serve", socket_path], cwd=REPO_ROOT, env=env, start_new_session=True
        )
        try:
            with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
                template = process_base_job_template()
                command = shlex.join([sys.executable, str(FORKSERVER), "run", socket_path])
                template["variables"]["properties"]["command"]["default"] = command
                client.create_work_pool(WorkPoolCreate(name="poll", type="process", base_job_template=template))
                deployment_id = client.create_deployment(
                    flow_id=client.create_flow(noop),
                    name="poll",
                    work_pool_name="poll",
                    entrypoint="benchmarks/worker_poll.py:noop",
                    # the local stack's pull step: run in place (a `path` is copied per run, the venv with it)
                    pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO_ROOT)}}],
                )
                for poll_s in (float(p) for p in args.polls.split(",")):
                    print(measure(client, env, "poll", deployment_id, poll_s, args.runs, work), flush=True)
        finally:
            forks.terminate()
            forks.wait(timeout=60)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
