"""A full disk (issue 53 item 5): no half-written object or Parquet part is published, nothing is marked done that is
not, landed files wait rather than being refused, the health alarm names the disk and its fill, and the work
completes once when space is freed.

The real cases run on a small tmpfs mounted over the store's folder (as root; skipped cleanly otherwise); the
others inject ENOSPC through ``tasks.core.faults``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pyarrow as pa
import pytest

from blocks.health import HealthThresholds
from flows.etl import ndjson_flush_orphans, ndjson_ingest, ndjson_merge
from tasks.core import disk, faults
from tasks.core.errors import DiskFull, Unavailable
from tasks.core.object_store import LocalStore
from tasks.etl import alarms as etl_alarms
from tasks.etl import landing as etl_landing
from tasks.etl import merge as etl_merge
from tasks.etl.ingest import settings
from tasks.health import checks, disks
from tasks.landing.sources import Arrival
from tests.helpers.disk import fill, hidden_parts, small_disk
from tests.helpers.etl import (
    DAY,
    assert_merged_exactly_once,
    file_statuses,
    manifests,
    records,
    write_five_inputs,
)

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

MISSING = "ndjson-merge/not-deployed"  # a launch that fails: the manifest stays pending until a merge is run here


# --------------------------------------------------------------------------- ENOSPC recognised, however it comes


def test_disk_full_is_transient_and_found_however_it_is_worded():
    assert issubclass(DiskFull, Unavailable) and issubclass(DiskFull, OSError)
    assert disk.is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert disk.is_disk_full(OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"))
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as inner:
            raise RuntimeError("the merge failed") from inner
    except RuntimeError as outer:
        assert disk.is_disk_full(outer)
    assert not disk.is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not disk.is_disk_full(ValueError("No space in this column name"))


def test_an_injected_enospc_fails_the_write_as_a_full_disk_would(tmp_path):
    assert faults.Plan.parse("2:enospc:before:objects:put_bytes:a") == faults.Plan(
        2, "enospc", "before", None, "objects:put_bytes:a"
    )
    store = LocalStore(tmp_path)
    with faults.inject(at=1, mode="enospc", kind="objects:put_bytes:a"):
        with pytest.raises(OSError) as raised:
            store.put_bytes("a/x.json", b"{}")
    assert raised.value.errno == errno.ENOSPC and disk.is_disk_full(raised.value)
    assert not store.exists("a/x.json") and not hidden_parts(tmp_path)


# --------------------------------------------------------------------------- every store write on a real full disk


def test_a_write_that_meets_a_full_disk_leaves_nothing_and_the_next_one_after_freeing_lands(tmp_path):
    with small_disk(tmp_path / "objects", megabytes=4) as root:
        store = LocalStore(root)
        store.put_bytes("kept/a.bin", b"a" * 1000)
        big = b"x" * (6 << 20)
        for write in (
            lambda: store.put_bytes("out/big.bin", big),
            lambda: store.put_file("out/big.bin", _local_file(tmp_path / "big.bin", big)),
            lambda: store.put_stream("out/big.bin", open(tmp_path / "big.bin", "rb")),
        ):
            with pytest.raises(DiskFull, match="No space left on device writing .*out/big.bin"):
                write()
            assert not store.exists("out/big.bin") and not hidden_parts(root)
        assert store.get_bytes("kept/a.bin") == b"a" * 1000  # what was there before is untouched
        filler = fill(root)
        with pytest.raises(DiskFull):
            store.put_bytes("out/small.json", b"{}" * 4096)
        assert not hidden_parts(root)
        filler.unlink()
        store.put_bytes("out/small.json", b"{}" * 4096)
        assert store.size("out/small.json") == 8192


def test_a_landing_watermark_that_meets_a_full_disk_leaves_no_part_and_the_last_one_stands(tmp_path):
    from tasks.landing.watch import Watermark, read_watermark, write_watermark

    with small_disk(tmp_path / "objects", megabytes=4) as root:
        write_watermark(root, Watermark(100.0, {"a": 1.0}))
        filler = fill(root)
        with pytest.raises(OSError) as raised:
            write_watermark(root, Watermark(200.0, {"a" * 100_000: 1.0}))  # a body bigger than a page
        assert disk.is_disk_full(raised.value)
        assert not hidden_parts(root) and read_watermark(root).at == 100.0
        filler.unlink()
        write_watermark(root, Watermark(200.0, {"a": 2.0}))
        assert read_watermark(root).at == 200.0 and not hidden_parts(root)


def _local_file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_parquet_part_that_meets_a_full_disk_is_removed_not_published(tmp_path):
    with small_disk(tmp_path / "objects", megabytes=4) as root:
        rows = pa.table({"text": [os.urandom(48).hex() for _ in range(120_000)]})  # ~11 MiB, hardly compressible
        with pytest.raises(DiskFull, match="part-00000.parquet"):
            etl_merge.write_parquet(root.as_uri(), "merged/part-00000.parquet", rows)
        assert list(root.rglob("*.parquet")) == [] and not hidden_parts(root)
        small = rows.slice(0, 100)
        assert etl_merge.write_parquet(root.as_uri(), "merged/part-00000.parquet", small)
        assert (root / "merged" / "part-00000.parquet").stat().st_size > 0


# --------------------------------------------------------------------------- the ETL: nothing done wrongly, then once


def test_a_merge_on_a_full_disk_publishes_nothing_fails_no_file_and_completes_once_when_space_is_freed(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    with small_disk(root, megabytes=8):
        urls = write_five_inputs(root, "full", lines_per_file=40)
        ndjson_ingest(file_urls=urls, merge_deployment=MISSING)  # tracked, in a pending manifest
        (name,) = [key.split("#", 1)[1] for key in manifests(table)]
        filler = fill(root)

        outcome = ndjson_merge(date_prefix=DAY, manifest_name=name)

        assert outcome["manifest_status"] == etl_merge.PENDING  # waiting for space, not failed
        (manifest,) = manifests(table).values()
        assert manifest["status"] == "pending" and "No space left" in manifest["waiting_reason"]
        assert file_statuses(table) == {"manifested": 5}  # none failed, none completed
        assert not list((root / "pipeline").rglob("*.parquet")) and not hidden_parts(root)
        assert etl_merge.published(DAY, name) is None
        waiting = etl_alarms.etl_merges_waiting_for_space(HealthThresholds())  # ENOSPC seen: CRITICAL
        assert waiting.firing and waiting.severity == checks.CRITICAL and name in waiting.detail
        assert "No space left" in waiting.detail

        filler.unlink()
        ndjson_flush_orphans(merge_deployment=None, restart_pending_after_seconds=0)  # its scheduled restart

        assert file_statuses(table) == {"completed": 5}
        assert {m["status"] for m in manifests(table).values()} == {"completed"}
        assert_merged_exactly_once(root, urls, lines_per_file=40)
        assert not etl_alarms.etl_merges_waiting_for_space(HealthThresholds()).firing


def test_landed_files_are_offered_again_not_quarantined_when_the_store_is_full(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    urls = write_five_inputs(root, "land")
    arrivals = [Arrival(url, url.split("/objects/", 1)[1], None, "2026-01-01T00:00:00+00:00", url) for url in urls]
    launched: list = []
    with faults.inject(at=1, mode="enospc", kind="objects:put_bytes:manifests"):  # the manifest's JSON
        outcome = etl_landing.handle_landed(arrivals, settings(), lambda made: launched.extend(made) or [])
    assert [a.url for a, _ in outcome.retry] == urls and "No space left" in outcome.retry[0][1]
    assert not outcome.done and not launched
    assert all(Path(url.removeprefix("file://")).exists() for url in urls)  # still where they landed
    assert not any(
        str(item.get("status", "")).startswith(("quarantined", "failed")) for item in records(table).values()
    )

    outcome = etl_landing.handle_landed(arrivals, settings(), lambda made: [])  # offered again with space
    assert len(outcome.done) == 5 and not outcome.retry
    assert sum(file_statuses(table).values()) == 5


# --------------------------------------------------------------------------- the alarm names the disk and its fill


def test_the_health_alarm_names_the_disk_and_how_full_it_is(tmp_path, store_root):
    with small_disk(tmp_path / "small", megabytes=4) as small:
        limits = HealthThresholds(disk_paths=f"scratch={small}")
        by_name = {a.name: a for a in disks.disk_alarms(limits)}
        assert {"disk-space-low-objects", "disk-full-objects", "disk-full-scratch"} <= set(by_name)
        assert not by_name["disk-full-scratch"].firing and not by_name["disk-space-low-scratch"].firing

        filler = fill(small, leave_bytes=int(0.1 * disk.usage(small).total_bytes))  # 90% full
        by_name = {a.name: a for a in disks.disk_alarms(limits)}
        low, full = by_name["disk-space-low-scratch"], by_name["disk-full-scratch"]
        assert low.firing and low.severity == checks.WARNING and not full.firing
        assert str(small) in low.detail and "% used" in low.detail and low.value >= 89

        filler.unlink()
        fill(small)  # full: the next write meets ENOSPC
        full = {a.name: a for a in disks.disk_alarms(limits)}["disk-full-scratch"]
        assert full.firing and full.severity == checks.CRITICAL and full.value == 100
        assert f"on {small}" in full.detail and "MiB free of 4.0 MiB" in full.detail


# --------------------------------------------------------------------------- records: the dead-letter archive


def test_a_message_whose_dead_letter_meets_a_full_disk_stays_in_incoming_and_is_archived_once_later(tables, store_root):
    from flows.records import ingest_batch
    from tasks.core.runtime import today_iso
    from tasks.records import dead_letter
    from tasks.records import landing as records_landing
    from tests.helpers.landing import arrive

    arrivals = [arrive(store_root, "records/incoming/bad.json", b"42")]  # JSON, but no batch: archived whole
    with faults.inject(at=1, mode="enospc", kind="objects:put_bytes:dead-letter-archive"):
        outcome = records_landing.handle_messages(arrivals, ingest_batch)
    assert outcome.done == [] and "No space left" in outcome.retry[0][1]
    assert (store_root / "records" / "incoming" / "bad.json").exists()  # still where it landed, not dropped
    assert dead_letter.archived(today_iso()) == {} and not hidden_parts(store_root)

    outcome = records_landing.handle_messages(arrivals, ingest_batch)  # offered again, with space
    assert outcome.done == arrivals and outcome.retry == []
    assert len(dead_letter.archived(today_iso())) == 1
    assert not (store_root / "records" / "incoming" / "bad.json").exists()
