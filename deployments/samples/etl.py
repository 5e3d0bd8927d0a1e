"""Sample NDJSON files for the ETL demo: two days of events, one bad line, one file that is not JSON, one refused file.

Files are about 150 KB so they pass the seed's default validation (10 MB ± 99%: 0.1-19.9 MB).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DATES = ["2026-01-01", "2026-01-02"]
FILES_PER_DATE = 12  # one full batch of max_files_per_manifest (10) per date, 2 left for the orphan flush
# the dates are past days: the scheduled flush (hourly) closes their partial batches; the demo runs it at once
FOLLOW_UPS = ("ndjson-flush-orphans/local",)


def _records(rng: random.Random, count: int) -> list[str]:
    return [
        json.dumps(
            {
                "event_id": rng.randrange(10**9),
                "user": f"user-{rng.randrange(1000)}",
                "amount": round(rng.random() * 100, 2),
                "device": {"os": rng.choice(["ios", "android"]), "version": rng.randrange(20)},
                "event_time": f"2026-01-01T{rng.randrange(24):02d}:00:00Z",
            }
        )
        for _ in range(count)
    ]


def make(workdir: Path) -> dict:
    """Input files under ``{workdir}/etl/pipeline/input/{date}/``; returns ndjson-ingest's parameters."""
    rng = random.Random(1)
    root = Path(workdir).resolve() / "etl" / "pipeline" / "input"
    urls = []
    for date in DATES:
        for n in range(FILES_PER_DATE):
            lines = _records(rng, 1200)
            if (date, n) == (DATES[0], 3):
                lines.insert(5, '{"event_id": 1, "user": "trunc')  # a malformed line: kept in the rejects
            if (date, n) == (DATES[1], 0):
                lines = ["event_id,user,amount"] + [f"{i},u{i},1.0" for i in range(8000)]  # CSV, not JSON
            path = root / date / f"events-{n:03d}.ndjson"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n")
            urls.append(path.as_uri())
    refused = root / DATES[0] / "events-tiny.ndjson"  # far below the expected size: quarantined with a reason
    refused.write_text(_records(rng, 1)[0] + "\n")
    urls.append(refused.as_uri())
    return {"file_urls": urls}


def drop(workdir: Path, store) -> dict:
    """The sample files written into the store's landing place, ``pipeline/input/{date}/`` (each renamed in
    whole, as an upload lands); the listener tracks and batches them. Returns what ``landed`` waits for."""
    from tasks.etl import keys

    tracked = []
    for url in make(workdir)["file_urls"]:
        path = Path(url.removeprefix("file://"))
        name = f"{Path(workdir).name}-{path.name}"  # one demo's files never meet another's
        store.put_file(keys.input_key(path.parent.name, name), path)
        tracked.append({"date_prefix": path.parent.name, "file_key": name})
    return {"tracked": tracked}


def landed(tracked: list[dict], **_ids) -> bool:
    """Whether every dropped file has its tracking record (tracked, batched, quarantined or failed)."""
    from tasks.core import config, state_store

    return len(state_store.get_many(config.table_name("etl_file_tracking"), tracked)) == len(tracked)


def report(date_prefixes: list[str] | None = None, **_ids) -> str:
    """Per date: files by status (from the table, meta-records filtered in code) and each manifest's status."""
    from tasks.etl import ops as etl_ops

    lines = []
    for date in date_prefixes or DATES:
        status = etl_ops.status_by_date(date, "failed")
        lines.append(f"{date}: files {status['files']}")
        for record in etl_ops.manifest_records(date):
            lines.append(
                f"  {record['file_key']}: {record['status']} files={record.get('file_count')} "
                f"rows={record.get('rows', '-')} rejected_lines={record.get('rejected_lines', '-')}"
            )
        for failed in status["selected"]:
            lines.append(f"  failed {failed['file_key']}: {failed['error_message']}")
    return "\n".join(lines)
