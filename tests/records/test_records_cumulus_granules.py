"""Cumulus's granule write tests, ported: each test names the Cumulus test it comes from (title and file).

Sources: packages/api/tests/lib/writeRecords/test-write-granules.js (``W``) and
packages/db/tests/models/test-granule-model.js (``M``), nasa/cumulus. Behaviour is Cumulus's except where seed 004's
text decides otherwise; those tests say "Seed-decided" and quote the seed.
"""

from __future__ import annotations

import pytest

from tasks.records.rules import Verdict
from tests.helpers.records_cumulus import (
    COLLECTION_ID,
    NOW,
    START,
    arn,
    files,
    granule,
    ingest,
    message,
    new_id,
    ported,
    put_execution,
)

W = "packages/api/tests/lib/writeRecords/test-write-granules.js"
M = "packages/db/tests/models/test-granule-model.js"

pytestmark = pytest.mark.usefixtures("module_tables")


def completed_granule(granule_id: str, **fields) -> dict:
    """fakeGranuleFactoryV2 as the tests use it: a completed granule with three 5-byte files."""
    return {"granuleId": granule_id, "files": files(5, 5, 5), "status": "completed", **fields}


def test_running_does_not_replace_completed_for_same_execution():
    """W: "_writeGranule will not allow a running status to replace a completed status for same execution"."""
    g, ex = new_id("G"), new_id("E")
    ingest(message("completed", ex, START, completed_granule(g)))
    report = ingest(message("running", ex, START, completed_granule(g)))
    assert granule(g)["status"] == "completed"
    assert report.outcomes[0].results[-1].verdict is Verdict.STALE and report.errors() == {}


@pytest.mark.parametrize("payload", [{}, {"granules": []}], ids=["no granules", "empty granule set"])
def test_message_without_granules_writes_no_granule(payload):
    """W: "writeGranulesFromMessage() returns undefined if message has no granules" and "... if message has empty
    granule set": the execution is written, no granule record."""
    ex = new_id("E")
    report = ingest(message("completed", ex, START) | {"payload": payload})
    assert report.errors() == {} and [r.kind for r in report.outcomes[0].results] == ["execution"]


def test_saves_granule_record():
    """W: "writeGranulesFromMessage() saves granule records to PostgreSQL/Elasticsearch/SNS" (the record; no
    Elasticsearch, no SNS)."""
    g, ex, pdr_name = new_id("G"), new_id("E"), new_id("PDR")
    given = completed_granule(g, cmrLink="https://cmr/g", published=True)
    ingest(message("completed", ex, START, given, pdr=pdr_name))
    record = granule(g)
    assert {k: record[k] for k in given if k != "status"} == {k: v for k, v in given.items() if k != "status"}
    assert (record["status"], record["collectionId"], record["execution"], record["pdrName"], record["provider"]) == (
        "completed",
        COLLECTION_ID,
        arn(ex),
        pdr_name,
        "prov",
    )
    assert (record["createdAt"], record["timestamp"], record["updatedAt"], record["error"]) == (START, NOW, NOW, {})
    assert (record["productVolume"], record["duration"], record["timeToArchive"], record["timeToPreprocess"]) == (
        "15",
        900,
        0,
        0,
    )


NULLABLE = [
    "beginningDateTime",
    "cmrLink",
    "createdAt",
    "duration",
    "endingDateTime",
    "lastUpdateDateTime",
    "pdrName",
    "processingEndDateTime",
    "processingStartDateTime",
    "productionDateTime",
    "productVolume",
    "provider",
    "published",
    "queryFields",
    "timestamp",
    "timeToArchive",
    "timeToPreprocess",
    "updatedAt",
]


def full_granule(granule_id: str) -> dict:
    """The tests' completeGranule: every nullable field set."""
    return completed_granule(
        granule_id,
        beginningDateTime="2017-01-01T00:00:00.000Z",
        endingDateTime="2017-01-02T00:00:00.000Z",
        lastUpdateDateTime="2017-01-03T00:00:00.000Z",
        productionDateTime="2017-01-04T00:00:00.000Z",
        cmrLink="example.com",
        published=True,
        duration=1000,
        productVolume="1000",
        timeToArchive=1000,
        timeToPreprocess=1000,
        queryFields={"queryFieldsKey": "queryFieldsValue"},
    )


def test_rewrite_with_nulls_removes_what_the_message_nulls():
    """W: "writeGranulesFromMessage() on re-write saves granule records to PostgreSQL/Elasticsearch/SNS with
    expected values nullified": a null removes the value the granule itself gives (cmrLink, the temporal values);
    the message's own values (pdrName, provider, times) are written again; published is false."""
    g, ex, pdr_name = new_id("G"), new_id("E"), new_id("PDR")
    first = full_granule(g)
    ingest(message("completed", ex, START, first, pdr=pdr_name))
    assert granule(g)["cmrLink"] == "example.com" and granule(g)["beginningDateTime"] == first["beginningDateTime"]
    nulled = {**first, **dict.fromkeys(NULLABLE)}
    ingest(message("completed", ex, START + 1000, nulled, pdr=pdr_name), now=NOW + 1000)
    record = granule(g)
    for gone in (
        "cmrLink",
        "beginningDateTime",
        "endingDateTime",
        "lastUpdateDateTime",
        "productionDateTime",
        "queryFields",
    ):
        assert gone not in record, gone
    assert (record["published"], record["createdAt"], record["pdrName"], record["provider"]) == (
        False,
        START + 1000,
        pdr_name,
        "prov",
    )
    assert (record["productVolume"], record["timeToArchive"], record["timeToPreprocess"], record["error"]) == (
        "15",
        0,
        0,
        {},
    )
    assert record["files"] == first["files"] and record["status"] == "completed"


def test_rewrite_without_files_keeps_product_volume():
    """W: "writeGranulesFromMessage() on re-write saves granule records to PostgreSQL/Elasticsearch/SNS without
    updating product volume if files is undefined"."""
    g, ex = new_id("G"), new_id("E")
    ingest(message("completed", ex, START, completed_granule(g)))
    ingest(message("completed", ex, START, {"granuleId": g, "status": "completed"}))
    assert granule(g)["productVolume"] == "15" and len(granule(g)["files"]) == 3


def test_rewrite_without_values_keeps_them():
    """W: "writeGranulesFromMessage() on re-write saves granule records to PostgreSQL/Elasticsearch/SNS without
    modifying undefined values": a granule of only its id keeps cmrLink, files, volume and temporal values;
    published is false again (seed: "if not specified or null is specified, defaults to false")."""
    g, ex = new_id("G"), new_id("E")
    ingest(message("completed", ex, START, full_granule(g), pdr="P"))
    before = granule(g)
    ingest(message("completed", ex, START + 5, {"granuleId": g}, pdr="P"), now=NOW + 5)
    after = granule(g)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed == {"published", "createdAt", "timestamp", "updatedAt", "processingStartDateTime"}
    assert after["published"] is False and after["cmrLink"] == "example.com" and after["files"] == before["files"]


def test_running_rewrite_with_nulls_changes_only_status_and_times():
    """W: "writeGranulesFromMessage() on re-write saves granule records to PostgreSQL/Elasticsearch/SNS with expected
    values nullified when granule is updated to running": only status, createdAt, timestamp and updatedAt change.
    Seed-decided: Cumulus also links the granule to the new execution; the seed: "Only status, timestamp,
    updated_at and created_at are updated. All other values are retained as they currently exist"."""
    g, ex, newer = new_id("G"), new_id("E"), new_id("E")
    ingest(message("completed", ex, START, full_granule(g), pdr="P"))
    before = granule(g)
    put_execution(newer, "running")
    ingest(message("running", newer, START + 1000, {**full_granule(g), **dict.fromkeys(NULLABLE)}), now=NOW + 1000)
    after = granule(g)
    assert {k for k in after if after[k] != before.get(k)} == {"status", "createdAt", "timestamp", "updatedAt"}
    assert (after["status"], after["createdAt"], after["execution"]) == ("running", START + 1000, arn(ex))


@pytest.mark.parametrize("published", ["absent", None], ids=["not set", "null"])
def test_published_defaults_to_false(published):
    """W: "writeGranulesFromMessage() sets a default value of false for `published` if one is not set" and
    "writeGranulesFromMessage() sets `published` to false if null value is set"."""
    g = new_id("G")
    given = completed_granule(g) if published == "absent" else completed_granule(g, published=None)
    ingest(message("completed", new_id("E"), START, given))
    assert granule(g)["published"] is False


@ported(
    "writeGranulesFromMessage() uses a default value for granule.createdAt from workflowStartTime "
    "if granule.createdAt is undefined",
    "writeGranulesFromMessage() falls back to workflow_start_time "
    "if granule.createdAt is not provided in cumulus_message for a granule",
)
def test_created_at_defaults_to_workflow_start_time(title):
    """W: the two tests named in ``title``."""
    g = new_id("G")
    ingest(message("running", new_id("E"), 1637017285469, {"granuleId": g}))
    assert granule(g)["createdAt"] == 1637017285469


@ported(
    "writeGranulesFromMessage() allows overwrite of createdAt and uses granule.createdAt value for written granule "
    "if defined",
    "writeGranulesFromMessage() honors granule.createdAt time if provided in cumulus_message",
)
def test_workflow_start_time_wins_over_granule_created_at(title):
    """W: the two tests named in ``title``. Seed-decided: Cumulus writes the granule's own createdAt; the seed's
    table: "createdAt: Defaults to cumulus_meta.workflow_start_time, else payload.granule.createdAt"."""
    g = new_id("G")
    ingest(message("completed", new_id("E"), START, completed_granule(g, createdAt=START + 777)))
    assert granule(g)["createdAt"] == START


def test_without_workflow_start_time_the_granule_created_at_is_used():
    """W: "writeGranulesFromMessage() throws if workflow_start_time is not provided on the message". Seed-decided:
    Cumulus refuses the message; the seed: createdAt "Defaults to cumulus_meta.workflow_start_time, else
    payload.granule.createdAt", so the granule is written with its own createdAt."""
    g = new_id("G")
    report = ingest(message("completed", new_id("E"), None, completed_granule(g, createdAt=START + 9)))
    assert report.errors() == {} and granule(g)["createdAt"] == START + 9


def test_undefined_files_keep_existing_files():
    """W: "writeGranulesFromMessage() given a payload with undefined files, keeps existing files in all datastores"."""
    g, ex = new_id("G"), new_id("E")
    first = completed_granule(g)
    ingest(message("completed", ex, START, first))
    ingest(message("completed", ex, START, {"granuleId": g, "cmrLink": "updatedGranuled.com", "status": "completed"}))
    assert granule(g)["files"] == first["files"] and granule(g)["cmrLink"] == "updatedGranuled.com"


def test_partial_granule_overwrites_only_provided_fields():
    """W: "writeGranulesFromMessage() given a partial granule overwrites only provided fields"."""
    g, ex = new_id("G"), new_id("E")
    ingest(message("completed", ex, START, full_granule(g)))
    before = granule(g)
    ingest(
        message(
            "completed",
            ex,
            START,
            {"granuleId": g, "cmrLink": "updatedGranuled.com", "status": "completed", "published": True},
        )
    )
    after = granule(g)
    assert {k for k in after if after[k] != before.get(k)} == {"cmrLink"}


def test_empty_files_remove_existing_files():
    """W: "writeGranulesFromMessage() given an empty array as a files key will remove all existing files and keep
    Postgres/Elastic in-sync"."""
    g, ex = new_id("G"), new_id("E")
    ingest(message("completed", ex, START, completed_granule(g)))
    ingest(message("completed", ex, START, {"granuleId": g, "files": [], "status": "completed"}))
    assert (granule(g)["files"], granule(g)["productVolume"]) == ([], "0")


def test_null_files_remove_existing_files():
    """W: "writeGranulesFromMessage() given a null files key will throw an error". Seed-decided: Cumulus refuses
    null files ("granule.files must not be null"); the seed's table: "files: Taken directly from
    payload.granule.files. If files is null, set it to an empty list []"."""
    g, ex = new_id("G"), new_id("E")
    ingest(message("completed", ex, START, completed_granule(g)))
    report = ingest(message("completed", ex, START, {"granuleId": g, "files": None, "status": "completed"}))
    assert report.errors() == {} and (granule(g)["files"], granule(g)["productVolume"]) == ([], "0")


def test_disjoint_files_replace_existing_files():
    """W: "writeGranulesFromMessage() removes preexisting granule file from PostgreSQL on granule update with
    disjoint files"."""
    g, ex = new_id("G"), new_id("E")
    ingest(message("completed", ex, START, completed_granule(g, files=[{"bucket": "fake_bucket", "key": "fake_key"}])))
    second = completed_granule(g)
    ingest(message("completed", ex, START, second))
    assert granule(g)["files"] == second["files"]


def test_completed_status_saves_files():
    """W: "writeGranulesFromMessage() saves file records to when workflow status is "completed""."""
    g = new_id("G")
    given = completed_granule(g)
    ingest(message("completed", new_id("E"), START, given))
    assert granule(g)["files"] == given["files"]


def test_valid_and_invalid_granules_are_written_independently():
    """W: "writeGranulesFromMessage() handles successful and failing writes independently": a granule without an
    id fails the message (dead-letter archive) and its valid neighbour is written."""
    g = new_id("G")
    report = ingest(message("completed", new_id("E"), START, completed_granule(g), {}))
    assert granule(g)["status"] == "completed"
    assert report.outcomes[0].error == {"type": "SchemaValidationError", "message": "payload/granules/1: no granuleId"}
    assert report.outcomes[0].archived_key is not None


def test_an_invalid_granule_fails_the_message():
    """W: "writeGranulesFromMessage() throws error if any granule writes fail"."""
    report = ingest(message("completed", new_id("E"), START, {}))
    assert report.outcomes[0].error["type"] == "SchemaValidationError" and report.outcomes[0].archived_key


def test_new_granule_with_empty_files():
    """W: "writeGranuleFromMessage() writes a new granule with files set to "[]" results in file value set to
    undefined/default in all datastores"."""
    g = new_id("G")
    ingest(message("completed", new_id("E"), START, completed_granule(g, files=[])))
    assert (granule(g)["files"], granule(g)["productVolume"]) == ([], "0")


def test_schema_violation_marks_the_granule_failed_and_archives_the_message():
    """W: "_writeGranules attempts to mark granule as failed if a SchemaValidationException occurs when a granule is
    in a final state": a file with an integer checksum breaks Cumulus's API granule schema."""
    g, ex = new_id("G"), new_id("E")
    ingest(message("queued", ex, START, completed_granule(g)))
    bad = completed_granule(
        g,
        files=[
            {
                "path": "MYD13Q1.006",
                "size": 170459659,
                "name": "MYD13Q1.A2017281.hdf",
                "type": "data",
                "checksumType": "CKSUM",
                "checksum": 3129208208,
            },
            {"path": "MYD13Q1.006", "size": 46399, "name": "MYD13Q1.A2017281.hdf.met", "type": "metadata"},
        ],
    )
    report = ingest(
        message("completed", ex, START, bad, exception={"Error": "Original Error", "Cause": {"Error": "Cause"}})
    )
    error = report.outcomes[0].error
    assert error == {
        "type": "SchemaValidationError",
        "message": "payload/granules/0/files/0/checksum: 3129208208 is not of type 'string'",
    }
    assert (granule(g)["status"], granule(g)["error"]) == ("failed", error) and report.outcomes[0].archived_key


def test_same_granule_id_in_another_collection_is_not_written():
    """W: "writeGranulesFromMessage() does not write a granule to Postgres or ES if a granule with the same ID and
    with a different collection ID already exists"."""
    g = new_id("G")
    ingest(message("completed", new_id("E"), START, completed_granule(g)))
    other = message(
        "completed",
        new_id("E"),
        START + 1,
        completed_granule(g),
        meta={"collection": {"name": "OTHER", "version": "1"}},
    )
    report = ingest(other)
    assert (
        report.outcomes[0].error["type"] == "GranuleCollectionConflict" and granule(g)["collectionId"] == COLLECTION_ID
    )


@pytest.mark.parametrize("status", ["running", "queued"])
def test_running_or_queued_stores_no_files(status):
    """W: "writeGranulesFromMessage() does not persist file records to Postgres if the workflow status is "running""
    and "... is "queued"": the granule is written (its execution exists and is completed), its files are not."""
    g, ex = new_id("G"), new_id("E")
    put_execution(ex, "completed")
    ingest(message(status, ex, START, completed_granule(g)))
    assert granule(g)["status"] == status and "files" not in granule(g)


@pytest.mark.parametrize(
    "title, same_files",
    [
        (
            'writeGranulesFromMessage() on re-write with the same granule values and files with "completed" status '
            "saves granule records to PostgreSQL/Elasticsearch with updated product volume, expected values, and files",
            True,
        ),
        (
            'writeGranulesFromMessage() on re-write with the same granule values but different files with "completed" '
            "status saves granule records to PostgreSQL/Elasticsearch with updated product volume, expected values, "
            "and replaces the files",
            False,
        ),
    ],
)
def test_completed_rewrite_saves_values_and_files(title, same_files):
    """W: the test named in ``title`` (its DynamoDB-era twin in the same file too)."""
    g, ex = new_id("G"), new_id("E")
    first = completed_granule(g, cmrLink="example.com", published=True)
    ingest(message("completed", ex, START, first, pdr="P"))
    second = first if same_files else {**first, "files": files(5, 10, 15, 20)}
    ingest(message("completed", ex, START, second, pdr="P"))
    record = granule(g)
    assert (record["files"], record["productVolume"]) == (second["files"], "15" if same_files else "50")
    assert (record["published"], record["cmrLink"], record["status"]) == (True, "example.com", "completed")


def _complete_then(status: str, new_execution: bool, start: int) -> tuple[dict, dict, str]:
    """A completed granule, then a ``status`` write with different files and cmrLink (by a new running execution
    or the same one, with createdAt ``start``): the record before and after, and the writing execution."""
    g, ex = new_id("G"), new_id("E")
    first = completed_granule(g, cmrLink="example.com")
    ingest(message("completed", ex, START, first))
    before = granule(g)
    writer = new_id("E") if new_execution else ex
    if new_execution:
        put_execution(writer, "running")
    update = {**first, "files": files(5, 10, 15, 20), "status": status, "cmrLink": "updatedGranuled.com"}
    ingest(message(status, writer, start, update), now=NOW + 10)
    return before, granule(g), writer


@pytest.mark.parametrize(
    "status, new_execution, start",
    [
        ("running", False, START),
        ("queued", False, START),
        ("queued", True, START + 1000),
        ("running", True, START - 86_400_000),
        ("queued", True, START - 86_400_000),
        ("completed", False, START - 86_400_000),
    ],
    ids=[
        'update changing granule status to "running", with different files and the same execution, does not update',
        'update changing granule status to "queued", with different files and the same execution, does not update',
        'update changing granule status to "queued", with different files and a new execution, does not update',
        'update changing granule status to "running", with different files, a new execution, and a '
        "stale granule createdAt",
        'update changing granule status to "queued", with different files, a new execution, and a '
        "stale granule createdAt",
        'update with "completed" status and stale granule createdAt, does not persist',
    ],
)
def test_update_that_does_not_apply_leaves_values_and_files(status, new_execution, start):
    """W: "writeGranulesFromMessage() on <id> the granule values or files ..." (each with its DynamoDB-era twin):
    the pre-existing values and files persist."""
    before, after, _ = _complete_then(status, new_execution, start)
    assert after == before


def test_running_update_by_a_new_execution_updates_only_limited_values():
    """W: "writeGranulesFromMessage() on update changing granule status to "running", with different files and a new
    execution, updates only limited granule values to Postgres/ES, and does not persist updates to the files".
    Seed-decided: Cumulus also links the new execution; the seed: "Only status, timestamp, updated_at and
    created_at are updated"."""
    before, after, _ = _complete_then("running", True, START + 1000)
    assert {k for k in after if after[k] != before.get(k)} == {"status", "createdAt", "timestamp", "updatedAt"}
    assert (after["status"], after["createdAt"], after["files"], after["cmrLink"]) == (
        "running",
        START + 1000,
        before["files"],
        "example.com",
    )


# --------------------------------------------------------------------------- GranulePgModel.upsert() with
# writeConstraints

T = START
# (Cumulus test title, first write (status, execution), the second write's execution state beforehand (None: no
#  record), second write (status, execution, createdAt), the status and createdAt expected)
TRANSITIONS = [
    ("creates a new running granule if writeConstraints is set to true", None, None, ("running", "A", T), "running", T),
    ("creates a new completed granule", None, None, ("completed", "A", T), "completed", T),
    (
        "will overwrite allowed fields of a running granule for a different execution "
        "if writeConstraints is set to true",
        ("running", "A"),
        "running",
        ("running", "B", T + 1000),
        "running",
        T + 1000,
    ),
    (
        "will allow a completed status to replace a running status for same execution "
        "if writeConstraints is set to true",
        ("running", "A"),
        "running",
        ("completed", "A", T),
        "completed",
        T,
    ),
    (
        "will not allow a running status to replace a completed status for same execution "
        "if writeConstraints is set to true",
        ("completed", "A"),
        "completed",
        ("running", "A", T),
        "completed",
        T,
    ),
    (
        "will allow a running status to replace a non-running status for different execution "
        "if writeConstraints is set to true",
        ("completed", "A"),
        "running",
        ("running", "B", T),
        "running",
        T,
    ),
    (
        "will allow a newer running status to replace an older non-running status for different execution "
        "if writeConstraints is set to true",
        ("completed", "A"),
        "running",
        ("running", "B", T + 5),
        "running",
        T + 5,
    ),
    (
        "will not allow an older running status to replace a newer non-running status for different execution "
        "if writeConstraints is set to true",
        ("completed", "A"),
        "running",
        ("running", "B", 1),
        "completed",
        T,
    ),
    (
        "will not allow a queued status to replace a completed status for same execution "
        "if writeConstraints is set to true",
        ("completed", "A"),
        "completed",
        ("queued", "A", T),
        "completed",
        T,
    ),
    (
        "will not allow a queued status to replace a running status for same execution "
        "if writeConstraints is set to true",
        ("running", "A"),
        "running",
        ("queued", "A", T),
        "running",
        T,
    ),
    (
        "will allow a queued status to replace a non-queued status for a different execution "
        "if writeConstraints is set to true",
        ("completed", "A"),
        None,
        ("queued", "B", T),
        "queued",
        T,
    ),
    (
        "will allow a completed status to replace a queued status for the same execution "
        "if writeConstraints is set to true",
        ("queued", "A"),
        None,
        ("completed", "A", T),
        "completed",
        T,
    ),
    (
        "will allow a running granule status to replace a queued status for the same execution "
        "if writeConstraints is set to true",
        ("queued", "A"),
        None,
        ("running", "A", T),
        "running",
        T,
    ),
    (
        "will not allow a final granule status from an older completed execution to overwrite the completed granule "
        "status from a newer execution if writeConstraints is set to true",
        ("completed", "A"),
        "completed",
        ("failed", "B", T - 100000),
        "completed",
        T,
    ),
    (
        "will not allow a running granule linked to a completed execution to overwrite "
        "and writeConstraints is set to true",
        ("completed", "A"),
        "failed",
        ("running", "B", T + 1),
        "completed",
        T,
    ),
    (
        "will not allow a running granule linked to a completed execution with default writeConstraints set",
        ("completed", "A"),
        "failed",
        ("running", "B", T + 1),
        "completed",
        T,
    ),
    (
        "will not allow a running state granule referencing completed state execution to overwrite an existing "
        "completed state granule referencing a different completed state execution when "
        "writeConstraints is set to true",
        ("completed", "A"),
        "completed",
        ("running", "B", T),
        "completed",
        T,
    ),
]


@pytest.mark.parametrize("title, first, state, second, status, created", TRANSITIONS, ids=[t[0] for t in TRANSITIONS])
def test_granule_upsert_with_write_constraints(title, first, state, second, status, created):
    """M: "GranulePgModel.upsert() <title>": a granule written by a message of execution ``first``, the second
    message's execution in ``state`` beforehand, then the second message."""
    g, names = new_id("G"), {"A": new_id("E"), "B": new_id("E")}
    if first:
        ingest(message(first[0], names[first[1]], T, {"granuleId": g, "files": files(1)}))
    if state is not None and second[1] == "B":
        put_execution(names["B"], state)
    ingest(message(second[0], names[second[1]], second[2], {"granuleId": g, "files": files(2)}), now=NOW + 1)
    assert (granule(g)["status"], granule(g)["createdAt"]) == (status, created)


def test_granule_upsert_running_keeps_every_other_field():
    """M: "GranulePgModel.upsert() will only overwrite allowed fields of a granule if update is to set status to
    running, and writeConstraints is set to true and write conditions are met"."""
    g, old, new = new_id("G"), new_id("E"), new_id("E")
    ingest(message("completed", old, T, completed_granule(g)))
    before = granule(g)
    put_execution(new, "running")
    changed = {
        "granuleId": g,
        "files": files(100),
        "published": True,
        "cmrLink": "testvalue",
        "producerGranuleId": "p",
        "sync_granule_duration": 100,
        "post_to_cmr_duration": 100,
    }
    ingest(message("running", new, T + 1000, changed, meta={"granule": {"queryFields": {}}}), now=NOW + 1000)
    after = granule(g)
    assert {k for k in after if after[k] != before.get(k)} == {"status", "createdAt", "timestamp", "updatedAt"}


def test_granule_upsert_overwrites_a_completed_granule():
    """M: "GranulePgModel.upsert() overwrites a completed granule if writeConstraints is set to true"."""
    g, ex = new_id("G"), new_id("E")
    ingest(message("completed", ex, T, {"granuleId": g, "files": files(50)}))
    ingest(message("completed", ex, T, {"granuleId": g, "files": files(100)}))
    assert granule(g)["productVolume"] == "100"


@pytest.mark.parametrize("status", ["running", "queued"])
def test_granule_upsert_without_created_at_changes_nothing(status):
    """M: "GranulePgModel.upsert() throws if a granule upsert is attempted for a running granule without created_at
    and writeConstraints is set to true" and "... for a queued granule ...": no workflow_start_time and no granule
    createdAt; the message is dead-lettered and the completed granule stays as it was."""
    g, ex = new_id("G"), new_id("E")
    ingest(message("completed", ex, T, completed_granule(g)))
    before = granule(g)
    report = ingest(message(status, new_id("E"), None, {"granuleId": g}))
    assert report.outcomes[0].error == {
        "type": "SchemaValidationError",
        "message": "payload/granules/0: no createdAt (neither cumulus_meta.workflow_start_time nor granule.createdAt)",
    }
    assert granule(g) == before
