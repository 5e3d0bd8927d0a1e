"""One message must not break the Prefect UI for everyone (issue 12 item 7, Prefect issue #15031): records-ingest
takes text bodies or an object-store URL, and refuses parameters the server could not list, before the run exists.
Against the real test Prefect server: its flow-run listing still answers after each case."""

from __future__ import annotations

import json

import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterId

from flows.records import UnservableParameters, parameter_problems, records_ingest
from tasks.core import state_store
from tasks.core.runtime import today_iso
from tasks.records import messages as records_messages
from tasks.records.keys import dead_letter_prefix
from tests.helpers.records import message

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

FAR = 10**20  # a schema-valid-looking workflow_start_time beyond 64 bits


def _ingest_runs() -> list:
    """Every records-ingest flow run, through the listing that #15031 breaks (read_flow_runs)."""
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["records-ingest"])))


def _status(tables, granule_id: str) -> str | None:
    item = state_store.get_item(tables["granules"], {"granuleId": granule_id})
    return item and item.get("status")


def test_a_text_body_with_a_huge_integer_is_archived_and_the_runs_still_list(tables, store_root):
    bodies = [
        json.dumps(message("completed", "exec-a", 1000, granule="G1")),
        json.dumps(message("completed", "exec-far", FAR, granule="G2")),
    ]
    summary = records_ingest(bodies)
    assert (summary["ok"], summary["archived"]) == (1, 1)
    assert _status(tables, "G1") == "completed" and _status(tables, "G2") == "failed"
    runs = _ingest_runs()  # before the fix the server answered 500 to this once such a run existed
    assert any(run.parameters == {"messages": bodies, "messages_url": None} for run in runs)


def test_parsed_messages_holding_a_huge_integer_are_refused_before_a_run_exists(tables, store_root):
    before = {run.id for run in _ingest_runs()}
    with pytest.raises(
        UnservableParameters, match=r"messages/0/cumulus_meta/workflow_start_time: integer beyond 64 bits"
    ):
        records_ingest([message("completed", "exec-far", FAR, granule="G2")])
    assert {run.id for run in _ingest_runs()} == before  # no run was created, and the listing answers
    assert _status(tables, "G2") is None


def test_parameters_over_prefect_clouds_cap_are_refused_with_the_way_out():
    with pytest.raises(UnservableParameters, match=r"exceed 524288 \(Prefect Cloud's cap\).*pass messages_url"):
        records_ingest(["x" * 600_000])


def test_parameter_problems_name_every_path():
    value = {"a": [1, 2**64, -(2**63) - 1], "b": {"c": float("nan"), "d": 2**64 - 1, "e": True}, "f": "10" * 30}
    assert parameter_problems(value) == [
        "a/1: integer beyond 64 bits",
        "a/2: integer beyond 64 bits",
        "b/c: nan is not JSON",
    ]


def test_a_batch_by_object_store_url(tables, store_root):
    batch = [
        message("completed", "exec-a", 1000, granule="G1"),
        message("failed", "exec-far", FAR, granule="G2"),
        '{"truncated": ',
    ]
    (store_root / "batches").mkdir()
    (store_root / "batches" / "b1.json").write_text(json.dumps(batch))
    summary = records_ingest(messages_url=(store_root / "batches" / "b1.json").as_uri())
    assert (summary["messages"], summary["ok"], summary["archived"]) == (3, 1, 2)
    assert sorted(e["type"] for e in summary["errors"].values()) == ["SchemaValidationError", "UnparsableMessage"]
    assert _status(tables, "G1") == "completed"
    assert len(list((store_root / dead_letter_prefix(today_iso())).iterdir())) == 2
    # one body per line works too; a missing file is a clear error
    (store_root / "batches" / "b2.ndjson").write_text(
        json.dumps(message("running", "exec-b", 2000, granule="G3")) + "\n"
    )
    assert records_messages.ingest_messages(messages_url=(store_root / "batches" / "b2.ndjson").as_uri())["ok"] == 1
    with pytest.raises(FileNotFoundError):
        records_messages.ingest_messages(messages_url=(store_root / "batches" / "nope.json").as_uri())
    with pytest.raises(ValueError, match="either as messages .* or as messages_url"):
        records_messages.ingest_messages(["{}"], messages_url="file:///x.json")
    assert any((run.parameters.get("messages_url") or "").endswith("b1.json") for run in _ingest_runs())


def test_a_deployment_run_with_a_huge_integer_is_refused_by_the_server(tables):
    """The external entry point: `prefect deployment run` / run_deployment, with schema enforcement (prefect.yaml)."""
    deployment_id = records_ingest.to_deployment(name="parameters-test", enforce_parameter_schema=True).apply()
    with get_client(sync_client=True) as client:
        with pytest.raises(Exception, match="Validation failed"):
            client.create_flow_run_from_deployment(
                deployment_id, parameters={"messages": [message("completed", "exec-far", FAR, granule="G2")]}
            )
        run = client.create_flow_run_from_deployment(
            deployment_id, parameters={"messages": [json.dumps(message("completed", "exec-far", FAR, granule="G2"))]}
        )
        listed = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
        assert [r.id for r in listed] == [run.id]
        client.delete_flow_run(run.id)  # never executed: no worker in tests
        client.delete_deployment(deployment_id)
