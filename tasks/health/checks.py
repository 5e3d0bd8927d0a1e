"""The alarms of ``pipeline-health``: one read-only check per condition, over all five pipelines' records.

Seed 001 alarms on DLQ messages, queue depth, message age and workflow failures; the same questions are asked of
every pipeline here. A check reads only (Query where an index exists, a maintenance Scan of small tables
otherwise) and returns an ``Alarm``: its value, its threshold and the first offending records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from boto3.dynamodb.conditions import Key

from blocks.health import HealthThresholds
from tasks.core import state_store
from tasks.etl import keys as etl_keys
from tasks.records import keys as records_keys
from tasks.core.config import object_store, table_name
from tasks.core.runtime import iso_ago, now_iso
from tasks.etl import ingest as etl
from tasks.gpu import jobs as gpu
from tasks.phspectra import survey
from tasks.video import jobs as video

SHOWN = 5  # offending records named in an alarm's detail
CRITICAL, WARNING = "CRITICAL", "WARNING"
# seed 001's severities: failures, timeouts, throttled runs and dead letters are CRITICAL; backlog, age, duration,
# concurrency and DynamoDB throttling are WARNING. The other seeds' alarms follow the same split (failed: CRITICAL,
# stuck or slow: WARNING); an alarm whose check could not read its records is CRITICAL (seed SystemErrors).
SEVERITY = {
    "flow-runs-failed": CRITICAL, "etl-merge-runs-failed": CRITICAL, "flow-runs-timed-out": CRITICAL,
    "flow-runs-waiting-for-a-slot": CRITICAL, "etl-merge-file-failures": CRITICAL, "landing-dead-letter-queue": CRITICAL,
    "records-dead-letter-archive": CRITICAL, "etl-failed-manifests": CRITICAL, "video-jobs-failed-per-hour": CRITICAL,
    "records-archived-per-hour": CRITICAL, "landing-listener-not-running": CRITICAL,
    "flow-runs-active": WARNING, "flow-runs-near-timeout": WARNING, "etl-iterator-age": WARNING,
    "etl-files-pending": WARNING, "etl-files-pending-too-long": WARNING, "etl-tracking-read-throttles": WARNING,
    "etl-tracking-write-throttles": WARNING, "phspectra-stuck-chunks": WARNING, "video-stuck-jobs": WARNING,
    "gpu-stuck-jobs": WARNING, "gpu-nodes-out-of-service": WARNING, "gpu-restarts-per-hour": WARNING,
    "landing-listener-behind": WARNING,
}


def severity_of(name: str, value: int | None = 0) -> str:
    """An alarm's severity by its name (or the name it is one of, e.g. ``landing-dead-letter-queue-etl``); an
    unreadable check is CRITICAL, an alarm without a listed severity WARNING."""
    if value is None:
        return CRITICAL
    for known in sorted(SEVERITY, key=len, reverse=True):
        if name == known or name.startswith(known + "-"):
            return SEVERITY[known]
    return WARNING


@dataclass(frozen=True)
class Alarm:
    """One alarm's reading: firing when ``value`` exceeds ``threshold`` (or when the check itself failed)."""

    name: str
    pipeline: str
    value: int | None
    threshold: int
    detail: str

    @property
    def firing(self) -> bool:
        """Whether the alarm is in ALARM: over its threshold, or its check could not read the records."""
        return self.value is None or self.value > self.threshold

    @property
    def severity(self) -> str:
        """CRITICAL or WARNING, as the seed grades the alarm (``severity_of``)."""
        return severity_of(self.name, self.value)

    def row(self) -> dict[str, Any]:
        """The alarm as a table-artifact row."""
        return {**asdict(self), "severity": self.severity,
                "state": "ERROR" if self.value is None else ("ALARM" if self.firing else "OK")}


def _alarm(name: str, pipeline: str, offenders: Iterable[str], threshold: int, what: str) -> Alarm:
    found = sorted(offenders)
    shown = ", ".join(found[:SHOWN]) + (f" and {len(found) - SHOWN} more" if len(found) > SHOWN else "")
    return Alarm(name, pipeline, len(found), threshold, f"{len(found)} {what}" + (f": {shown}" if found else ""))


def dead_letter_archive(limits: HealthThresholds) -> Alarm:
    """Records: objects in the dead-letter archive (waiting for replay, or failed again under failed/)."""
    found = list(object_store().list(records_keys.DEAD_LETTER_PREFIX))
    return _alarm("records-dead-letter-archive", "records", found, limits.dead_letter_max, "archived message(s)")


def _pending_files() -> list[dict[str, Any]]:
    """Every tracked file (not meta-record) pending in any status shard, through the status index."""
    statuses = [etl_keys.sharded_status(etl.PENDING, n) for n in range(etl.settings().num_status_shards)] + [etl.PENDING]
    found = []
    for status in statuses:
        found += state_store.query_all(
            table_name(etl.TRACKING), keep=lambda item: not etl_keys.is_meta_record(item["file_key"]),
            IndexName=etl.STATUS_INDEX, KeyConditionExpression=Key("status").eq(status),
        )
    return found


def pending_since(item: Mapping[str, Any]) -> str:
    """When a pending file became pending: its last status change (``updated_at``, written by every move back to
    ``pending#N``: release, reprocess, revalidation), else its creation; never the first ingest of a re-run file."""
    return str(item.get("updated_at") or item.get("created_at", ""))


def iterator_age(pending: Sequence[Mapping[str, Any]], batch: int, now: str | None = None) -> tuple[int, str | None]:
    """Seed IteratorAge: seconds the oldest pending file waited although its date had a full batch pending (a file
    of a date still filling its batch waits by design, never counted), and which file; (0, None) when none."""
    per_date = Counter(str(item["date_prefix"]) for item in pending)
    batchable = [item for item in pending if per_date[str(item["date_prefix"])] >= batch]
    if not batchable:
        return 0, None
    oldest = min(batchable, key=pending_since)
    waited = datetime.fromisoformat(now or now_iso()) - datetime.fromisoformat(pending_since(oldest))
    return max(0, int(waited.total_seconds())), f"{oldest['date_prefix']}/{oldest['file_key']}"


def etl_pending(limits: HealthThresholds) -> list[Alarm]:
    """ETL: files pending longer than ``pending_file_minutes`` (message age), pending files (queue depth), and the
    age of the batching backlog (iterator age, ``iterator_age_seconds``)."""
    pending = _pending_files()
    cutoff = iso_ago(limits.pending_file_minutes * 60)
    names = [f"{item['date_prefix']}/{item['file_key']}" for item in pending]
    late = [n for n, item in zip(names, pending) if pending_since(item) < cutoff]
    minutes = f"{limits.pending_file_minutes:g}"
    age, oldest = iterator_age(pending, etl.settings().max_files_per_manifest)
    return [
        _alarm("etl-files-pending-too-long", "etl", late, limits.late_pending_files_max, f"file(s) pending > {minutes} min"),
        _alarm("etl-files-pending", "etl", names, limits.pending_files_max, "file(s) pending"),
        Alarm("etl-iterator-age", "etl", age, int(limits.iterator_age_seconds),
              f"oldest batchable pending file waited {age} s" + (f": {oldest}" if oldest else "")),
    ]


def etl_failed_manifests(limits: HealthThresholds) -> Alarm:
    """ETL: ``MANIFEST#`` records whose merge failed (a re-run moves them on, which clears the alarm)."""
    failed = state_store.query_all(
        table_name(etl.TRACKING), keep=lambda item: item["file_key"].startswith(etl_keys.MANIFEST_PREFIX),
        IndexName=etl.STATUS_INDEX, KeyConditionExpression=Key("status").eq(etl.FAILED),
    )
    names = [f"{item['date_prefix']}/{etl_keys.manifest_name_from_record_key(item['file_key'])}" for item in failed]
    return _alarm("etl-failed-manifests", "etl", names, limits.failed_manifests_max, "failed manifest(s)")


def phspectra_stuck_chunks(limits: HealthThresholds) -> Alarm:
    """phspectra: chunks of running surveys whose lease expired over ``stuck_chunk_minutes`` ago and that no
    sweep re-drove (a long fit renews its lease and is never stuck)."""
    cutoff = iso_ago(limits.stuck_chunk_minutes * 60)
    stuck = [f"{run['PK']}/{chunk['SK']}" for run in survey.active_runs() for chunk in survey.expired_leases(run["PK"], cutoff)]
    minutes = f"{limits.stuck_chunk_minutes:g}"
    return _alarm("phspectra-stuck-chunks", "phspectra", stuck, 0, f"chunk(s) IN_PROGRESS with a lease expired > {minutes} min")


def _last_change(item: Mapping[str, Any], attrs: Iterable[str]) -> str:
    return max((str(item[a]) for a in attrs if item.get(a)), default="")


VIDEO_TIMES = ("created_at", "chunking_started_at", "chunking_completed_at")


def video_stuck_jobs(limits: HealthThresholds) -> Alarm:
    """Video: jobs in created / chunking_in_progress / chunking_complete unchanged for ``video_stuck_minutes``."""
    cutoff = iso_ago(limits.video_stuck_minutes * 60)
    stuck = [
        f"{job['job_id']} ({job['status']})"
        for job in video.list_jobs()
        if job.get("status") in video.ACTIVE and _last_change(job, VIDEO_TIMES) < cutoff
    ]
    return _alarm("video-stuck-jobs", "video", stuck, 0, f"job(s) non-terminal > {limits.video_stuck_minutes:g} min")


def gpu_stuck_jobs(limits: HealthThresholds) -> Alarm:
    """GPU: jobs IN_PROGRESS without an update for ``gpu_job_running_minutes``, or in a recovery status too long."""
    running, recovering = iso_ago(limits.gpu_job_running_minutes * 60), iso_ago(limits.gpu_job_stuck_minutes * 60)
    stuck = []
    for job in gpu.list_jobs():
        status = job.get("job_status")
        if status not in gpu.JOB_ACTIVE:
            continue
        cutoff = running if status == gpu.JOB_IN_PROGRESS else recovering
        if _last_change(job, ("created_at", "updated_at")) < cutoff:
            stuck.append(f"{job['job_id']} ({status})")
    return _alarm("gpu-stuck-jobs", "gpu", stuck, 0, "job(s) stuck in a non-terminal status")


NODE_OUT = (gpu.NODE_FAILED, gpu.NODE_REBOOTING, gpu.NODE_UNKNOWN)


def gpu_nodes_out(limits: HealthThresholds) -> Alarm:
    """GPU: nodes FAILED / REBOOTING / UNKNOWN for longer than ``gpu_node_out_minutes``."""
    cutoff = iso_ago(limits.gpu_node_out_minutes * 60)
    out = [
        f"{node['node_name']} ({node['node_status']})"
        for node in gpu.list_nodes()
        if node.get("node_status") in NODE_OUT and _last_change(node, ("created_at", "updated_at", "rebooted_at")) < cutoff
    ]
    return _alarm("gpu-nodes-out-of-service", "gpu", out, 0, f"node(s) out of service > {limits.gpu_node_out_minutes:g} min")


Check = Callable[[HealthThresholds], "Alarm | list[Alarm]"]
# check -> the alarm names it reports (so a check that fails still reports each of them, as ERROR)
CHECKS: dict[Check, tuple[str, ...]] = {
    dead_letter_archive: ("records-dead-letter-archive",),
    etl_pending: ("etl-files-pending-too-long", "etl-files-pending", "etl-iterator-age"),
    etl_failed_manifests: ("etl-failed-manifests",),
    phspectra_stuck_chunks: ("phspectra-stuck-chunks",),
    video_stuck_jobs: ("video-stuck-jobs",),
    gpu_stuck_jobs: ("gpu-stuck-jobs",),
    gpu_nodes_out: ("gpu-nodes-out-of-service",),
}


def evaluate(limits: HealthThresholds, registry: Mapping[Check, tuple[str, ...]] | None = None) -> list[Alarm]:
    """Every alarm's reading; a check that raises reports its alarms as ERROR (firing) with the error."""
    alarms: list[Alarm] = []
    for check, names in (CHECKS if registry is None else registry).items():
        try:
            result = check(limits)
        except Exception as error:  # noqa: BLE001 - an unreadable pipeline is itself worth an alarm
            pipeline = names[0].split("-")[0]
            alarms += [Alarm(n, pipeline, None, 0, f"check failed: {type(error).__name__}: {error}") for n in names]
            continue
        alarms += result if isinstance(result, list) else [result]
    return alarms
