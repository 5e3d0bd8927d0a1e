"""The disks' alarms: every folder the stack writes to, how full its disk is.

    the object store, each local landing place ──┐
    the stack's data folder (DynamoDB, logs)  ───┼─> statvfs ─┬─> past disk_warning_percent ──> disk-space-low-LABEL
    the Prefect database's folder             ───┤            └─> past disk_critical_percent ─> disk-full-LABEL
    HEALTH_DISK_PATHS (label=path, …)         ───┘

A disk out of space (bytes or inodes) stops the writes on it: every write is undone and waits (``tasks.core.disk``),
so these alarms are how an operator learns of it, before (WARNING) and when (CRITICAL) it happens. An ``s3://``
store has no disk to fill and is left out.
"""

from __future__ import annotations

import math
from pathlib import Path

from blocks.health import HealthThresholds
from tasks.core import disk, registry
from tasks.core.object_store import LocalStore, ObjectStore
from tasks.core.settings import MachineSettings
from tasks.health.checks import Alarm, Check

LOW, FULL = "disk-space-low", "disk-full"
PIPELINE = "all"


def _local_root(url: str) -> Path | None:
    """The folder of a ``file://`` store URL (None for S3)."""
    store = ObjectStore.from_url(url)
    return store.root if isinstance(store, LocalStore) else None


def watched_folders(limits: HealthThresholds) -> dict[str, Path]:
    """Label -> folder, for every folder the stack writes to on a local disk."""
    from tasks.core.config import object_store
    from tasks.landing.sqs import landing_store_url

    folders: dict[str, Path | None] = {"objects": _local_root(object_store().url)}
    for pipeline in registry.landings():
        folders[f"landing-{pipeline}"] = _local_root(landing_store_url(pipeline))
    data = MachineSettings.read().data_dir
    if data:
        folders["stack-data"] = Path(data)
        folders["prefect-database"] = Path(data) / "postgres"
    for entry in filter(None, (part.strip() for part in (limits.disk_paths or "").split(","))):
        label, _, path = entry.rpartition("=")
        folders[label or Path(path).name] = Path(path)
    seen: set[Path] = set()
    watched = {}
    for label, folder in folders.items():
        if folder is not None and folder.resolve() not in seen:  # a landing place that is the object store: once
            seen.add(folder.resolve())
            watched[label] = folder
    return watched


def disk_alarms(limits: HealthThresholds) -> list[Alarm]:
    """Two alarms per watched folder: its disk past the warning share (WARNING), past the critical one (CRITICAL).
    The value is the share in use, in whole percent (rounded up: a disk 99.5% full reads 100)."""
    alarms = []
    for label, folder in watched_folders(limits).items():
        reading = disk.usage(folder)
        used = math.ceil(reading.used_percent)
        alarms += [
            Alarm(f"{LOW}-{label}", PIPELINE, used, int(limits.disk_warning_percent), reading.describe()),
            Alarm(f"{FULL}-{label}", PIPELINE, used, int(limits.disk_critical_percent), reading.describe()),
        ]
    return alarms


CHECKS: dict[Check, tuple[str, ...]] = {disk_alarms: (LOW, FULL)}
