"""Crash-point sweep of `pipelines-retention`: one pass dies at each chosen write (a ttl stamped or taken off, a
child item's, an object deleted), then the next scheduled pass runs. Then every record and child item carries
exactly the ttl of a pass that never crashed, live ones none, and only the objects such a pass deletes are gone
(merge staging still in use and dead letters still waiting are kept)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tasks.core import state_store
from tasks.core.object_store import LocalStore
from tasks.etl import keys as etl_keys
from tasks.phspectra import keys as phspectra_keys
from tasks.records import keys as records_keys
from tasks.retention.sweep import ITEMS_PENDING, apply_retention
from tests.helpers.crashpoints import count_writes, crash_points, killed, report, run_child
from tests.helpers.retention import aged, make_records

pytestmark = pytest.mark.crashpoints  # `make test-sweep` takes every write; by hand 3 sampled points

TABLES = {
    "phspectra_runs": ("PK", "SK"),
    "video_jobs": ("job_id",),
    "video_segment_completions": ("job_id", "segment_index"),
    "video_reassembly_locks": ("job_id",),
    "ecs_job": ("job_id",),
    "ecs_task": ("ecs_task_id",),
    "health_incidents": ("alarm",),
}


def retention_pass(now: str) -> dict:
    """The child's step: one pass of `pipelines-retention` (its task body) at ``now``, failed dead letters included."""
    return apply_retention(record_days=30, dead_letter_days=14, now=datetime.fromisoformat(now))


def _land(tables: dict, root, now: datetime) -> None:
    """The records of tests/helpers/retention.py (a put replaces an item whole: any ttl goes) and aged objects."""
    make_records(tables)
    for key, days in _objects().items():
        aged(root, key, days, now)


def _objects() -> dict[str, float]:
    return {
        etl_keys.merged_staging_prefix("2026-01-01", "batch-0001.json", "dead") + "part-00000.parquet": 3,
        etl_keys.merged_staging_prefix("2026-01-02", "batch-0002.json", "live")
        + "part-00000.parquet": 1,  # in use: kept
        records_keys.dead_letter_key("2026-01-01", "m-waiting"): 300,  # waiting for a replay: kept
        records_keys.dead_letter_failed_key("2026-01-01", "m-old"): 30,
        records_keys.dead_letter_failed_key("2026-11-01", "m-new"): 1,
    }


def _state(tables: dict, root) -> dict:
    """Every item's key with its ttl (None: none) and any pass's unfinished mark, and the objects left."""
    items = {}
    for logical, key_names in TABLES.items():
        for item in state_store.scan_all(tables[logical]):
            key = (logical,) + tuple(str(item[k]) for k in key_names)
            items[key] = (state_store.to_plain(item.get("ttl")), ITEMS_PENDING in item)
    return {"items": dict(sorted(items.items())), "objects": sorted(LocalStore(root).list(""))}


@pytest.mark.timeout(900)  # a child process a point: a loaded machine needs the room
def test_retention_survives_a_crash_at_every_write(etl_env, tmp_path):
    tables, root = etl_env["tables"], etl_env["root"]
    now = datetime.now(UTC)
    _land(tables, root, now)
    call, kwargs = "tests.retention.test_crashpoints_retention:retention_pass", {"now": now.isoformat()}
    writes = count_writes(call, kwargs, tmp_path / "w.log")
    expected = _state(tables, root)
    ttl = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() + timedelta(days=30).total_seconds())
    assert {k: v for k, v in expected["items"].items() if v[0] is not None} == {
        ("phspectra_runs", "run-done", phspectra_keys.RUN_SK): (ttl, False),
        ("phspectra_runs", "run-done", phspectra_keys.chunk_sk(0)): (ttl, False),
        ("video_jobs", "v-done"): (ttl, False),
        ("video_segment_completions", "v-done", "0"): (ttl, False),
        ("video_reassembly_locks", "v-done"): (ttl, False),
        ("ecs_job", "g-done"): (ttl, False),
        ("ecs_task", "t-1"): (ttl, False),
        ("health_incidents", "cleared"): (ttl, False),
    }
    assert not any(pending for _, pending in expected["items"].values())
    kept = {k for k, days in _objects().items() if "live" in k or "m-waiting" in k or "m-new" in k}
    assert set(expected["objects"]) == kept
    kinds = {w.kind for w in writes}
    assert {"objects:delete:pipeline", "objects:delete:dead-letter-archive"} <= kinds, kinds

    # dying before write N is dying after N-1 was answered: "before" each point, and after the last; always before
    # write 2, the first parent's first item (its stamp landed, its items' not yet: what a rerun must finish)
    assert [w.target.split("/")[0] for w in writes[:2]] == [tables["phspectra_runs"]] * 2
    points = sorted(set(crash_points(writes)) | {2})
    plans = [f"{n}:kill:before" for n in points] + [f"{writes[-1].number}:kill:after"]
    for plan in plans:
        _land(tables, root, now)
        result = run_child(call, kwargs, plan)
        assert killed(result), f"{plan}: the child was not killed\n{result.stderr[-2000:]}"
        retention_pass(now.isoformat())  # the next scheduled pass
        assert _state(tables, root) == expected, plan
    report(f"retention: {len(plans)} crash points exercised of {len(writes)} writes ({', '.join(sorted(kinds))})")
