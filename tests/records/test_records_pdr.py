"""Records as seed 004 writes them: execution, then PDR, then granules; PDR records under the granule rules; CMR
temporal values from the granule's UMM-G / ECHO10 file; processing times from the execution's Prefect flow run."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pytest
from prefect import flow, get_client

from flows.records import records_ingest
from tasks.core import faults, state_store
from tasks.records import cmr
from tasks.records import messages as records_messages
from tasks.records.flow_runs import utc_iso
from tasks.records.rules import Verdict

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

STATE_MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:ParsePdr"
NOW = 1_700_000_900_000
PDR_NAME = "MOD09GQ_20170125.PDR"


def message(status: str, execution: str, created: int, granules: list[dict] | None = None, **payload) -> dict:
    granules = (
        granules if granules is not None else [{"granuleId": "G1", "files": [{"fileName": "G1.hdf", "size": 10}]}]
    )
    return {
        "cumulus_meta": {"state_machine": STATE_MACHINE, "execution_name": execution, "workflow_start_time": created},
        "meta": {"collection": {"name": "MOD09GQ", "version": "006"}, "status": status, "provider": {"id": "prov"}},
        "payload": {"pdr": {"name": PDR_NAME}, "granules": granules, **payload},
    }


def arn(execution: str) -> str:
    return STATE_MACHINE.replace(":stateMachine:", ":execution:") + ":" + execution


def pdr_record(tables) -> dict:
    return state_store.to_plain(state_store.get_item(tables["pdrs"], {"pdrName": PDR_NAME}))


# --------------------------------------------------------------------------- order and PDR records


def test_writes_go_execution_then_pdr_then_granules_and_the_pdr_has_the_seeds_fields(tables, tmp_path):
    msg = message("running", "exec-a", 1000, running=[arn("g1")], completed=[arn("g2"), arn("g3")], failed=[arn("g4")])
    msg["payload"]["pdr"].update(PANSent=True, PANmessage="received")
    log = tmp_path / "writes.log"
    with faults.inject(None, log=str(log)):  # count only: one line per DynamoDB request, in the order sent
        report = records_messages.ingest([msg], now_ms=NOW)
    assert report.errors() == {}
    assert [line.split("\t")[3] for line in log.read_text().splitlines()] == [
        tables["executions"],
        tables["pdrs"],
        tables["granules"],
    ]
    assert [(r.kind, r.verdict) for r in report.outcomes[0].results] == [
        ("execution", Verdict.WRITTEN),
        ("pdr", Verdict.WRITTEN),
        ("granule", Verdict.WRITTEN),
    ]
    assert pdr_record(tables) == {
        "pdrName": PDR_NAME,
        "collectionId": "MOD09GQ___006",
        "status": "running",
        "provider": "prov",
        "progress": 75,  # (total - processing) / total
        "execution": arn("exec-a"),
        "PANSent": True,
        "PANmessage": "received",
        "stats": {"processing": 1, "completed": 2, "failed": 1, "total": 4},
        "createdAt": 1000,
        "timestamp": NOW,
        "updatedAt": NOW,
        "duration": (NOW - 1000) / 1000,
    }
    granule = state_store.get_item(tables["granules"], {"granuleId": "G1"})
    assert granule["pdrName"] == PDR_NAME and granule["execution"] == arn("exec-a")


def test_a_stale_pdr_write_is_dropped_as_cumulus_pdr_upsert_drops_it(tables):
    done = message("completed", "exec-b", 2000, completed=[arn("g1")])
    records_messages.ingest([done], now_ms=NOW)
    before = pdr_record(tables)
    assert (before["status"], before["progress"], before["PANmessage"]) == ("completed", 100, "N/A")
    late = records_messages.ingest(
        [
            message("running", "exec-b", 2000, running=[arn("g1")]),
            message("failed", "exec-a", 1000, failed=[arn("g1")]),
        ],
        now_ms=NOW + 5,
    )
    pdr_results = [r for o in late.outcomes for r in o.results if r.kind == "pdr"]
    assert [(r.verdict, r.reason) for r in pdr_results] == [
        (Verdict.STALE, "running write of the same execution without more progress (0.0 <= 100)"),
        (Verdict.STALE, "older createdAt (1000 < 2000)"),
    ]
    assert pdr_record(tables) == before and late.errors() == {}
    # a newer execution's running write takes the PDR over whole (Cumulus's PDR upsert merges every column)
    records_messages.ingest([message("running", "exec-c", 3000, running=[arn("g9")] * 3)], now_ms=NOW + 9)
    after = pdr_record(tables)
    assert {k for k in after if after[k] != before.get(k)} == {
        "status",
        "createdAt",
        "timestamp",
        "updatedAt",
        "duration",
        "execution",
        "stats",
        "progress",
    }
    # ... and once completed, the same execution's running write without more progress is dropped
    records_messages.ingest([message("completed", "exec-c", 3000, granules=[])], now_ms=NOW + 10)
    again = records_messages.ingest([message("running", "exec-c", 3000, granules=[])], now_ms=NOW + 11)
    assert [r.verdict for r in again.outcomes[0].results] == [Verdict.WRITTEN, Verdict.STALE]  # execution, PDR
    assert pdr_record(tables)["status"] == "completed"


def test_queued_messages_write_no_pdr_and_a_pdr_without_name_is_archived(tables, store_root):
    report = records_messages.ingest([message("queued", "exec-q", 1000)], now_ms=NOW)
    assert [r.kind for r in report.outcomes[0].results] == ["granule"]
    assert state_store.get_item(tables["pdrs"], {"pdrName": PDR_NAME}) is None
    nameless = message("running", "exec-n", 1000)
    nameless["payload"]["pdr"] = {"PANSent": False}
    report = records_messages.ingest([nameless], now_ms=NOW)
    assert report.outcomes[0].error == {
        "type": "SchemaValidationError",
        "message": "payload/pdr: 'name' is a required property",
    }
    assert report.outcomes[0].archived_key


# --------------------------------------------------------------------------- CMR temporal values

UMMG = {
    "GranuleUR": "MOD09GQ.A2017025.h21v00.006.2017034065104",
    "ProviderDates": [
        {"Date": "2017-02-03T06:51:04.000Z", "Type": "Insert"},
        {"Date": "2017-02-04T12:00:00.000Z", "Type": "Update"},
        {"Date": "2017-02-03T06:50:00.000Z", "Type": "Create"},
        {"Date": "2099-01-01T00:00:00.000Z", "Type": "Delete"},  # not an update: ignored
    ],
    "CollectionReference": {"ShortName": "MOD09GQ", "Version": "006"},
    "TemporalExtent": {
        "RangeDateTime": {"BeginningDateTime": "2017-01-25T00:00:00.000Z", "EndingDateTime": "2017-01-25T23:59:59.999Z"}
    },
    "DataGranule": {"DayNightFlag": "Day", "ProductionDateTime": "2017-02-03T06:51:04.000Z"},
}
UMMG_SINGLE = {
    "GranuleUR": "MOD09GQ.A2017026.h21v00.006",
    # Create is the most recent here: the seed's rule takes the most recent of Update/Insert/Create
    "ProviderDates": [
        {"Date": "2019-05-01T00:00:00Z", "Type": "Insert"},
        {"Date": "2020-01-01T00:00:00Z", "Type": "Create"},
    ],
    "TemporalExtent": {"SingleDateTime": "2017-01-26T10:30:00Z"},
}
ECHO10 = """<?xml version="1.0" encoding="UTF-8"?>
<Granule>
  <GranuleUR>MOD09GQ.A2017025.h21v00.006.2017034065104</GranuleUR>
  <InsertTime>2017-02-03T06:51:04Z</InsertTime>
  <LastUpdate>2017-02-05T10:00:00Z</LastUpdate>
  <Collection><ShortName>MOD09GQ</ShortName><VersionId>006</VersionId></Collection>
  <DataGranule><DayNightFlag>DAY</DayNightFlag><ProductionDateTime>2017-02-03T06:51:04.000Z</ProductionDateTime></DataGranule>
  <Temporal><RangeDateTime>
    <BeginningDateTime>2017-01-25T00:00:00.000Z</BeginningDateTime><EndingDateTime>2017-01-25T23:59:59.999Z</EndingDateTime>
  </RangeDateTime></Temporal>
</Granule>"""
ECHO10_SINGLE = """<Granule><GranuleUR>G</GranuleUR><InsertTime>2017-02-03T06:51:04Z</InsertTime>
  <Temporal><SingleDateTime>2017-01-26T10:30:00Z</SingleDateTime></Temporal></Granule>"""
ISO = """<gmd:DS_Series xmlns:gmd="http://www.isotc211.org/2005/gmd" xmlns:gmi="http://www.isotc211.org/2005/gmi"
  xmlns:gco="http://www.isotc211.org/2005/gco" xmlns:gml="http://www.opengis.net/gml/3.2">
 <gmd:composedOf><gmd:DS_DataSet><gmd:has><gmi:MI_Metadata>
  <gmd:identificationInfo><gmd:MD_DataIdentification>
   <gmd:citation><gmd:CI_Citation><gmd:title><gco:CharacterString>MOD09GQ.A2017025</gco:CharacterString></gmd:title></gmd:CI_Citation></gmd:citation>
   <gmd:extent><gmd:EX_Extent><gmd:temporalElement><gmd:EX_TemporalExtent><gmd:extent>TEMPORAL</gmd:extent></gmd:EX_TemporalExtent></gmd:temporalElement></gmd:EX_Extent></gmd:extent>
  </gmd:MD_DataIdentification></gmd:identificationInfo>
  <gmd:identificationInfo><gmd:MD_DataIdentification><gmd:citation><gmd:CI_Citation>
   <gmd:title><gco:CharacterString>UpdateTime</gco:CharacterString></gmd:title>
   <gmd:date><gmd:CI_Date><gmd:date><gco:DateTime>2017-02-04T12:00:00.000Z</gco:DateTime></gmd:date></gmd:CI_Date></gmd:date>
  </gmd:CI_Citation></gmd:citation></gmd:MD_DataIdentification></gmd:identificationInfo>
  <gmd:dataQualityInfo><gmd:DQ_DataQuality><gmd:lineage><gmd:LI_Lineage><gmd:processStep><gmi:LE_ProcessStep>
   <gmd:dateTime><gco:DateTime>2017-02-03T06:51:04.000Z</gco:DateTime></gmd:dateTime>
  </gmi:LE_ProcessStep></gmd:processStep></gmd:LI_Lineage></gmd:lineage></gmd:DQ_DataQuality></gmd:dataQualityInfo>
 </gmi:MI_Metadata></gmd:has></gmd:DS_DataSet></gmd:composedOf>
</gmd:DS_Series>"""
ISO_PERIOD = """<gml:TimePeriod gml:id="t1"><gml:beginPosition>2017-01-25T00:00:00.000Z</gml:beginPosition>
  <gml:endPosition>2017-01-25T23:59:59.999Z</gml:endPosition></gml:TimePeriod>"""
ISO_INSTANT = (
    """<gml:TimeInstant gml:id="t1"><gml:timePosition>2017-01-26T10:30:00Z</gml:timePosition></gml:TimeInstant>"""
)
BILLION_LAUGHS = """<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>
<Granule><InsertTime>&lol2;</InsertTime></Granule>"""


def cmr_files(store_root: Path, name: str, content: str | bytes) -> list[dict]:
    """A granule's files with its CMR file written to the object store."""
    path = store_root / "cmr" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return [
        {"fileName": "G.hdf", "size": 10},
        {"fileName": name, "filename": path.as_uri(), "size": path.stat().st_size},
    ]


@pytest.mark.parametrize(
    "name, content, expected",
    [
        (
            "range.cmr.json",
            json.dumps(UMMG),
            {
                "beginningDateTime": "2017-01-25T00:00:00.000Z",
                "endingDateTime": "2017-01-25T23:59:59.999Z",
                "productionDateTime": "2017-02-03T06:51:04.000Z",
                "lastUpdateDateTime": "2017-02-04T12:00:00.000Z",
            },
        ),
        (
            "single.cmr.json",
            json.dumps(UMMG_SINGLE),
            {  # no DataGranule: no productionDateTime
                "beginningDateTime": "2017-01-26T10:30:00Z",
                "endingDateTime": "2017-01-26T10:30:00Z",
                "lastUpdateDateTime": "2020-01-01T00:00:00Z",
            },
        ),
        (
            "open.cmr.json",
            json.dumps(
                {
                    "GranuleUR": "G",
                    "TemporalExtent": {"RangeDateTime": {"BeginningDateTime": "2017-01-25T00:00:00Z"}},
                    "DataGranule": {"ProductionDateTime": "not a date"},
                }
            ),
            {"beginningDateTime": "2017-01-25T00:00:00Z"},
        ),  # an open range keeps its beginning; a non-date is left out
        (
            "range.cmr.xml",
            ECHO10,
            {
                "beginningDateTime": "2017-01-25T00:00:00.000Z",
                "endingDateTime": "2017-01-25T23:59:59.999Z",
                "productionDateTime": "2017-02-03T06:51:04.000Z",
                "lastUpdateDateTime": "2017-02-05T10:00:00Z",
            },
        ),
        (
            "single.cmr.xml",
            ECHO10_SINGLE,
            {  # no LastUpdate: InsertTime
                "beginningDateTime": "2017-01-26T10:30:00Z",
                "endingDateTime": "2017-01-26T10:30:00Z",
                "lastUpdateDateTime": "2017-02-03T06:51:04Z",
            },
        ),
        (
            "range.cmr_iso.xml",
            ISO.replace("TEMPORAL", ISO_PERIOD),
            {
                "beginningDateTime": "2017-01-25T00:00:00.000Z",
                "endingDateTime": "2017-01-25T23:59:59.999Z",
                "productionDateTime": "2017-02-03T06:51:04.000Z",
                "lastUpdateDateTime": "2017-02-04T12:00:00.000Z",
            },
        ),
        (
            "single.cmr_iso.xml",
            ISO.replace("TEMPORAL", ISO_INSTANT),
            {
                "beginningDateTime": "2017-01-26T10:30:00Z",
                "endingDateTime": "2017-01-26T10:30:00Z",
                "productionDateTime": "2017-02-03T06:51:04.000Z",
                "lastUpdateDateTime": "2017-02-04T12:00:00.000Z",
            },
        ),
    ],
)
def test_cmr_temporal_values_follow_the_seeds_selection(store_root, name, content, expected):
    assert cmr.granule_temporal("G", cmr_files(store_root, name, content)) == expected


@pytest.mark.parametrize(
    "name, content, reason",
    [
        ("bad.cmr.json", "{not json", "not JSON"),
        ("list.cmr.json", "[1, 2]", "not a UMM-G granule"),
        ("bad.cmr.xml", "<Granule><Temporal>", "not well-formed XML"),
        ("laughs.cmr.xml", BILLION_LAUGHS, "DOCTYPE or entity declarations is refused"),
        ("other.cmr.xml", "<Collection/>", "not an ECHO10 granule (root element <Collection>)"),
        ("other.cmr_iso.xml", "<gmi:MI_Metadata/>", "not an ISO granule (root element <gmi:MI_Metadata>"),
        ("huge.cmr.json", b" " * (cmr.CMR_FILE_BYTES + 1), f"is over {cmr.CMR_FILE_BYTES} bytes"),
    ],
)
def test_a_bad_cmr_file_gives_no_values_and_logs_why(store_root, caplog, name, content, reason):
    with caplog.at_level(logging.WARNING, logger="tasks.records.cmr"):
        assert cmr.granule_temporal("G7", cmr_files(store_root, name, content)) == {}
    assert "granule G7: no CMR temporal values: " in caplog.text and reason in caplog.text


def test_a_missing_unlocated_or_outside_cmr_file_gives_no_values(store_root, tmp_path, caplog):
    elsewhere = tmp_path / "elsewhere.cmr.json"
    elsewhere.write_text(json.dumps(UMMG))
    cases = {
        "does not exist": [{"fileName": "gone.cmr.json", "filename": (store_root / "gone.cmr.json").as_uri()}],
        "has no location": [{"fileName": "G.cmr.xml", "size": 50}],
        "is outside the object store": [{"fileName": "elsewhere.cmr.json", "filename": elsewhere.as_uri()}],
    }
    for reason, files in cases.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tasks.records.cmr"):
            assert cmr.granule_temporal("G8", files) == {}
        assert reason in caplog.text
    assert cmr.granule_temporal("G9", [{"fileName": "G.hdf"}]) == {}  # no CMR file at all


def test_ingest_writes_the_temporal_values_and_a_bad_cmr_file_never_fails_the_granule(tables, store_root):
    granules = [
        {"granuleId": "G1", "files": cmr_files(store_root, "G1.cmr.json", json.dumps(UMMG))},
        {"granuleId": "G2", "files": cmr_files(store_root, "G2.cmr.xml", "<Granule>")},
    ]
    report = records_messages.ingest([message("completed", "exec-a", 1000, granules=granules)], now_ms=NOW)
    assert report.errors() == {}
    g1 = state_store.get_item(tables["granules"], {"granuleId": "G1"})
    g2 = state_store.get_item(tables["granules"], {"granuleId": "G2"})
    assert {a: g1[a] for a in cmr.TEMPORAL_ATTRS} == {
        "beginningDateTime": "2017-01-25T00:00:00.000Z",
        "endingDateTime": "2017-01-25T23:59:59.999Z",
        "productionDateTime": "2017-02-03T06:51:04.000Z",
        "lastUpdateDateTime": "2017-02-04T12:00:00.000Z",
    }
    assert g2["status"] == "completed" and not set(cmr.TEMPORAL_ATTRS) & set(g2)


# --------------------------------------------------------------------------- processing times from Prefect


@flow(name="records-pdr-test-workflow")
def _workflow() -> int:
    return 1


def test_processing_times_come_from_the_executions_prefect_flow_run(tables):
    run_id = _workflow(return_state=True).state_details.flow_run_id
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    started, ended = utc_iso(run.start_time), utc_iso(run.end_time)
    assert started and ended and started <= ended
    msg = message("completed", str(run_id), 1000)
    msg["cumulus_meta"]["workflow_stop_time"] = 2000
    unknown = message("completed", str(uuid.uuid4()), 1000, granules=[{"granuleId": "G2"}])  # no such flow run
    unknown["cumulus_meta"]["workflow_stop_time"] = 2000
    summary = records_ingest([json.dumps(msg), json.dumps(unknown)])  # the flow: Prefect asked from inside its task
    assert summary["errors"] == {} and summary["records"]["granule"]["written"] == 2
    g1 = state_store.get_item(tables["granules"], {"granuleId": "G1"})
    execution = state_store.get_item(tables["executions"], {"arn": arn(str(run_id))})
    assert (g1["processingStartDateTime"], g1["processingEndDateTime"]) == (started, ended)
    assert (execution["processingStartDateTime"], execution["processingEndDateTime"]) == (started, ended)
    g2 = state_store.get_item(tables["granules"], {"granuleId": "G2"})  # falls back to the message's times
    assert (g2["processingStartDateTime"], g2["processingEndDateTime"]) == (
        "1970-01-01T00:00:01.000+00:00",
        "1970-01-01T00:00:02.000+00:00",
    )


def test_a_cmr_file_on_s3_is_read_by_bucket_and_key(s3_base, s3_endpoint, tables):
    """The file model Cumulus writes (``bucket``, ``key``), read from a real S3 API (moto's server)."""
    from tests.helpers.s3 import s3_client

    bucket = s3_base.split("/")[2]
    s3_client(s3_endpoint).put_object(Bucket=bucket, Key="granules/G1.cmr.xml", Body=ECHO10.encode())
    files = [
        {"bucket": bucket, "key": "granules/G1.cmr.xml", "fileName": "G1.cmr.xml", "size": len(ECHO10)},
        {"bucket": bucket, "key": "granules/G2.cmr.json", "fileName": "G2.cmr.json"},
    ]  # the second is absent
    granules = [{"granuleId": "G1", "files": files[:1]}, {"granuleId": "G2", "files": files[1:]}]
    assert (
        records_messages.ingest([message("completed", "exec-s3", 1000, granules=granules)], now_ms=NOW).errors() == {}
    )
    g1 = state_store.get_item(tables["granules"], {"granuleId": "G1"})
    assert (g1["beginningDateTime"], g1["lastUpdateDateTime"]) == ("2017-01-25T00:00:00.000Z", "2017-02-05T10:00:00Z")
    g2 = state_store.get_item(tables["granules"], {"granuleId": "G2"})
    assert g2["status"] == "completed" and not set(cmr.TEMPORAL_ATTRS) & set(g2)
