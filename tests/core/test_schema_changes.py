"""Schema changes on live tables (DynamoDB Local): what DynamoDB adds online is added, what it cannot is refused
with the steps, and a release's data migrations resume after a crash and touch every item exactly once."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tasks.core import faults, migrations, state_store
from tasks.core.object_store import ObjectStore
from tasks.core.state_store import unchanged
from tasks.core.tables import Index, SchemaMismatch, TableSpec, ensure_table

OLD = TableSpec("job_id")  # the previous release's table: a key, nothing else
NEW = TableSpec(
    "job_id",
    gsis=(Index("status-index", "status", "created_at"), Index("owner-index", "owner")),
    ttl_attribute="expires_at",
)
OWNER_QUERY = {
    "IndexName": "owner-index",
    "KeyConditionExpression": "#o = :o",
    "ExpressionAttributeNames": {"#o": "owner"},
    "ExpressionAttributeValues": {":o": "o"},
}


def _old_table(items: int) -> str:
    """A table of the old schema with ``items`` items, as the previous release left it."""
    name = f"schema-old-{uuid.uuid4().hex[:8]}"
    assert ensure_table(name, OLD) == "created"
    state_store.batch_put(
        name, ({"job_id": f"j{i:04d}", "status": "DONE", "created_at": f"t{i}", "owner": "o"} for i in range(items))
    )
    return name


@pytest.fixture
def own_dynamodb(tmp_path, monkeypatch):
    """A DynamoDB Local of the test's own. On the session's, after other tests' tables, an index added by UpdateTable
    stayed CREATING (seen in `make test`; the same test alone passes): docs/operations.md, "Schema changes"."""
    import boto3

    from deployments.backup import private_dynamodb

    with private_dynamodb(tmp_path / "dynamodb", tmp_path / "dynamodb.log") as client:
        monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", client.meta.endpoint_url)
        boto3.DEFAULT_SESSION = None  # it read the credentials once; the private instance has its own key
        state_store.reset_clients()
        yield
    boto3.DEFAULT_SESSION = None
    state_store.reset_clients()


def _gsis(name: str) -> dict[str, str]:
    table = state_store.client().describe_table(TableName=name)["Table"]
    return {g["IndexName"]: g["IndexStatus"] for g in table.get("GlobalSecondaryIndexes", [])}


def test_new_indexes_and_ttl_are_added_to_a_live_table_one_after_another(own_dynamodb):
    name = _old_table(30)
    assert ensure_table(name, NEW) == "updated (GSI status-index, GSI owner-index, TTL)"
    assert _gsis(name) == {"status-index": "ACTIVE", "owner-index": "ACTIVE"}
    ttl = state_store.client().describe_time_to_live(TableName=name)["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "expires_at" and ttl["TimeToLiveStatus"] in ("ENABLED", "ENABLING")
    found = list(state_store.query_all(name, **OWNER_QUERY))
    assert len(found) == 30  # backfilled: the old items are in the new index
    assert ensure_table(name, NEW) == "exists"


def test_a_query_on_an_index_not_there_yet_waits_for_it(own_dynamodb):
    name = _old_table(5)
    found: list = []
    reader = threading.Thread(target=lambda: found.extend(state_store.query_all(name, **OWNER_QUERY)))
    reader.start()
    time.sleep(2.5)
    assert reader.is_alive() and not found  # held, not answered from an index that is not there
    ensure_table(name, NEW)
    reader.join(30)
    assert len(found) == 5


def test_a_key_change_is_refused_with_the_steps_and_the_copy_they_name_moves_every_item(dynamodb_endpoint, monkeypatch):
    name = _old_table(0)
    state_store.batch_put(name, ({"job_id": f"j{i}", "created_at": f"t{i}"} for i in range(250)))
    changed = TableSpec("job_id", "created_at")
    with pytest.raises(SchemaMismatch) as refused:
        ensure_table(name, changed, "ecs_job")
    message = str(refused.value)
    assert f"{name}: key schema is [('job_id', 'HASH')]" in message
    assert f"pipelines migrate copy-table ecs_job {name}-2" in message and "TABLE_ECS_JOB=" in message
    assert state_store.count(name, KeyConditionExpression="job_id = :j", ExpressionAttributeValues={":j": "j1"}) == 1

    monkeypatch.setenv("TABLE_MIGRATIONS", f"migrations-{uuid.uuid4().hex[:8]}")
    target = f"{name}-2"
    with faults.inject(at=2, mode="raise", kind=f"dynamodb:update:{migrations.table_name()}"):
        with pytest.raises(faults.InjectedFault):  # dies after copying page 2, before recording it
            migrations.copy_table("ecs_job", target, {"ecs_job": name})
    assert migrations.copy_table("ecs_job", target, {"ecs_job": name})["copy"] == "applied to 250 items"
    assert len(list(state_store.scan_all(target))) == 250
    assert migrations.copy_table("ecs_job", target, {"ecs_job": name})["copy"] == "done"


def _count_once(table: str) -> migrations.Migration:
    """A test release's migration: stamps each item with schema 2 and counts how often it was applied."""

    def apply(item, names):
        state_store.transition(
            names[table],
            {"job_id": item["job_id"]},
            None,
            None,
            set={"schema": 2},
            add={"applied": 1},
            condition=unchanged({"schema": None}, tag="s"),
        )

    return migrations.Migration("0001-stamp-schema-2", table, apply)


def test_a_migration_crashed_mid_way_resumes_and_applies_every_item_once(dynamodb_endpoint):
    name = _old_table(250)  # three pages
    records = f"migrations-{uuid.uuid4().hex[:8]}"
    names = {"jobs": name}
    migration = _count_once("jobs")
    assert migrations.run([migration], names, records, dry_run=True) == {"0001-stamp-schema-2": "pending"}
    with faults.inject(at=2, mode="raise", kind=f"dynamodb:update:{records}"):
        with pytest.raises(faults.InjectedFault):  # page 2 applied, its progress not recorded
            migrations.run([migration], names, records)
    assert migrations.run([migration], names, records, dry_run=True) == {
        "0001-stamp-schema-2": f"resumes after {migrations.PAGE_ITEMS} items"
    }
    assert migrations.run([migration], names, records) == {"0001-stamp-schema-2": "applied to 250 items"}
    items = list(state_store.scan_all(name))
    assert len(items) == 250 and {(i["schema"], i["applied"]) for i in items} == {(2, 1)}
    record = state_store.get_item(records, {"migration": "0001-stamp-schema-2"})
    assert record["status"] == "DONE" and record["items"] == 250
    assert migrations.run([migration], names, records) == {"0001-stamp-schema-2": "done"}


def test_pipelines_migrate_dry_run_lists_the_release_migrations(dynamodb_endpoint, monkeypatch, capsys):
    from deployments.cli import main

    monkeypatch.setenv("TABLE_MIGRATIONS", f"migrations-{uuid.uuid4().hex[:8]}")
    assert main(["migrate", "--dry-run"]) == 0
    assert capsys.readouterr().out.strip() == "{}"  # this release ships none: every change is additive


def test_the_object_store_layout_marker_is_written_then_checked(tmp_path):
    store = ObjectStore.from_url(tmp_path.as_uri())
    assert migrations.check_layout(store) == f"layout {migrations.LAYOUT_VERSION} (marker written)"
    assert migrations.check_layout(store) == f"layout {migrations.LAYOUT_VERSION}"
    store.put_bytes(migrations.LAYOUT_MARKER, b'{"layout": 99}')
    with pytest.raises(migrations.LayoutMismatch, match="newer version"):
        migrations.check_layout(store)
    assert store.get_bytes(migrations.LAYOUT_MARKER) == b'{"layout": 99}'


def test_up_runs_the_migrations_then_checks_the_layout(dynamodb_endpoint, monkeypatch, tmp_path):
    monkeypatch.setenv("TABLE_MIGRATIONS", f"migrations-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("OBJECT_STORE_BASE_URL", tmp_path.as_uri())
    from blocks.base import clear_cache

    clear_cache()
    assert migrations.upgrade_data() == [f"object store     layout {migrations.LAYOUT_VERSION} (marker written)"]
    assert (tmp_path / migrations.LAYOUT_MARKER).exists()


def migrate_in_child(table: str, records: str) -> None:
    """A child process's run of the test migration (``run_child``), for a crash that kills it for real."""
    migrations.run([_count_once("jobs")], {"jobs": table}, records)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_migration_killed_mid_way_resumes_and_applies_every_item_once(dynamodb_endpoint, when):
    from tests.helpers.crashpoints import run_child

    name, records = _old_table(250), f"migrations-{uuid.uuid4().hex[:8]}"
    ensure_table(records, migrations.TABLE_SPEC)
    child = run_child(
        "tests.core.test_schema_changes:migrate_in_child",
        {"table": name, "records": records},
        fault=f"2:kill:{when}:dynamodb:update:{records}",  # SIGKILL around the record of page 2
    )
    assert child.returncode == -9, child.stderr[-2000:]
    assert migrations.run([_count_once("jobs")], {"jobs": name}, records) == {
        "0001-stamp-schema-2": "applied to 250 items"
    }
    items = list(state_store.scan_all(name))
    assert len(items) == 250 and {(i["schema"], i["applied"]) for i in items} == {(2, 1)}
