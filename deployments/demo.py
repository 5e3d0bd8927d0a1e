"""`make demo`: every pipeline on generated data, then a report.

Data arrival starts four of them, as in their seeds: the demo drops a survey manifest, NDJSON files, a video
(after `video create-job`) and a workflow-message file into their landing places in the object store and waits
for the listeners that `make up` runs to start the work; only the GPU job is started with `prefect deployment
run … --watch`. Runs against the local stack that `make up` started (the Makefile does that first). Sample data
is written under .data/demo/<timestamp>/ and named after it in the store, so running the demo twice works and
keeps both runs' records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

from deployments import pipeline_module
from deployments.local_stack import DATA, REPO_ROOT, local_env
from tasks.core import registry

SAMPLES = "deployments.samples"  # a pipeline's sample: make(workdir), drop(workdir, store), landed(...), report(...)


def landed_samples() -> list[tuple[str, str]]:
    """(pipeline, the listener deployment that starts its work) for each registered pipeline with a landing and a
    sample (``deployments/samples/<name>.py``), in seed order: data lands, as in their seeds."""
    return [
        (p.name, f"{p.landing.flow}/local")
        for p in registry.pipelines()
        if p.landing is not None and pipeline_module(SAMPLES, p.name) is not None
    ]


def deployed_samples() -> list[tuple[str, str]]:
    """(pipeline, deployment) for each registered pipeline with a sample but no landing: a person starts it (seed 002
    has no data arrival); its sample names the deployment (``DEPLOYMENT``)."""
    return [
        (p.name, module.DEPLOYMENT)
        for p in registry.pipelines()
        if p.landing is None and (module := pipeline_module(SAMPLES, p.name)) is not None
    ]


def indirect_flows() -> list[str]:
    """The flows the listeners and the pipelines start by themselves: the landed pipelines' own flows."""
    landed = {pipeline for pipeline, _ in landed_samples()}
    return [flow for p in registry.pipelines() if p.name in landed for flow in p.flows]


LANDING_TIMEOUT_S = 600


def run_deployment(name: str, params: dict) -> tuple[str, float]:
    """`prefect deployment run NAME --params … --watch`; returns the final state line and seconds taken."""
    start = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect",
            "deployment",
            "run",
            name,
            "--params",
            json.dumps(params),
            "--watch",
            "--watch-timeout",
            "600",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, **local_env()},
        capture_output=True,
        text=True,
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
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterExpectedStartTime,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            busy = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=indirect_flows())),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(
                        type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED])
                    ),
                    expected_start_time=FlowRunFilterExpectedStartTime(after_=since),
                ),
            )
            if not busy:
                return
            time.sleep(2)
    print(f"(some flow runs were still running after {timeout_s:.0f} s)")


def wait_for_landings(dropped: dict[str, dict], timeout_s: float = LANDING_TIMEOUT_S) -> dict[str, float]:
    """Wait until each dropped sample's work has been done by itself (``sample.landed``); seconds each took."""
    started, took = time.monotonic(), {}
    while len(took) < len(dropped) and time.monotonic() - started < timeout_s:
        for pipeline, params in dropped.items():
            if pipeline in took:
                continue
            try:
                done = pipeline_module(SAMPLES, pipeline).landed(**params)
            except LookupError:
                done = False
            if done:
                took[pipeline] = time.monotonic() - started
                print(f"   {pipeline}: done by itself after {took[pipeline]:.0f} s")
        time.sleep(2)
    for pipeline, listener in landed_samples():
        if pipeline in dropped and pipeline not in took:
            print(f"   {pipeline}: not done after {timeout_s:.0f} s: is {listener} running? (`make up` starts it)")
    return took


def main() -> int:
    """Drop every landed pipeline's sample in place, run the GPU job, wait for the work, then print each report."""
    os.environ.update(local_env())
    from tasks.core.config import object_store

    workdir = DATA / "demo" / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    store = object_store()
    results = {}
    started = time.monotonic()
    since = datetime.now(UTC)
    landed, deployed = landed_samples(), deployed_samples()
    for pipeline, listener in landed:
        results[pipeline] = pipeline_module(SAMPLES, pipeline).drop(workdir, store)
        print(f"\n== {pipeline}: dropped into its landing place for {listener}: {results[pipeline]}")
    for pipeline, deployment in deployed:
        params = pipeline_module(SAMPLES, pipeline).make(workdir)
        print(f"\n== {deployment}")
        state, seconds = run_deployment(deployment, params)
        print(f"   {state}  ({seconds:.0f} s)")
        results[pipeline] = params
    print("\n== waiting for the landed data to be processed by itself")
    wait_for_landings({pipeline: results[pipeline] for pipeline, _ in landed})
    # what a sample leaves to a scheduled run (the ETL's past days' partial batches: the hourly flush) is run now
    for pipeline, _ in landed:
        for deployment in getattr(pipeline_module(SAMPLES, pipeline), "FOLLOW_UPS", ()):
            print(f"\n== {deployment}")
            state, seconds = run_deployment(deployment, {})
            print(f"   {state}  ({seconds:.0f} s)")
    print("\n== waiting for the flow runs started by those (surveys, merges, reassembly, records batches)")
    wait_until_idle(since)

    print("\n" + "=" * 72 + "\nReport, read back from DynamoDB with the seeds' access patterns\n" + "=" * 72)
    for pipeline, _ in landed + deployed:
        try:
            text = pipeline_module(SAMPLES, pipeline).report(**results[pipeline])
        except Exception as error:  # noqa: BLE001 - a report must not hide the others, whatever it raises
            text = f"{pipeline}: could not read the report: {error}"
        print(f"\n[{pipeline}]\n{text}")
    print(
        f"\nDemo finished in {time.monotonic() - started:.0f} s. Prefect UI: "
        f"{local_env()['PREFECT_API_URL'].removesuffix('/api')}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
