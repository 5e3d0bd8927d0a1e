"""The seeds' capacity and time limits in one place: what AWS enforced for them, as Prefect settings here.

Deployment concurrency limits live in prefect.yaml (``definitions.limits``); the timeouts and task tags below
are read by the flows, and the tag limits are created by the local stack (``deployments/local_stack.py``).
"""

from __future__ import annotations

import os

# seed 001: Glue job timeout 2880 min; the batch status updater and manifest builder Lambdas time out at 180 s
ETL_MERGE_TIMEOUT_S = 48 * 3600
ETL_STATUS_UPDATE_TIMEOUT_S = 180
ETL_MANIFEST_BUILDER_TIMEOUT_S = 180
# seeds 000/003: their workers were Lambdas, capped at 15 min a call (a phspectra chunk has its lease instead)
SEGMENT_TIMEOUT_S = 15 * 60
# a maintenance run (sweeps, reconcile, health) that hangs must not hold its one-at-a-time slot for ever
MAINTENANCE_TIMEOUT_S = 10 * 60

# seed 001: CloudWatch logs kept 3 days; here the Prefect server's flow runs (with their logs and artifacts) and events
PREFECT_RETENTION_DAYS = 3

MAINTENANCE_FLOWS = (
    "phspectra-sweep-stuck", "ndjson-flush-orphans", "gpu-sweep", "gpu-node-healthcheck", "video-sweep-stuck",
    "video-delete-cleanup", "records-replay-dla", "records-reconcile", "pipeline-health",
)
# flow name -> its timeout: the flows' decorators and the duration-near-timeout alarm read the same numbers
FLOW_TIMEOUT_S: dict[str, float] = {"ndjson-merge": ETL_MERGE_TIMEOUT_S, **{name: MAINTENANCE_TIMEOUT_S for name in MAINTENANCE_FLOWS}}

# CPU-heavy tasks (fits, ffmpeg) carry this tag; its task concurrency limit bounds them on one worker machine
CPU_HEAVY_TAG = "cpu-heavy"


def cpu_heavy_slots() -> int:
    """How many CPU-heavy tasks may run at once on a worker machine (``CPU_HEAVY_SLOTS``, default: its cores)."""
    return int(os.environ.get("CPU_HEAVY_SLOTS") or os.cpu_count() or 1)
