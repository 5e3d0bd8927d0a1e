"""A sixth pipeline is one declaration: registered, its table is created and tables, limits, landing, retention,
health, reconcile and the dashboard visit it, with no shared module edited.

The toy pipeline's hooks live in this module (``tests.house.test_pipeline_registry:…``), as a package's would live
in its ``tasks/<name>/`` modules.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from blocks.health import HealthThresholds
from tasks import reconcile
from tasks.core import config, limits, registry, state_store
from tasks.core.registry import OBJECTS, Landing, Pipeline, QueueSpec, Table
from tasks.core.tables import TableSpec
from tasks.health.checks import Alarm, count_alarm
from tasks.health.dashboard import Figures, Outcomes, Window, dashboard
from tasks.reconcile.adapters import TableAdapter
from tasks.retention.sweep import Rule

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

HERE = __name__
TOY = Pipeline(
    name="toy",
    seed=50,
    tables={"toy_items": Table(TableSpec("item_id", ttl_attribute="ttl"), "toy-items-{env}")},
    landing=Landing(
        "toy-listen", "toy/incoming/", QueueSpec("toy-{env}", "toy-dlq-{env}", 60, OBJECTS, "toy/incoming/")
    ),
    flows=("toy-run",),
    maintenance_flows=("toy-sweep",),
    health_checks=f"{HERE}:CHECKS",
    severities={"toy-items-stuck": "CRITICAL"},
    retention_rules=f"{HERE}:RULES",
    reconcile_adapters=f"{HERE}:ADAPTERS",
    dashboard=f"{HERE}:figures",
)


def _items() -> list[dict]:
    return list(state_store.scan_all(config.table_name("toy_items")))


def toy_items_stuck(limits_: HealthThresholds) -> Alarm:
    """Toy items in status STUCK."""
    stuck = [item["item_id"] for item in _items() if item.get("status") == "STUCK"]
    return count_alarm("toy-items-stuck", "toy", stuck, 0, "toy item(s) stuck")


def figures(window: Window) -> Figures:
    """Toy items DONE or FAILED (all of them: the toy keeps no times)."""
    return Figures(
        Outcomes.of("toy", "items", _items(), "status", "DONE", "FAILED", lambda item: True), summary="**toy:** counted"
    )


CHECKS = {toy_items_stuck: ("toy-items-stuck",)}
RULES = (Rule("toy_items", ("item_id",), "status", ("DONE", "FAILED"), ("ended_at",)),)
ADAPTERS = (TableAdapter("toy", "toy_items", "status", "RUNNING", None, "FAILED", ("item_id",), flow_level=True),)


@pytest.fixture
def toy():
    """The toy pipeline declared for one test (declared before the ``tables`` fixture makes the tables)."""
    with registry.registered(TOY):
        yield TOY


def _put(item_id: str, **attributes) -> None:
    state_store.put(config.table_name("toy_items"), {"item_id": item_id, **attributes})


def test_a_declared_pipeline_gets_its_table_limits_and_landing_queue(toy, tables):
    description = state_store.client().describe_table(TableName=tables["toy_items"])["Table"]
    assert description["KeySchema"] == [{"AttributeName": "item_id", "KeyType": "HASH"}]
    ttl = state_store.client().describe_time_to_live(TableName=tables["toy_items"])["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "ttl" and ttl["TimeToLiveStatus"] in ("ENABLED", "ENABLING")
    assert config.table_name("toy_items") == tables["toy_items"]
    assert registry.default_table_names("prod")["toy_items"] == "toy-items-prod"
    assert (
        "toy-sweep" in limits.maintenance_flows() and limits.flow_timeout("toy-sweep") == limits.MAINTENANCE_TIMEOUT_S
    )
    from tasks.landing import sqs

    assert sqs.queue_spec("toy").names("prod") == ("toy-prod", "toy-dlq-prod")
    from tasks.health import service_alarms

    assert "toy-run" in service_alarms.pipeline_flows()


def test_retention_stamps_a_declared_pipelines_finished_records_and_leaves_live_ones(toy, tables):
    from tasks.retention.sweep import apply_retention

    ended = datetime.now(UTC) - timedelta(days=2)
    _put("done", status="DONE", ended_at=ended.isoformat())
    _put("live", status="RUNNING", ended_at=ended.isoformat())
    report = apply_retention(record_days=1)
    assert report["stamped"]["toy_items"] == 1
    by_id = {item["item_id"]: item for item in _items()}
    assert int(by_id["done"]["ttl"]) == int(ended.timestamp()) + 86400
    assert "ttl" not in by_id["live"]


def test_health_raises_a_declared_pipelines_alarm_with_its_severity(toy, tables, store_root, record_alarms_only):
    from tasks.health.run import check_health

    _put("a", status="STUCK")
    _put("b", status="DONE")
    rows = {row["name"]: row for row in check_health()}
    assert (rows["toy-items-stuck"]["value"], rows["toy-items-stuck"]["state"]) == (1, "ALARM")
    assert rows["toy-items-stuck"]["severity"] == "CRITICAL"


def test_the_dashboard_shows_a_declared_pipelines_outcomes(toy, tables, store_root):
    _put("a", status="DONE")
    _put("b", status="FAILED")
    markdown, rows = dashboard({})
    assert {"pipeline": "toy", "unit": "items", "ended": 2, "failed": 1, "failure rate": "50.0%"} in rows
    assert "**toy:** counted" in markdown


def test_reconcile_repairs_a_declared_pipelines_record_whose_run_ended(toy, tables):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    @flow(name="toy-run")
    def toy_run() -> None:
        """Never run: its flow run is created Crashed."""

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(toy_run, state=Crashed())
    _put("held", status="RUNNING", prefect_flow_run_id=str(run.id))
    assert "toy" in reconcile.adapters()
    findings = reconcile.reconcile(["toy"], dry_run=False)
    assert [(f.pipeline, f.record, f.outcome) for f in findings] == [("toy", "held", "applied")]
    assert {item["item_id"]: item["status"] for item in _items()} == {"held": "FAILED"}


def test_a_pipeline_leaves_the_registry_with_its_block():
    with registry.registered(TOY):
        assert registry.pipeline("toy") is TOY
    assert "toy" not in {p.name for p in registry.pipelines()}
    with pytest.raises(ValueError, match="unknown pipeline 'toy'"):
        registry.pipeline("toy")
