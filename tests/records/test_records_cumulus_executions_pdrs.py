"""Cumulus's execution and PDR write tests, ported: each test names the Cumulus test it comes from (title and file).

Sources (nasa/cumulus): packages/api/tests/lib/writeRecords/test-write-execution.js (``WE``),
packages/db/tests/models/test-execution-model.js (``ME``),
packages/api/tests/lambdas/sf-event-sqs-to-db-records/test-write-pdr.js (``WP``),
packages/db/tests/models/test-pdr-model.js (``MP``).
"""

from __future__ import annotations

import pytest

from tasks.records import messages as records_messages
from tasks.records.rules import Verdict
from tests.helpers.records_cumulus import (
    COLLECTION_ID,
    NOW,
    START,
    arn,
    execution,
    granule,
    ingest,
    message,
    new_id,
    pdr,
    ported,
)

WE = "packages/api/tests/lib/writeRecords/test-write-execution.js"
ME = "packages/db/tests/models/test-execution-model.js"
WP = "packages/api/tests/lambdas/sf-event-sqs-to-db-records/test-write-pdr.js"
MP = "packages/db/tests/models/test-pdr-model.js"

pytestmark = pytest.mark.usefixtures("module_tables")

TASKS = {"task1": {"key": "value"}}


def workflow_message(status: str, name: str, start: int = START, **extra) -> dict:
    """The tests' cumulusMessage: workflow name and tasks in meta, a payload, no granules."""
    msg = message(
        status,
        name,
        start,
        meta={"workflow_name": "TestWorkflow", "workflow_tasks": TASKS},
        payload={"foo": "bar"},
        cumulus_meta={"cumulus_version": "9.0.0"},
    )
    for where, values in extra.items():
        msg[where].update(values) if where in ("cumulus_meta", "meta") else msg.__setitem__(where, values)
    return msg


def test_build_execution_record_for_running_execution():
    """WE: "buildExecutionRecord builds correct record for "running" execution"."""
    name = new_id("E")
    record, _, _ = records_messages.derive(workflow_message("running", name), NOW)
    assert {k: v for k, v in record.items() if v is not None} == {
        "arn": arn(name),
        "name": name,
        "status": "running",
        "type": "TestWorkflow",
        "tasks": TASKS,
        "originalPayload": {"granules": [], "foo": "bar"},
        "cumulusVersion": "9.0.0",
        "duration": 0,
        "error": {},
        "collectionId": COLLECTION_ID,
        "createdAt": START,
        "timestamp": NOW,
        "updatedAt": NOW,
        "processingStartDateTime": "2023-11-14T22:13:20.000+00:00",
    }


def test_build_execution_record_payload_for_non_running_execution():
    """WE: "buildExecutionRecord returns record with correct payload for non-running execution"."""
    record = records_messages.derive(workflow_message("completed", new_id("E")), NOW)[0]
    assert record["status"] == "completed" and "originalPayload" not in record
    assert record["finalPayload"] == {"granules": [], "foo": "bar"}


def test_build_execution_record_with_duration():
    """WE: "buildExecutionRecord returns record with duration": stop - start."""
    msg = workflow_message("completed", new_id("E"), cumulus_meta={"workflow_stop_time": START + 5000})
    assert records_messages.derive(msg, NOW)[0]["duration"] == 5


def test_build_execution_record_with_error():
    """WE: "buildExecutionRecord returns record with error"."""
    exception = {"Error": "fake error", "Cause": "an error occurred"}
    assert (
        records_messages.derive(workflow_message("failed", new_id("E"), exception=exception), NOW)[0]["error"]
        == exception
    )


def test_write_execution_saves_the_execution():
    """WE: "writeExecutionRecordFromMessage() saves execution to RDS/Elasticsearch if write to RDS is enabled"
    (the record; no Elasticsearch)."""
    name = new_id("E")
    assert ingest(workflow_message("running", name)).errors() == {}
    assert execution(name)["status"] == "running"


@ported(
    "writeExecutionRecordFromMessage() properly sets originalPayload on initial write "
    "and finalPayload on subsequent write",
    "writeExecutionRecordFromMessage() correctly sets both original_payload and final_payload in postgres "
    "when execution records are run in sequence",
)
def test_original_then_final_payload(title):
    """WE: the test named in ``title``."""
    name = new_id("E")
    ingest(workflow_message("running", name) | {"payload": {"original": "payload"}})
    ingest(workflow_message("completed", name) | {"payload": {"final": "payload"}})
    record = execution(name)
    assert (record["originalPayload"], record["finalPayload"], record["status"]) == (
        {"original": "payload"},
        {"final": "payload"},
        "completed",
    )


def test_out_of_order_writes_keep_both_payloads():
    """WE: "writeExecutionRecordFromMessage() properly handles out of order writes and correctly preserves
    originalPayload/finalPayload"."""
    name = new_id("E")
    ingest(workflow_message("completed", name) | {"payload": {"key": "final"}})
    ingest(workflow_message("running", name) | {"payload": {"key": "original"}})
    record = execution(name)
    assert (record["status"], record["finalPayload"], record["originalPayload"]) == (
        "completed",
        {"key": "final"},
        {"key": "original"},
    )


def test_running_does_not_replace_a_completed_execution():
    """WE: "writeExecutionRecordFromMessage() does not allow a running execution to replace a completed execution due
    to write constraints": the original payload is updated, status, final payload and tasks are kept."""
    name = new_id("E")
    ingest(workflow_message("running", name) | {"payload": {"original": "payload"}})
    ingest(workflow_message("completed", name) | {"payload": {"final": "payload"}})
    rerun = workflow_message("running", name) | {"payload": {"updatedOriginal": "updatedPayload"}}
    rerun["meta"]["workflow_tasks"] = None
    ingest(rerun)
    record = execution(name)
    assert (record["status"], record["originalPayload"], record["finalPayload"], record["tasks"]) == (
        "completed",
        {"updatedOriginal": "updatedPayload"},
        {"final": "payload"},
        TASKS,
    )


def test_rewrite_with_nulls_removes_final_payload_and_tasks():
    """WE: "writeExecutionRecordFromMessage() on re-write saves execution with expected values nullified"."""
    name = new_id("E")
    ingest(workflow_message("running", name) | {"payload": {"original": "payload"}})
    ingest(workflow_message("completed", name) | {"payload": {"final": "payload"}})
    nulled = workflow_message("completed", name) | {"payload": None}
    nulled["meta"]["workflow_tasks"] = None
    ingest(nulled)
    record = execution(name)
    assert (
        record["originalPayload"] == {"original": "payload"} and "finalPayload" not in record and "tasks" not in record
    )


def test_execution_upsert_creates_running_and_completed_executions():
    """ME: "ExecutionPgModel.upsert() creates new running execution" and "... creates new completed execution"."""
    running, completed = new_id("E"), new_id("E")
    ingest(workflow_message("running", running), workflow_message("completed", completed))
    assert (execution(running)["status"], execution(completed)["status"]) == ("running", "completed")


def test_execution_upsert_updates_only_allowed_fields_for_running():
    """ME: "ExecutionPgModel.upsert() updates only allowed fields for a running execution": createdAt, updatedAt,
    timestamp and the original payload change; the workflow name does not."""
    name = new_id("E")
    ingest(workflow_message("running", name))
    before = execution(name)
    later = workflow_message("running", name, start=START + 60_000) | {"payload": {"foo": "bar2"}}
    later["meta"]["workflow_name"] = "workflow-2"
    ingest(later, now=NOW + 60_000)
    after = execution(name)
    assert {k for k in after if after[k] != before.get(k)} == {"createdAt", "updatedAt", "timestamp", "originalPayload"}
    assert after["type"] == "TestWorkflow"


def test_execution_upsert_updates_a_completed_execution():
    """ME: "ExecutionPgModel.upsert() updates a completed execution"."""
    name = new_id("E")
    ingest(workflow_message("completed", name) | {"payload": {"key1": "value"}})
    ingest(workflow_message("completed", name) | {"payload": {"key2": "value"}})
    assert execution(name)["finalPayload"] == {"key2": "value"}


def test_execution_upsert_running_does_not_replace_completed():
    """ME: "ExecutionPgModel.upsert() will not allow a running execution to replace a completed execution"."""
    name = new_id("E")
    ingest(workflow_message("completed", name))
    ingest(workflow_message("running", name))
    assert execution(name)["status"] == "completed"


def test_execution_duration_is_stop_minus_start_and_zero_without_stop():
    """The issue's execution duration (Cumulus's getWorkflowDuration, as "buildExecutionRecord returns record with
    duration" and the running record's duration 0 show), written."""
    done, running = new_id("E"), new_id("E")
    ingest(
        workflow_message("completed", done, cumulus_meta={"workflow_stop_time": START + 7_500}),
        workflow_message("running", running),
    )
    assert (execution(done)["duration"], execution(running)["duration"]) == (7.5, 0)


# --------------------------------------------------------------------------- PDRs


def pdr_message(status: str, name: str, pdr_name: str, start: int = START, running=(), completed=(), failed=()) -> dict:
    """The PDR tests' cumulusMessage: the PDR and its executions by state in the payload."""
    return message(
        status,
        name,
        start,
        pdr=pdr_name,
        payload={"running": list(running), "completed": list(completed), "failed": list(failed)},
    )


def test_generate_pdr_record():
    """WP: "generatePdrRecord() generates correct PDR record"."""
    name, pdr_name = new_id("E"), new_id("PDR")
    msg = pdr_message("running", name, pdr_name, running=["arn3", "arn4"], completed=["arn1", "arn2"])
    msg["payload"]["pdr"].update(PANSent=False, PANmessage="test")
    assert records_messages.derive_pdr(msg, START + 3500) == {
        "pdrName": pdr_name,
        "status": "running",
        "PANSent": False,
        "PANmessage": "test",
        "stats": {"processing": 2, "completed": 2, "failed": 0, "total": 4},
        "progress": 50,
        "execution": arn(name),
        "collectionId": COLLECTION_ID,
        "provider": "prov",
        "createdAt": START,
        "updatedAt": START + 3500,
        "timestamp": START + 3500,
        "duration": 3.5,
    }


def test_no_pdr_on_the_message_writes_none():
    """WP: "writePdr() returns true if there is no PDR on the message"."""
    report = ingest(message("running", new_id("E"), START))
    assert [r.kind for r in report.outcomes[0].results] == ["execution"]


def test_a_pdr_message_without_collection_is_archived():
    """WP: "writePdr() throws an error if collection is not provided"."""
    msg = pdr_message("running", new_id("E"), new_id("PDR"))
    del msg["meta"]["collection"]
    report = ingest(msg)
    assert report.outcomes[0].error == {
        "type": "SchemaValidationError",
        "message": "meta: 'collection' is a required property",
    }


def test_a_pdr_message_without_provider_is_archived():
    """WP: "writePdr() throws an error if provider is not provided": the execution is written (it comes first),
    the PDR and the granules are not, the message is dead-lettered."""
    name, pdr_name, g = new_id("E"), new_id("PDR"), new_id("G")
    msg = pdr_message("running", name, pdr_name)
    msg["payload"]["granules"] = [{"granuleId": g}]
    del msg["meta"]["provider"]
    report = ingest(msg)
    assert report.outcomes[0].error == {
        "type": "PdrWithoutProvider",
        "message": f"PDR {pdr_name}: no meta.provider (a PDR record needs one)",
    }
    assert execution(name)["status"] == "running" and pdr(pdr_name) is None and report.outcomes[0].archived_key


def test_a_pdr_is_not_updated_from_the_same_execution_without_progress():
    """WP: "writePdr() does not update PDR record if update is from an older execution"."""
    name, pdr_name = new_id("E"), new_id("PDR")
    ingest(pdr_message("completed", name, pdr_name, completed=["arn1"]))
    report = ingest(pdr_message("running", name, pdr_name, running=["arn2"]))
    assert report.outcomes[0].results[1].verdict is Verdict.STALE
    assert (pdr(pdr_name)["status"], pdr(pdr_name)["stats"]["processing"], pdr(pdr_name)["stats"]["total"]) == (
        "completed",
        0,
        1,
    )


def test_write_pdr_saves_the_pdr():
    """WP: "writePdr() saves a PDR record to PostgreSQL"."""
    pdr_name = new_id("PDR")
    ingest(pdr_message("running", new_id("E"), pdr_name, running=["a"]))
    assert pdr(pdr_name)["status"] == "running"


# (Cumulus test title, first (status, execution, progress), second (status, execution, progress, createdAt offset),
#  whether the second write applies)
PDR_UPSERTS = [
    (
        "does not update record with same execution if progress is less than current",
        ("running", "A", 3),
        ("running", "A", 2, 0),
        False,
    ),
    (
        "overwrites record with same execution if progress is greater than current",
        ("running", "A", 1),
        ("running", "A", 4, 0),
        True,
    ),
    (
        'updates a "completed" record to "running" if execution is different and created_at is newer',
        ("completed", "A", 4),
        ("running", "B", 1, 10_000),
        True,
    ),
    (
        'does not update a "completed" record to "running" if execution is different and created_at is older',
        ("completed", "A", 4),
        ("running", "B", 1, -10_000),
        False,
    ),
    (
        "does not update a final (failed) record to a final state (completed) "
        "if execution is different but created_at is older",
        ("failed", "A", 4),
        ("completed", "B", 4, -10_000),
        False,
    ),
    (
        "does update a final (failed) record to a final state (completed) "
        "if execution is different but created_at is newer",
        ("failed", "A", 4),
        ("completed", "B", 4, 100_000),
        True,
    ),
]


@pytest.mark.parametrize("title, first, second, applies", PDR_UPSERTS, ids=[t[0] for t in PDR_UPSERTS])
def test_pdr_upsert(title, first, second, applies):
    """MP: "PdrPgModel.upsert() <title>"; progress as the share of 4 executions no longer running."""
    pdr_name, names = new_id("PDR"), {"A": new_id("E"), "B": new_id("E")}

    def write(status, who, done, offset=0):
        ingest(
            pdr_message(
                status, names[who], pdr_name, START + offset, running=["r"] * (4 - done), completed=["c"] * done
            )
        )

    write(*first)
    before = pdr(pdr_name)
    write(*second)
    after = pdr(pdr_name)
    if applies:
        assert (after["status"], after["execution"], after["progress"]) == (
            second[0],
            arn(names[second[1]]),
            25 * second[2],
        )
    else:
        assert after == before


MU = "packages/message/tests/test-utils.js"  # parseException, the error of an execution and of its granules


@pytest.mark.parametrize(
    ("exception", "error"),
    [
        (None, {}),  # MU: "parseExecption() returns an empty object if the exception is null or undefined"
        ({"a": 1}, {"a": 1}),  # MU: "parseException() returns the exception if it is an object"
        ("blah", {"Error": "Unknown Error", "Cause": "blah"}),  # MU: "... returns an Unknown Error object ..."
        ("None", {}),  # the Cumulus Message Adapter's success value: no error
    ],
    ids=["null", "object", "text", "None"],
)
def test_message_exception_becomes_the_records_error(exception, error):
    """The execution's and each granule's ``error`` from the message's ``exception`` (Cumulus's parseException)."""
    msg = message("completed", new_id("E"), START, {"granuleId": new_id("G"), "files": []}, exception=exception)
    record, granules, problems = records_messages.derive(msg, NOW)
    assert problems == [] and record["error"] == error and [g["error"] for g in granules] == [error]


def test_a_completed_message_with_exception_none_stores_no_error():
    """A successful workflow's message carries ``exception: "None"``: its completed execution and granule are
    stored without an error."""
    name, g = new_id("E"), new_id("G")
    assert ingest(message("completed", name, START, {"granuleId": g, "files": []}, exception="None")).errors() == {}
    stored = granule(g)
    assert (execution(name)["status"], execution(name)["error"]) == ("completed", {})
    assert (stored["status"], stored["error"]) == ("completed", {})


# execution names Step Functions accepts (StartExecution ``name``), beyond [A-Za-z0-9_-]
ALLOWED_NAMES = ["run.2024-01-01", "a+b", "ingest-ü-日本-éñ", "x" * 80, "'quoted'", "(1)=@!"]
# and what it refuses: empty, too long, white space, brackets, wildcards, special and control characters
REFUSED_NAMES = [
    "",
    "x" * 81,
    "a b",
    "a\tb",
    "a\u00a0b",
    "trailing\n",
    *(f"a{c}b" for c in '<>{}[]?*"#%\\^|~`$&,;:/'),
    "a\x00b",
    "a\x1fb",
    "a\x7fb",
    "a\x85b",
    "a\x9fb",
    "a\ufffeb",
]


@pytest.mark.parametrize("name", ALLOWED_NAMES)
def test_step_functions_execution_names_are_written(name):
    """An execution name Step Functions allows (``.``, ``+``, letters beyond ASCII) is written under its ARN."""
    g = new_id("G")
    name = name if len(name) == 80 else f"{name}-{new_id('E')}"  # a name of its own, still within 80 characters
    assert ingest(message("completed", name, START, {"granuleId": g, "files": []})).errors() == {}
    assert execution(name)["name"] == name and granule(g)["execution"] == arn(name)


@pytest.mark.parametrize("name", REFUSED_NAMES, ids=[repr(n)[:24] for n in REFUSED_NAMES])
def test_names_step_functions_refuses_are_schema_errors(name):
    """A name Step Functions would refuse is a schema violation naming ``cumulus_meta/execution_name``."""
    msg = message("completed", name, START, {"granuleId": new_id("G"), "files": []})
    with pytest.raises(records_messages.MessageError, match="^cumulus_meta/execution_name: ") as refused:
        records_messages.validate(msg)
    assert refused.value.kind == "SchemaValidationError"
