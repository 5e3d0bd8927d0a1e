"""Readings of a running local stack, taken in a process of its own on the stack's environment (its local.env): the
ETL's tracking records of a date, granule records, the disks' alarms, a `pipeline-health` run's rows and a
`records-reconcile` dry run. Each prints one JSON document, read back by ``probe``.

    python -m tests.helpers.stack_probe etl DATE | granules ID,ID,... | disks | health | reconcile
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.upgrade_feed import UNSIGNED_DEFAULTS, stack_env

REPO_ROOT = Path(__file__).resolve().parents[2]


def probe(data: Path, env: dict[str, str], *args: str, timeout: float = 300) -> Any:
    """Run this module with ``args`` on the stack in ``data`` (``env``: the test's clean environment for it)."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.helpers.stack_probe", *args],
        cwd=REPO_ROOT,
        env={**env, **UNSIGNED_DEFAULTS, **stack_env(data), "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"stack_probe {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def etl(date: str) -> dict[str, Any]:
    """The tracking records of ``date``: files (key -> status, path, manifest, error) and manifests (name -> status,
    waiting reason)."""
    from tasks.core import config, state_store
    from tasks.etl import ingest, keys

    files, manifests = {}, {}
    for item in state_store.scan_all(config.table_name(ingest.TRACKING)):
        if item["date_prefix"] != date:
            continue
        status = ingest.base_status(item)
        if item["file_key"].startswith(keys.MANIFEST_PREFIX):
            manifests[item["file_key"].split("#", 1)[1]] = {
                "status": status,
                "waiting_reason": item.get("waiting_reason"),
                "path": item.get("manifest_path"),
            }
        elif not keys.is_meta_record(item["file_key"]):  # a LOCK# or CATALOG# record is no file
            files[item["file_key"]] = {
                "status": status,
                "file_path": item.get("file_path"),
                "manifest_path": item.get("manifest_path"),
                "error": item.get("error_message"),
            }
    return {"files": files, "manifests": manifests}


def granules(ids: str) -> dict[str, str]:
    """Granule id -> status, for those of ``ids`` (comma separated) the table holds."""
    from tasks.core import config, state_store

    wanted = [{"granuleId": g} for g in ids.split(",") if g]
    found = state_store.get_many(config.table_name("granules"), wanted)
    return {item["granuleId"]: item.get("status") for item in found}


def disks() -> list[dict[str, Any]]:
    """The disks' alarms as `pipeline-health` evaluates them (its thresholds block)."""
    from blocks import load_config
    from blocks.health import HealthThresholds
    from tasks.health import checks
    from tasks.health import disks as disk_checks

    return [alarm.row() for alarm in checks.evaluate(load_config(HealthThresholds), disk_checks.CHECKS)]


def health() -> dict[str, Any]:
    """One run of the `pipeline-health` deployment (as its schedule starts it): its end state and its table's rows."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    from prefect.deployments import run_deployment

    run = run_deployment("pipeline-health/local", timeout=240)
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["pipeline-health"]), flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])
            )
        )
    rows = [json.loads(a.data) if isinstance(a.data, str) else a.data for a in artifacts]
    return {"state": run.state.name if run.state else None, "rows": rows[0] if rows else []}


def reconcile() -> list[dict[str, Any]]:
    """`records-reconcile`'s findings, as a dry run (nothing repaired)."""
    from tasks import reconcile as reconciler

    return reconciler.reconcile_rows(None, True)


def own_stack(prefix: str) -> tuple[Path, Path, dict[str, str]]:
    """A stack of a test's own: its folder (0755, under /tmp, which the `postgres` user reaches as root), its data
    folder, and the environment that points `local_stack` at that folder and at free ports."""
    import tempfile

    from deployments import dynamodb_local

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    data = folder / "data"
    ports = {name: dynamodb_local.free_port() for name in ("dynamodb", "prefect-server", "postgres")}
    return (
        folder,
        data,
        {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(REPO_ROOT),
            "PIPELINES_DATA_DIR": str(data),
            "DYNAMODB_LOCAL_PORT": str(ports["dynamodb"]),
            "PREFECT_SERVER_PORT": str(ports["prefect-server"]),
            "PREFECT_POSTGRES_PORT": str(ports["postgres"]),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        },
    )


def main() -> int:
    command, *args = sys.argv[1:]
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    result = {"etl": etl, "granules": granules, "disks": disks, "health": health, "reconcile": reconcile}[command](
        *args
    )
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
