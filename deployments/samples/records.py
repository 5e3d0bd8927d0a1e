"""Sample workflow messages for the records demo: an execution's life, a late event, and rejected messages."""

from __future__ import annotations

import json
from pathlib import Path

STATE_MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:DemoIngestGranule"
COLLECTION = {"name": "MOD09GQ", "version": "006"}


def _message(status: str, execution: str, start_ms: int, granules: list[str], **extra) -> dict:
    message = {
        "cumulus_meta": {"state_machine": STATE_MACHINE, "execution_name": execution, "workflow_start_time": start_ms},
        "meta": {
            "collection": COLLECTION,
            "status": status,
            "provider": {"id": "demo-provider"},
            "workflow_name": "IngestGranule",
        },
        "payload": {
            "granules": [
                {
                    "granuleId": g,
                    "files": [{"fileName": f"{g}.hdf", "size": 1000 + i}, {"fileName": f"{g}.cmr.xml", "size": 50}],
                }
                for i, g in enumerate(granules)
            ]
        },
    }
    message.update(extra)
    return message


def make(workdir: Path) -> dict:
    """Messages for records-ingest (also written to ``records/messages.json`` for the CLI)."""
    granules = ["MOD09GQ.A2017025.h21v00.006", "MOD09GQ.A2017025.h21v01.006"]
    messages: list = [
        _message("running", "demo-exec-1", 1_700_000_000_000, granules),
        _message("completed", "demo-exec-1", 1_700_000_000_000, granules),
        _message("running", "demo-exec-1", 1_700_000_000_000, granules),  # late duplicate: dropped as stale
        _message(
            "failed",
            "demo-exec-0",
            1_600_000_000_000,
            granules[:1],
            error={"Error": "Timeout", "Cause": "older attempt"},
        ),  # older attempt: dropped as stale
        {"meta": {"collection": COLLECTION}, "payload": {"granules": [{"granuleId": "MOD09GQ.A2017025.h21v02.006"}]}},
        '{"cumulus_meta": {"execution_name": "trunc',  # an unparsable body
    ]
    folder = Path(workdir) / "records"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "messages.json").write_text(json.dumps(messages, indent=2))
    # records-ingest takes text bodies, as SQS delivers them (a parsed payload could hold what Prefect cannot list)
    return {"messages": [m if isinstance(m, str) else json.dumps(m) for m in messages]}


def drop(workdir: Path, store, shuffle_seed: int = 7) -> dict:
    """The sample's bodies, shuffled (the records must come out the same in any order), one per line in a
    message file under ``records/incoming/``: the local stand-in for the workflow-message queue."""
    import random

    from tasks.records import keys

    bodies = make(workdir)["messages"]
    random.Random(shuffle_seed).shuffle(bodies)
    key = f"{keys.RECORDS_INCOMING_PREFIX}{Path(workdir).name}-messages.ndjson"
    store.put_bytes(key, ("\n".join(bodies) + "\n").encode())
    return {"incoming_key": key}


def landed(incoming_key: str, **_ids) -> bool:
    """Whether the message file has left ``records/incoming/`` (every message written, or archived)."""
    from tasks.core import config

    return not config.object_store().exists(incoming_key)


def report(granule_ids: list[str] | None = None, **_ids) -> str:
    """Granule records by granuleId and their executions by arn (the seed's lookups)."""
    from tasks.core import config, state_store

    granule_ids = granule_ids or [
        "MOD09GQ.A2017025.h21v00.006",
        "MOD09GQ.A2017025.h21v01.006",
        "MOD09GQ.A2017025.h21v02.006",
    ]
    lines = []
    for gid in granule_ids:
        item = state_store.get_item(config.table_name("granules"), {"granuleId": gid})
        if item is None:
            lines.append(f"{gid}: no record")
            continue
        g = state_store.to_plain(item)
        lines.append(
            f"{gid}: {g['status']} collection={g.get('collectionId')} createdAt={g.get('createdAt')} "
            f"productVolume={g.get('productVolume')} execution={g.get('execution')} error={g.get('error')}"
        )
        if g.get("execution"):
            execution = state_store.get_item(config.table_name("executions"), {"arn": g["execution"]})
            if execution:
                lines.append(f"  execution {execution['name']}: {execution['status']}")
    return "\n".join(lines)
