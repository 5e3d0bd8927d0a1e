"""Records test helpers: a Cumulus workflow message with one granule, as records-ingest receives it."""

from __future__ import annotations

STATE_MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:IngestGranule"


def message(
    status: str, execution: str, created: int, granule: str = "G1", collection=("MOD09GQ", "006"), **extra
) -> dict:
    """A workflow message of ``execution`` started at ``created`` (ms) for one granule of ``collection``."""
    granule_status = extra.pop("granule_status", None)
    granule_item = {
        "granuleId": granule,
        "files": [{"fileName": "a.hdf", "size": 100}, {"fileName": "a.xml", "size": 23}],
    }
    if granule_status:
        granule_item["status"] = granule_status
    msg = {
        "cumulus_meta": {"state_machine": STATE_MACHINE, "execution_name": execution, "workflow_start_time": created},
        "meta": {
            "collection": {"name": collection[0], "version": collection[1]},
            "status": status,
            "provider": {"id": "prov"},
        },
        "payload": {"granules": [granule_item], "pdr": {"name": "p.PDR"}},
    }
    if status == "failed":
        msg["error"] = {"Error": "ProcessingError", "Cause": "bad checksum"}
    msg.update(extra)
    return msg
