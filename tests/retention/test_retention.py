"""Retention with an injected clock: finished records get a ttl counted from when they ended, live ones never
(and lose one they had), dead staging and opted-in old dead letters are deleted, waiting dead letters never."""

from __future__ import annotations

from datetime import UTC, datetime

from tasks.core import state_store
from tasks.core.config import object_store
from tasks.etl import keys as etl_keys
from tasks.phspectra import keys as phspectra_keys
from tasks.phspectra import sealing, survey
from tasks.records import keys as records_keys
from tasks.retention.sweep import apply_retention
from tests.helpers.retention import ENDED, aged, make_records

ENDED_EPOCH = int(datetime.fromisoformat(ENDED).timestamp())
THIRTY_DAYS = 30 * 86400


def item(tables: dict, logical: str, key: dict) -> dict:
    return state_store.to_plain(state_store.get_item(tables[logical], key))


def test_finished_records_get_a_ttl_from_when_they_ended_and_live_ones_never(etl_env):
    tables = etl_env["tables"]
    make_records(tables)
    report = apply_retention(record_days=30)
    made = ["phspectra_runs", "video_jobs", "ecs_job", "health_incidents"]  # the tables make_records fills
    assert [(report["stamped"][t], report["unstamped"][t]) for t in made] == [(1, 0), (1, 1), (1, 0), (1, 0)]
    # another pipeline's table (one scaffolded beside them) is visited and holds nothing to stamp
    assert all(report["stamped"][t] == report["unstamped"][t] == 0 for t in report["stamped"].keys() - set(made))
    ttl = ENDED_EPOCH + THIRTY_DAYS
    for logical, key in (
        ("phspectra_runs", {"PK": "run-done", "SK": phspectra_keys.RUN_SK}),
        ("phspectra_runs", {"PK": "run-done", "SK": phspectra_keys.chunk_sk(0)}),
        ("video_jobs", {"job_id": "v-done"}),
        ("video_segment_completions", {"job_id": "v-done", "segment_index": 0}),
        ("video_reassembly_locks", {"job_id": "v-done"}),
        ("ecs_job", {"job_id": "g-done"}),
        ("ecs_task", {"ecs_task_id": "t-1"}),
        ("health_incidents", {"alarm": "cleared"}),
    ):
        assert item(tables, logical, key)["ttl"] == ttl, (logical, key)
    for logical, key in (
        ("phspectra_runs", {"PK": "run-live", "SK": phspectra_keys.RUN_SK}),
        ("phspectra_runs", {"PK": "run-live", "SK": phspectra_keys.chunk_sk(0)}),
        ("video_jobs", {"job_id": "v-reopened"}),
        ("ecs_job", {"job_id": "g-live"}),
        ("ecs_task", {"ecs_task_id": "t-2"}),
        ("health_incidents", {"alarm": "open"}),
    ):
        assert "ttl" not in item(tables, logical, key), (logical, key)
    again = apply_retention(record_days=30)
    assert set(again["stamped"].values()) == set(again["unstamped"].values()) == {0}


def test_every_table_with_retention_has_dynamodb_ttl_enabled(etl_env):
    tables = etl_env["tables"]
    client = state_store.client()
    for logical in (
        "phspectra_runs",
        "video_jobs",
        "video_segment_completions",
        "ecs_job",
        "ecs_task",
        "health_incidents",
    ):
        described = client.describe_time_to_live(TableName=tables[logical])["TimeToLiveDescription"]
        assert (described["TimeToLiveStatus"], described["AttributeName"]) == ("ENABLED", "ttl"), logical


def test_dead_staging_and_opted_in_failed_dead_letters_age_out_waiting_ones_never(etl_env):
    root = etl_env["root"]
    now = datetime.now(UTC)
    dead = etl_keys.merged_staging_prefix("2026-01-01", "batch-0001.json", "dead") + "part-00000.parquet"
    live = etl_keys.merged_staging_prefix("2026-01-02", "batch-0002.json", "live") + "part-00000.parquet"
    waiting = records_keys.dead_letter_key("2026-01-01", "m-waiting")
    failed_old, failed_new = (
        records_keys.dead_letter_failed_key("2026-01-01", "m-old"),
        records_keys.dead_letter_failed_key("2026-11-01", "m-new"),
    )
    for key, days in ((dead, 3), (live, 1), (waiting, 300), (failed_old, 30), (failed_new, 1)):
        aged(root, key, days, now)

    report = apply_retention(record_days=30, now=now)
    assert report["deleted_objects"] == {"etl-staging": 1, "dead-letter-failed": 0}  # dead letters: off by default
    assert not (root / dead).exists() and (root / live).exists()

    report = apply_retention(record_days=30, dead_letter_days=14, now=now)
    assert report["deleted_objects"] == {"etl-staging": 0, "dead-letter-failed": 1}
    assert sorted(object_store().list(records_keys.DEAD_LETTER_PREFIX)) == sorted([waiting, failed_new])


def test_a_resumed_run_keeps_its_chunks_for_good_once_retention_passes(etl_env):
    tables = etl_env["tables"]
    run_id = "run-resumed"
    run = {
        "PK": run_id,
        "SK": phspectra_keys.RUN_SK,
        "status": survey.RUN_COMPLETED,
        "completed_at": ENDED,
        "jobs_total": 2,
    }
    state_store.put(tables["phspectra_runs"], {**run, **sealing.seal_run(run)})  # as its split wrote it
    for start in (0, 1):
        state_store.put(
            tables["phspectra_runs"], {"PK": run_id, "SK": phspectra_keys.chunk_sk(start), "status": "COMPLETED"}
        )
    apply_retention(record_days=30)
    chunks = [{"PK": run_id, "SK": phspectra_keys.chunk_sk(start)} for start in (0, 1)]
    assert [item(tables, "phspectra_runs", key)["ttl"] for key in chunks] == [ENDED_EPOCH + THIRTY_DAYS] * 2
    survey.reopen_run(run_id)  # a resume: the RUN item is live again and loses its own ttl, not its chunks'
    assert "ttl" not in item(tables, "phspectra_runs", {"PK": run_id, "SK": phspectra_keys.RUN_SK})
    report = apply_retention(record_days=30)
    assert report["unstamped"]["phspectra_runs"] == 2  # the two chunks DynamoDB would have deleted under a live run
    assert [("ttl" in item(tables, "phspectra_runs", key)) for key in chunks] == [False, False]
    assert apply_retention(record_days=30)["unstamped"]["phspectra_runs"] == 0
