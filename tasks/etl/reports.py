"""The seed's per-run metadata reports: one JSON per ingest (``logs/lambda/…``) and per merge (``logs/glue/…``).

They land in the manifest store, as the seed keeps them in its manifest bucket, written once at the end of the run;
a report that cannot be written is logged and the run goes on.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import datetime
from typing import Any

from blocks.etl import EtlSettings
from tasks.core.runtime import prefect_ids, utc_now
from tasks.etl import keys
from tasks.etl.ingest import settings, store

log = logging.getLogger(__name__)


def write_run_report(
    kind: str, started: datetime, report: dict[str, Any], config: EtlSettings | None = None, part: str = ""
) -> str | None:
    """Put ``report`` at ``logs/{kind}/{start}-{run id}.json`` with the run's ids and timing; its URL, or None when
    it could not be written (logged: a report never fails the run). ``part`` names one of several reports of a run
    (``{run id}-{part}``: a merge run's further manifests)."""
    config = config or settings()
    finished = utc_now()
    run_id = prefect_ids().get("prefect_flow_run_id") or uuid.uuid4().hex
    document = {
        "run_id": run_id,
        "started_at": started.isoformat(),
        "finished_at": finished.isoformat(),
        "duration_seconds": round((finished - started).total_seconds(), 3),
        **report,
    }
    try:
        key = keys.run_report_key(kind, started, f"{run_id}-{part}" if part else run_id)
        return store(config.manifest_store_url).put_bytes(key, json.dumps(document, indent=2, default=str).encode())
    except Exception as error:  # noqa: BLE001 - the report is a record of the run, never a reason for it to fail
        log.warning("%s report of run %s not written: %s: %s", kind, run_id, type(error).__name__, error)
        return None
