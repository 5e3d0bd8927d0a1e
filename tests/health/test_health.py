"""pipeline-health: each alarm fires on real records, notifies once per incident, clears and notifies on recurrence;
crashes between its writes lose no notification."""

from __future__ import annotations

import json
import threading

import pytest

from tasks.core import state_store
from tasks.core.release import VERSION
from tasks.core.runtime import iso_ago, now_iso
from tasks.etl import catalog as etl_catalog
from tasks.etl import ingest as etl
from tasks.etl import keys as etl_keys
from tasks.gpu import jobs as gpu
from tasks.health import incidents
from tasks.health.run import check_health
from tasks.phspectra import keys as phspectra_keys
from tasks.phspectra import survey
from tasks.video import jobs as video
from tests.helpers.crashpoints import count_writes, crash_points, killed, run_child
from tests.helpers.health import make_dead_letter, only_record_alarms

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

ALARMS = {
    "records-dead-letter-archive",
    "etl-files-pending-too-long",
    "etl-files-pending",
    "etl-failed-manifests",
    "etl-catalog-unregistered",
    "phspectra-stuck-chunks",
    "video-stuck-jobs",
    "gpu-stuck-jobs",
    "gpu-nodes-out-of-service",
    "etl-iterator-age",
    "etl-merges-waiting-for-space",
}
SHIPPED = {"records", "etl", "phspectra", "video", "gpu"}  # the pipelines whose alarms ALARMS lists
TWO_HOURS = 2 * 3600


def _backdate(table: str, key: dict, **stamps: str) -> None:
    state_store.transition(table, key, None, None, set=stamps)


def make_etl_records(tables: dict) -> None:
    """Two files tracked by the ingest (one two hours old), a manifest whose merge failed, one whose merge met a full
    disk, and a date whose catalog registration failed."""
    config = etl.settings()
    checks = [
        etl.FileCheck(f"file:///in/pipeline/input/2026-11-20/f{i}.ndjson", "2026-11-20", f"f{i}.ndjson", 10)
        for i in (1, 2)
    ]
    etl.track_files(checks, config)
    _backdate(
        tables["etl_file_tracking"],
        etl.tracking_key("2026-11-20", "f1.ndjson"),
        created_at=iso_ago(TWO_HOURS),
        updated_at=iso_ago(TWO_HOURS),
    )
    stamp = now_iso()
    state_store.create_if_absent(
        tables["etl_file_tracking"],
        {
            **etl.tracking_key("2026-11-20", etl_keys.manifest_record_key("manifest-0001")),
            "status": etl.FAILED,
            "manifest_path": "manifests/2026-11-20/manifest-0001.json",
            "file_count": 2,
            "created_at": stamp,
            "updated_at": stamp,
            "error_message": "merge failed: disk full",
        },
        etl.TRACKING_KEYS,
    )
    state_store.create_if_absent(
        tables["etl_file_tracking"],
        {
            **etl.tracking_key("2026-11-20", etl_keys.manifest_record_key("manifest-0002")),
            "status": etl.PENDING,  # its merge met a full disk: back to pending until space is freed
            "manifest_path": "manifests/2026-11-20/manifest-0002.json",
            "file_count": 2,
            "created_at": stamp,
            "updated_at": stamp,
            "waiting_for_space_since": stamp,
            "waiting_reason": "manifest-0002 (2026-11-20): DiskFull: [Errno 28] No space left on device writing x",
        },
        etl.TRACKING_KEYS,
    )
    etl_catalog.record_unregistered("2026-11-19", "EndpointConnectionError: Could not connect to Glue")


def make_phspectra_stuck(tables: dict) -> None:
    """A running survey: a chunk whose lease expired two hours ago, one PENDING, and one fitted for two hours
    whose lease is renewed (not stuck)."""
    table, now = tables["phspectra_runs"], now_iso()
    state_store.create_if_absent(
        table,
        {
            **survey.run_key("run-1"),
            "GSI1_PK": "grs",
            "GSI1_SK": now,
            "survey": "grs",
            "status": survey.RUN_RUNNING,
            "jobs_total": 3,
            "created_at": now,
        },
        ["PK", "SK"],
    )
    leases = (
        (0, survey.IN_PROGRESS, iso_ago(TWO_HOURS - 60)),
        (10, survey.PENDING, None),
        (20, survey.IN_PROGRESS, survey.lease_until(60)),
    )
    for start, status, lease in leases:
        item = {
            **survey.chunk_key("run-1", start),
            "status": status,
            "created_at": now,
            "started_at": iso_ago(TWO_HOURS),
            **({"lease_expires_at": lease} if lease else {}),
        }
        state_store.create_if_absent(table, item, ["PK", "SK"])


def make_video_stuck(tables: dict) -> None:
    """A job created two hours ago and never uploaded (still ``created``), and a fresh one (not stuck)."""
    old = video.create_job(job_id="job-old")["job_id"]
    video.create_job(job_id="job-new")
    _backdate(tables["video_jobs"], {"job_id": old}, created_at=iso_ago(TWO_HOURS))


def make_gpu_records(tables: dict) -> None:
    """A job PENDING_RESTART for two hours, a node FAILED for two hours, and a healthy node."""
    then = iso_ago(TWO_HOURS)
    state_store.create_if_absent(
        tables["ecs_job"],
        {
            "job_id": "gpu-job-1",
            "job_status": gpu.JOB_PENDING_RESTART,
            "created_at": then,
            "updated_at": then,
            "retry": "0",
        },
        ["job_id"],
    )
    for name, status in (("node-a", gpu.NODE_FAILED), ("node-b", gpu.NODE_AVAILABLE)):
        state_store.create_if_absent(
            tables["ecs_node"],
            {"node_name": name, "node_status": status, "cluster_name": "c", "created_at": then, "updated_at": then},
            ["node_name"],
        )


def make_all(tables: dict) -> None:
    """One real cause for every alarm."""
    make_dead_letter()
    make_etl_records(tables)
    make_phspectra_stuck(tables)
    make_video_stuck(tables)
    make_gpu_records(tables)


def _by_name(rows: list[dict]) -> dict[str, dict]:
    """The shipped pipelines' rows by name; another pipeline's (one scaffolded beside them) must be OK."""
    others = [row for row in rows if row["pipeline"] not in SHIPPED]
    assert all(row["state"] == "OK" for row in others), others
    return {row["name"]: row for row in rows if row["pipeline"] in SHIPPED}


def test_healthy_pipelines_raise_no_alarm(health, tables):
    video.create_job(job_id="fresh")
    rows = _by_name(check_health())
    assert set(rows) == ALARMS
    assert {r["state"] for r in rows.values()} == {"OK"} and health == []
    assert state_store.get_item(tables["health_incidents"], {"alarm": "video-stuck-jobs"}) is None


def test_each_alarm_fires_on_its_records_and_notifies_once(health, tables):
    make_all(tables)
    rows = _by_name(check_health())
    assert {n for n, r in rows.items() if r["state"] == "ALARM"} == ALARMS
    assert (
        rows["etl-files-pending-too-long"]["value"] == 1
        and "2026-11-20/f1.ndjson" in rows["etl-files-pending-too-long"]["detail"]
    )
    assert rows["etl-files-pending"]["value"] == 2
    assert rows["etl-failed-manifests"]["detail"] == "1 failed manifest(s): 2026-11-20/manifest-0001"
    assert rows["etl-catalog-unregistered"]["detail"].endswith(
        ": 2026-11-19 (EndpointConnectionError: Could not connect to Glue)"
    )
    assert (
        rows["phspectra-stuck-chunks"]["detail"]
        == f"1 chunk(s) IN_PROGRESS with a lease expired > 30 min: run-1/{phspectra_keys.chunk_sk(0)}"
    )
    assert rows["video-stuck-jobs"]["detail"].endswith(": job-old (created)")
    assert rows["gpu-stuck-jobs"]["detail"].endswith(": gpu-job-1 (PENDING_RESTART)")
    assert rows["gpu-nodes-out-of-service"]["detail"].endswith(": node-a (FAILED)")
    assert rows["records-dead-letter-archive"]["value"] == 1
    assert all(r["incident"] == "opened" and r["notified"] == "sent now" for r in rows.values())
    subjects = sorted(s for s, _ in health)
    assert subjects == sorted(f"{rows[n]['severity']} ALARM {n} ({rows[n]['pipeline']}): incident 1" for n in ALARMS)
    assert {
        n: rows[n]["severity"]
        for n in (
            "records-dead-letter-archive",
            "etl-failed-manifests",
            "etl-catalog-unregistered",
            "etl-iterator-age",
            "etl-files-pending",
            "gpu-stuck-jobs",
        )
    } == {
        "records-dead-letter-archive": "CRITICAL",
        "etl-failed-manifests": "CRITICAL",
        "etl-catalog-unregistered": "CRITICAL",
        "etl-iterator-age": "WARNING",
        "etl-files-pending": "WARNING",
        "gpu-stuck-jobs": "WARNING",
    }  # seed 001: DLQ and failures CRITICAL, backlog WARNING
    assert rows["etl-iterator-age"]["value"] >= TWO_HOURS - 60 and rows["etl-iterator-age"]["threshold"] == 60
    assert rows["etl-iterator-age"]["detail"].endswith(": 2026-11-20/f1.ndjson")
    # a second run while every incident lasts: nothing is sent again
    again = _by_name(check_health())
    assert all(r["incident"] == "ongoing" and r["notified"] not in ("-", "sent now") for r in again.values())
    assert len(health) == len(ALARMS)


def test_an_incident_notifies_again_only_after_it_clears_and_recurs(health, tables, store_root):
    key = make_dead_letter()
    check_health()
    assert [s for s, _ in health] == ["CRITICAL ALARM records-dead-letter-archive (records): incident 1"]
    check_health()
    assert len(health) == 1
    (store_root / key).unlink()  # replayed: the archive is empty
    rows = _by_name(check_health())
    assert (
        rows["records-dead-letter-archive"]["state"] == "OK"
        and rows["records-dead-letter-archive"]["incident"] == "cleared"
    )
    item = incidents.get("records-dead-letter-archive")
    assert item["status"] == incidents.CLEARED and "cleared_at" in item
    check_health()
    assert len(health) == 1
    make_dead_letter("m-2")
    rows = _by_name(check_health())
    assert (
        rows["records-dead-letter-archive"]["incident"] == "opened"
        and rows["records-dead-letter-archive"]["incident_no"] == 2
    )
    assert [s for s, _ in health][1:] == ["CRITICAL ALARM records-dead-letter-archive (records): incident 2"]
    check_health()
    assert len(health) == 2


def test_concurrent_health_runs_send_one_notification_per_incident(health, tables):
    make_all(tables)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def one() -> None:
        barrier.wait()
        try:
            check_health()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(s for s, _ in health) == sorted({s for s, _ in health}) and len(health) == len(ALARMS)


def test_a_check_that_cannot_read_its_records_is_an_alarm_with_the_reason(health, tables, monkeypatch):
    monkeypatch.setenv("TABLE_ECS_NODE", "no-such-table")
    rows = _by_name(check_health())
    node = rows["gpu-nodes-out-of-service"]
    assert node["state"] == "ERROR" and "ResourceNotFoundException" in node["detail"] and node["notified"] == "sent now"
    assert rows["gpu-stuck-jobs"]["state"] == "OK"  # the other checks still ran
    check_health()
    assert len(health) == 1


def test_the_flow_shows_every_alarm_in_a_table_artifact(health, tables):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.health import pipeline_health

    make_gpu_records(tables)
    rows = pipeline_health()
    assert {r["name"] for r in rows if r["state"] == "ALARM"} == {"gpu-stuck-jobs", "gpu-nodes-out-of-service"}
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["pipeline-health"]))
        )
    latest = max(artifacts, key=lambda a: a.created)
    table = json.loads(latest.data) if isinstance(latest.data, str) else latest.data
    assert {r["name"]: (r["state"], r["severity"]) for r in table}["gpu-nodes-out-of-service"] == ("ALARM", "WARNING")
    assert latest.description.startswith(f"2 of {len(table)} alarm(s) firing")
    with get_client(sync_client=True) as client:
        boards = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["pipeline-dashboard"]))
        )
    board = max(boards, key=lambda a: a.created).data
    assert board.startswith("# Pipelines, last 24 hours") and "| gpu | 0 jobs | 0 | - |" in board
    assert board.endswith(f"pipelines v{VERSION}")  # the release that drew it


# --------------------------------------------------------------------------- crash points


def child_check(notify_file: str) -> list[dict]:
    """The crash child's step: one health pass whose notifications are appended to ``notify_file``."""

    def send(subject: str, body: str, block: str | None = None) -> str:
        with open(notify_file, "a") as handle:
            handle.write(subject + "\n")
        return "file"

    incidents.deliver = send  # this child process only
    only_record_alarms()  # as the health fixture: only the record alarms, whose writes the test counts
    return check_health()


@pytest.mark.sweep  # a child killed at each write: `make test-sweep`, which CI runs
def test_crash_points_of_a_health_run_lose_no_notification(health, tables, tmp_path, monkeypatch):
    monkeypatch.setenv("HEALTH_NOTIFY_LEASE_SECONDS", "0")  # the next run takes over a dead run's claim at once
    alarm = "records-dead-letter-archive"
    make_dead_letter()
    sent_file = tmp_path / "sent.txt"
    call, kwargs = "tests.health.test_health:child_check", {"notify_file": str(sent_file)}
    writes = count_writes(call, kwargs, tmp_path / "writes.log")
    # open (create-if-absent), claim the notification, [send], confirm it
    assert [w.operation for w in writes] == ["put", "update", "update"]
    exercised = 0
    for number in crash_points(writes):
        # "after N" = between writes; "before" the confirm = after the send, the one window that sends twice
        for when in ("after", "before") if number == 3 else ("after",):
            state_store.delete_if(tables["health_incidents"], {"alarm": alarm})
            sent_file.unlink(missing_ok=True)
            result = run_child(call, kwargs, f"{number}:kill:{when}")
            assert killed(result), result.stderr[-2000:]
            child_check(str(sent_file))  # the next scheduled pipeline-health run
            item = incidents.get(alarm)
            assert item["status"] == incidents.OPEN and item.get("notified_at"), (number, when, item)
            sent = sent_file.read_text().splitlines()
            assert sent == [f"CRITICAL ALARM {alarm} (records): incident 1"] * (
                2 if (number, when) == (3, "before") else 1
            )
            exercised += 1
    print(f"pipeline-health: {exercised} crash points exercised ({len(writes)} writes per incident)")
    assert health == []


def test_thresholds_and_the_notification_target_come_from_the_saved_blocks(
    tables, store_root, monkeypatch, webhook, record_alarms_only
):
    """As deployed: no HEALTH_* variables, the `HealthThresholds` block saved as `default` on the server, its
    `notify_block` a real notification block (a webhook on loopback)."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    from blocks.base import clear_cache
    from blocks.health import HealthThresholds
    from flows.health import pipeline_health

    monkeypatch.delenv("PIPELINES_USE_BLOCKS", raising=False)
    monkeypatch.delenv("PIPELINES_NOTIFY_BLOCK", raising=False)
    url, received = webhook
    CustomWebhookNotificationBlock(
        name="health", url=url, json_data={"subject": "{{subject}}", "body": "{{body}}"}
    ).save("test-health-hook", overwrite=True)
    make_dead_letter("m-1")
    make_dead_letter("m-2")
    try:
        # above the block's threshold (1, where the default is 0): the alarm fires and notifies through the block
        HealthThresholds(dead_letter_max=1, notify_block="custom-webhook/test-health-hook").save(
            "default", overwrite=True
        )
        clear_cache()
        rows = _by_name(pipeline_health())
        assert (
            rows["records-dead-letter-archive"]["state"] == "ALARM"
            and rows["records-dead-letter-archive"]["value"] == 2
        )
        assert [r["subject"] for r in received] == ["CRITICAL ALARM records-dead-letter-archive (records): incident 1"]
        assert {n for n, r in rows.items() if r["state"] != "OK"} == {"records-dead-letter-archive"}
        # the threshold raised in the block (as in the UI): the same records are no alarm, and nothing is sent
        HealthThresholds(dead_letter_max=5, notify_block="custom-webhook/test-health-hook").save(
            "default", overwrite=True
        )
        clear_cache()
        rows = _by_name(pipeline_health())
        assert rows["records-dead-letter-archive"]["state"] == "OK" and len(received) == 1
        assert (
            state_store.get_item(tables["health_incidents"], {"alarm": "records-dead-letter-archive"})["status"]
            == "CLEARED"
        )
    finally:
        HealthThresholds.delete("default")
        clear_cache()


def test_the_iterator_age_counts_only_files_a_full_batch_could_have_taken():
    from tasks.etl.alarms import iterator_age

    def item(date: str, name: str, seconds_ago: int) -> dict:
        return {"date_prefix": date, "file_key": name, "created_at": iso_ago(seconds_ago)}

    filling = [item("2026-01-02", "a", 7200)]  # one file of a date still filling its batch of 2: waits by design
    assert iterator_age(filling, 2) == (0, None)
    backlog = filling + [item("2026-01-03", "b", 90), item("2026-01-03", "c", 30)]
    age, oldest = iterator_age(backlog, 2)
    assert 89 <= age <= 95 and oldest == "2026-01-03/b"  # past the seed's 60 s
