"""`make demo`: every pipeline through `prefect deployment run … --watch` on generated data, then a report.

Runs against the local stack that `make up` started (the Makefile does that first). Sample data is written
under .data/demo/<timestamp>/, so running the demo twice works and keeps both runs' records.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import subprocess
import sys
import time
from datetime import datetime, timezone

from deployments.local_stack import DATA, REPO_ROOT, local_env

# (sample module, deployment) in the order a person would try them
PIPELINES = [
    ("phspectra", "phspectra-survey/local"),
    ("etl", "ndjson-ingest/local"),
    ("video", "video-process/local"),
    ("gpu", "gpu-job/local"),
    ("records", "records-ingest/local"),
]
INDIRECT_FLOWS = ["ndjson-merge", "video-reassemble"]  # started by the pipelines themselves


def run_deployment(name: str, params: dict) -> tuple[str, float]:
    """`prefect deployment run NAME --params … --watch`; returns the final state line and seconds taken."""
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "prefect", "deployment", "run", name, "--params", json.dumps(params), "--watch",
         "--watch-timeout", "600"],
        cwd=REPO_ROOT, env={**os.environ, **local_env()}, capture_output=True, text=True,
    )
    output = (result.stdout + result.stderr).strip().splitlines()
    final = next((line for line in reversed(output) if "finished in state" in line.lower()), None)
    if final is None:
        final = output[-1] if output else f"exit code {result.returncode}"
    return final.strip(), time.monotonic() - start


def wait_until_idle(since: datetime, timeout_s: float = 300) -> None:
    """Wait for the runs the demo started indirectly (merges, reassembly) since ``since`` to finish.

    Scheduled maintenance runs are left alone: they run on their own clock.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterExpectedStartTime, FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            busy = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=INDIRECT_FLOWS)),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED])),
                    expected_start_time=FlowRunFilterExpectedStartTime(after_=since),
                ),
            )
            if not busy:
                return
            time.sleep(2)
    print(f"(some flow runs were still running after {timeout_s:.0f} s)")


def main() -> int:
    """Run every pipeline's sample through its deployment, wait for follow-up runs, then print each report."""
    os.environ.update(local_env())
    workdir = DATA / "demo" / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    results = {}
    started = time.monotonic()
    since = datetime.now(timezone.utc)
    for pipeline, deployment in PIPELINES:
        sample = importlib.import_module(f"deployments.samples.{pipeline}")
        params = sample.make(workdir)
        if pipeline == "records":  # a shuffled batch: the records must come out the same in any order
            random.Random(7).shuffle(params["messages"])
        if pipeline == "video":  # name the job so the report can read it back by key
            params["job_id"] = f"demo-video-{workdir.name}"
        print(f"\n== {deployment}")
        state, seconds = run_deployment(deployment, params)
        print(f"   {state}  ({seconds:.0f} s)")
        results[pipeline] = params
        if pipeline == "etl":  # the sample's dates are past days: the flush closes their partial batches
            print("\n== ndjson-flush-orphans/local")
            state, seconds = run_deployment("ndjson-flush-orphans/local", {})
            print(f"   {state}  ({seconds:.0f} s)")
    print("\n== waiting for the flow runs started by those (merges, reassembly)")
    wait_until_idle(since)

    print("\n" + "=" * 72 + "\nReport, read back from DynamoDB with the seeds' access patterns\n" + "=" * 72)
    for pipeline, _deployment in PIPELINES:
        sample = importlib.import_module(f"deployments.samples.{pipeline}")
        params = results[pipeline]
        try:
            if pipeline in ("gpu", "video"):
                text = sample.report(params["job_id"])
            else:
                text = sample.report()
        except Exception as error:  # a report must not hide the others
            text = f"{pipeline}: could not read the report: {error}"
        print(f"\n[{pipeline}]\n{text}")
    print(f"\nDemo finished in {time.monotonic() - started:.0f} s. Prefect UI: {local_env()['PREFECT_API_URL'].removesuffix('/api')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
