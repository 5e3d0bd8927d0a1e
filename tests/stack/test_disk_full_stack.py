"""The whole local stack on a full disk (issue 53 item 5), for real: `local_stack up` in a data folder of its own, on
free ports, whose object store is a small tmpfs (as root; skipped cleanly otherwise). The disk goes past the warning
share, then fills mid-feed while NDJSON files and records messages land (written elsewhere on it before, renamed in
whole while it is full, as an upload that finished just then). While it is full: no unfinished (``.part``) or
unreadable Parquet object lies in the store, no file is ``completed`` whose rows are not in the merged Parquet, the
files that landed wait (none quarantined or failed, each where it landed), and a `pipeline-health` run reports
``disk-full-objects`` naming the folder and its fill. Then the filler is removed and, with no step of anyone's, every
file is merged exactly once, every granule written, and `records-reconcile` finds nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from benchmarks.server_load import stack
from benchmarks.soak import EtlFiles
from deployments.supervisor import Supervisor, socket_for
from tasks.core import disk
from tasks.etl import keys as etl_keys
from tasks.etl.merge import SOURCE_FILE
from tasks.records import keys as records_keys
from tests.helpers.disk import fill, hidden_parts, small_disk
from tests.helpers.landing import record_messages
from tests.helpers.stack_probe import own_stack, probe

pytestmark = pytest.mark.sweep  # a whole stack of its own, up and down: 3 to 4 minutes

DISK_MB = 32
PER_BATCH = 10  # the stack's files per manifest (EtlSettings' default): each feed is one whole manifest
MESSAGES = 5  # per records message file
LINES = 1200  # per NDJSON file: ~150 KB, inside the stack's accepted sizes (10 MB ± 99%)
WAIT_S = 240  # for the work to finish once space is freed (a waiting manifest is announced again every minute)


def _stage(objects: Path, key: str, data: bytes) -> tuple[Path, Path]:
    """An upload written in whole under a hidden name on the store's disk: (where it is, where it lands)."""
    staged = objects / f".{Path(key).name}.part"
    staged.write_bytes(data)
    return staged, objects / key


def _land(uploads: list[tuple[Path, Path]]) -> None:
    """Each upload renamed into its landing place in one step, as users land files."""
    for staged, landed in uploads:
        landed.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, landed)


def _uploads(objects: Path, date: str, tag: str, first_granule: int) -> tuple[list, list[str], list[str]]:
    """One feed: ``PER_BATCH`` NDJSON files and two records message files, staged; (uploads, ETL keys, granules)."""
    data, _ = EtlFiles(LINES).make(0)
    etl = [etl_keys.input_key(date, f"full-{tag}-{i:02d}.ndjson") for i in range(PER_BATCH)]
    uploads = [_stage(objects, key, data) for key in etl]
    for j in range(2):
        messages = record_messages(first_granule + MESSAGES * j, MESSAGES)  # granules LAND.G{first:03d} on
        key = f"{records_keys.RECORDS_INCOMING_PREFIX}full-{tag}-{j}.json"
        uploads.append(_stage(objects, key, json.dumps(messages).encode()))
    return uploads, etl, [f"LAND.G{i:03d}" for i in range(first_granule, first_granule + 2 * MESSAGES)]


def _until(predicate, timeout: float, what: str, every: float = 6.0):
    """The first true value of ``predicate()``, asked every ``every`` s (each ask is a process of its own)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            assert value, f"timed out after {timeout:.0f} s waiting for {what}: {value!r}"
            return value
        time.sleep(every)


def _no_leftover_parts(objects: Path) -> list[str]:
    """The ``.part`` files still there after 10 s (a write in flight has one for an instant; a leftover stays)."""
    deadline = time.monotonic() + 10
    while (parts := hidden_parts(objects)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return parts


def _merged_rows(objects: Path, date: str) -> Counter:
    """Rows per source file over every published Parquet part of ``date`` (each part read whole: none is torn)."""
    rows: Counter = Counter()
    for part in sorted((objects / etl_keys.merged_output_prefix(date)).glob("*.parquet")):
        rows.update(pq.read_table(part, columns=[SOURCE_FILE]).column(SOURCE_FILE).to_pylist())
    return rows


def _assert_nothing_done_wrongly(objects: Path, date: str, state: dict) -> None:
    """No unfinished object, no unreadable Parquet, no file completed whose rows are not all merged, none failed."""
    parts = _no_leftover_parts(objects)
    assert parts == [], parts
    rows = _merged_rows(objects, date)
    for key, item in state["files"].items():
        assert item["status"] not in ("failed", "quarantined"), (key, item)
        if item["status"] == "completed":
            assert rows[item["file_path"]] == LINES, (key, item, rows[item["file_path"]])
    assert not any(m["status"] == "failed" for m in state["manifests"].values()), state["manifests"]
    assert not list((objects / records_keys.DEAD_LETTER_PREFIX).rglob("*.json"))


def _alarms(rows: list[dict]) -> dict[str, dict]:
    return {row["name"]: row for row in rows}


def _granules(data: Path, env: dict, ids: list[str]) -> dict[str, str]:
    return probe(data, env, "granules", ",".join(ids))


@pytest.mark.timeout(1200)
def test_a_full_object_store_stops_intake_raises_the_alarm_and_resumes_by_itself_once_freed():
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root (CI runs as root)")
    folder, data, env = own_stack("disk-stack-")
    objects = data / "objects"
    date = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")  # a day the hourly flush would close
    began = time.monotonic()
    try:
        with small_disk(objects, megabytes=DISK_MB):
            try:
                stack("up", env)
                up_s = time.monotonic() - began
                _full_disk_then_freed(data, objects, env, date)
            finally:
                with contextlib.suppress(Exception):
                    print(stack("down", env))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert not Supervisor(data, socket_for(data)).running()
    print(f"full disk, whole stack: up {up_s:.0f} s, test {time.monotonic() - began:.0f} s")


def _full_disk_then_freed(data: Path, objects: Path, env: dict, date: str) -> None:
    before, before_etl, before_granules = _uploads(objects, date, "a", 0)
    during, during_etl, during_granules = _uploads(objects, date, "b", 2 * MESSAGES)

    # past the warning share: the WARNING alarm names the disk, the CRITICAL one is not raised yet
    total = disk.usage(objects).total_bytes
    fillers = [fill(objects, leave_bytes=int(0.10 * total), name="filler-warning.bin")]
    disks = _alarms(probe(data, env, "disks"))
    low, full = disks["disk-space-low-objects"], disks["disk-full-objects"]
    assert low["state"] == "ALARM" and low["severity"] == "WARNING", low
    assert str(objects) in low["detail"] and "% used" in low["detail"], low
    assert full["state"] == "OK", full

    # mid-feed: a manifest is made, and the disk fills before its merge writes
    _land(before)
    manifests = objects / etl_keys.manifest_key(date, "x").rsplit("/", 1)[0]
    _until(lambda: list(manifests.glob("*.json")), 120, "the first manifest", every=0.2)
    fillers.append(fill(objects, name="filler-full.bin"))
    state = _until(
        lambda: (
            (s := probe(data, env, "etl", date))["manifests"]
            and all(m["waiting_reason"] or m["status"] == "completed" for m in s["manifests"].values())
            and s
        ),
        120,
        "the first manifest's merge to meet the full disk (or to have finished before)",
    )
    waited = [name for name, m in state["manifests"].items() if m["status"] != "completed"]
    fillers.append(fill(objects, name="filler-top.bin"))  # what the merge had staged, removed, taken again
    _land(during)  # files that land while the disk is full
    time.sleep(10)  # the listeners' batches (2 s) and their retries

    # while full: nothing done wrongly, the landed files wait where they landed, the alarm says which disk
    health = probe(data, env, "health")
    state = probe(data, env, "etl", date)
    _assert_nothing_done_wrongly(objects, date, state)
    for key in during_etl:
        assert (objects / key).exists(), key
        assert state["files"].get(Path(key).name, {}).get("status") in (None, "pending", "manifested"), state["files"]
    for name in waited:
        assert state["manifests"][name]["status"] in ("pending", "processing"), state["manifests"][name]
        assert "No space left" in state["manifests"][name]["waiting_reason"]
    assert health["state"] == "Completed", health
    alarms = _alarms(health["rows"])
    full, low = alarms["disk-full-objects"], alarms["disk-space-low-objects"]
    assert full["state"] == "ALARM" and full["severity"] == "CRITICAL" and full["value"] >= 99, full
    assert f"{objects} on {objects}: " in full["detail"] and "% used" in full["detail"], full
    assert low["state"] == "ALARM", low
    if waited:
        assert alarms["etl-merges-waiting-for-space"]["state"] == "ALARM", alarms["etl-merges-waiting-for-space"]
    statuses = Counter(f["status"] for f in state["files"].values())
    print(f"while full: manifests waiting for space {waited}, files {dict(statuses)}")

    # space freed: everything completes by itself, once
    freed_at = time.monotonic()
    for filler in fillers:
        filler.unlink()
    urls = {Path(key).name: (objects / key).as_uri() for key in before_etl + during_etl}
    granules = before_granules + during_granules

    def finished():
        now = probe(data, env, "etl", date)
        done = {k for k, f in now["files"].items() if f["status"] == "completed"} == set(urls)
        return done and all(m["status"] == "completed" for m in now["manifests"].values()) and now

    state = _until(finished, WAIT_S, "every file merged after the space was freed")
    _until(lambda: len(_granules(data, env, granules)) == len(granules), 60, "every granule written")
    resumed_s = time.monotonic() - freed_at
    assert set(_granules(data, env, granules).values()) == {"completed"}
    processed = objects / records_keys.RECORDS_PROCESSED_PREFIX
    messages = sorted(landed.name for _, landed in before + during if landed.suffix == ".json")
    assert sorted(p.name for p in processed.rglob("full-*.json")) == messages  # each set aside once
    assert not list((objects / records_keys.RECORDS_INCOMING_PREFIX).glob("full-*"))
    _assert_nothing_done_wrongly(objects, date, state)
    rows = _merged_rows(objects, date)
    assert rows == Counter({url: LINES for url in urls.values()}), rows  # every file merged exactly once
    listed = Counter(
        name.rsplit("/", 1)[-1]
        for path in manifests.glob("*.json")
        for name in json.loads(path.read_text())["fileLocations"][0]["URIPrefixes"]
    )
    assert listed == Counter(dict.fromkeys(urls, 1)), listed  # each file in one manifest
    assert _alarms(probe(data, env, "disks"))["disk-full-objects"]["state"] == "OK"
    assert probe(data, env, "reconcile") == []
    print(f"full disk: resumed and finished {resumed_s:.0f} s after the space was freed")
