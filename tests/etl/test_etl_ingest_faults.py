"""ETL ingest fault paths (issue 14, items 6-8): no claim without its manifest after a fault at any write, the
flush releases what a killed claimer left, quarantined files can come back, and quarantine streams each version once."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest

from flows.etl import ndjson_flush_orphans, ndjson_ingest
from tasks.core import faults
from tasks.etl import ingest as etl
from tasks.etl import keys
from tasks.etl import ops as etl_ops
from tests.helpers.crashpoints import count_writes, crash_points, killed, run_child
from tests.helpers.etl import MISSING_DEPLOYMENT, good_lines, records, write_input

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

TODAY = "2026-03-01"


def _files(root: Path, date: str, n: int, prefix: str = "f") -> list[str]:
    return [write_input(root, date, f"{prefix}-{i:03d}.ndjson", good_lines(1, i)) for i in range(n)]


def _consistent(table: str, root: Path, date: str) -> dict[str, list[str]]:
    """Assert no file is claimed without its MANIFEST record and each recorded manifest's JSON lists exactly the
    files that point at it; returns {manifest path: file keys}."""
    items = {k[1]: v for k, v in records(table).items() if k[0] == date}
    manifests = {v["manifest_path"]: v for k, v in items.items() if k.startswith("MANIFEST#")}
    files = {k: v for k, v in items.items() if k.endswith(".ndjson")}
    claimed: dict[str, list[str]] = {}
    for key, item in files.items():
        if item["status"].startswith("manifested#"):
            assert item["manifest_path"] in manifests, f"{key} claimed without a manifest record"
            claimed.setdefault(item["manifest_path"], []).append(key)
    for path, record in manifests.items():
        listed = json.loads(Path(path[7:]).read_text())["fileLocations"][0]["URIPrefixes"]
        assert sorted(Path(u).name for u in listed) == sorted(claimed.get(path, [])), path
        assert record["file_count"] == len(listed)
    return claimed


# --------------------------------------------------------------------------- item 6: claims and their manifests


@pytest.mark.parametrize("batch, n", [(5, 12), (100, 100)])  # one transaction per batch; too big for one
def test_create_manifests_raising_at_any_write_leaves_no_claim_without_its_manifest(etl_env, monkeypatch, batch, n):
    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", str(batch))
    root, table = etl_env["root"], etl_env["table"]
    config = etl.settings()
    log = root / "writes.log"
    date = "2025-01-01"
    etl.track_files(etl.validate_files(_files(root, date, n), config), config)
    with faults.inject(log=str(log)):
        etl.create_manifests(date, batch, config)
    total = len(log.read_text().splitlines())
    assert total >= 4
    dates, raised = [], 0
    for point in range(1, total + 1):
        for when in ("before", "after"):
            date = f"2025-01-{len(dates) + 2:02d}"
            dates.append(date)
            etl.track_files(etl.validate_files(_files(root, date, n), config), config)
            with faults.inject(at=point, mode="raise", when=when):
                try:
                    etl.create_manifests(date, batch, config)
                except faults.InjectedFault:
                    raised += 1  # (a write whose condition failed never "lands": no fault after it)
            _consistent(table, root, date)  # at once, in the same call: nothing stranded
    assert raised >= total
    flushed = ndjson_flush_orphans(today=TODAY, merge_deployment=MISSING_DEPLOYMENT, release_claims_after_seconds=0)
    for date in dates:  # the scheduled flush batches the rest: every file in exactly one manifest
        claimed = _consistent(table, root, date)
        assert sorted(k for keys_ in claimed.values() for k in keys_) == [f"f-{i:03d}.ndjson" for i in range(n)]
    print(
        f"create_manifests: {total} writes x before/after, {raised} raised faults; "
        f"flush: {flushed['released_claims']} released"
    )


def test_the_flush_releases_claims_a_killed_claimer_left(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    config = etl.settings()
    date = "2025-02-01"
    etl.track_files(etl.validate_files(_files(root, date, 3), config), config)
    dead = etl._claim(etl.pending_files(date), keys.claim_placeholder("dead"))  # claimed, then the process died
    assert len(dead) == 3
    young = ndjson_flush_orphans(today=TODAY, merge_deployment=MISSING_DEPLOYMENT)  # default grace: left alone
    assert young["released_claims"] == 0 and young["manifests"] == []
    flushed = ndjson_flush_orphans(today=TODAY, merge_deployment=MISSING_DEPLOYMENT, release_claims_after_seconds=0)
    assert flushed["released_claims"] == 3 and len(flushed["manifests"]) == 1
    assert sorted(_consistent(table, root, date).popitem()[1]) == [f"f-{i:03d}.ndjson" for i in range(3)]


def ingest_body(root: str, date: str) -> dict:
    """The child's step: the ingest flow's task bodies over 12 good files and one refused file of ``date``."""
    config = etl.settings()
    urls = _files(Path(root), date, 12) + [write_input(Path(root), date, "big.ndjson", good_lines(40, 1))]
    checks = etl.validate_files(urls, config)
    etl.quarantine_files([c for c in checks if not c.valid], config)
    tracked = etl.track_and_batch([c for c in checks if c.valid], config)
    made = [r.manifest_name for r in tracked["manifests"]]
    for day in tracked["dates"]:
        made += [r.manifest_name for r in etl.create_manifests(day, config.max_files_per_manifest, config)]
    return {"manifests": made}


@pytest.mark.sweep  # a child killed at each write: `make test-sweep`, which CI runs
def test_ingest_killed_at_each_write_then_redelivered_and_flushed_loses_and_duplicates_nothing(etl_env, tmp_path):
    root, table = etl_env["root"], etl_env["table"]
    call = "tests.etl.test_etl_ingest_faults:ingest_body"
    writes = count_writes(call, {"root": str(root), "date": "2025-03-01"}, tmp_path / "writes.log")
    kinds = {w.kind for w in writes}
    assert {"dynamodb:transact:" + table, "objects:put_file:quarantine", "objects:put_bytes:manifests"} <= kinds, kinds
    points = crash_points(writes)
    dates = ["2025-03-01"]
    for i, point in enumerate(points):
        date = f"2025-03-{i + 2:02d}"
        dates.append(date)
        result = run_child(call, {"root": str(root), "date": date}, f"{point}:kill:{'after' if i % 2 else 'before'}")
        assert killed(result) or (result.returncode == 0 and i % 2), result.stderr[
            -2000:
        ]  # see above: no "after" a refused write
        ingest_body(str(root), date)  # SQS delivers the events again
    flushed = ndjson_flush_orphans(
        today=TODAY,
        merge_deployment=MISSING_DEPLOYMENT,
        release_claims_after_seconds=0,
        restart_pending_after_seconds=0,
    )
    for date in dates:
        claimed = _consistent(table, root, date)
        assert sorted(k for keys_ in claimed.values() for k in keys_) == [f"f-{i:03d}.ndjson" for i in range(12)]
        big = records(table)[(date, "big.ndjson")]
        assert big["status"].startswith("quarantined#")
        assert Path(big["quarantine_path"][7:]).read_bytes() == (root / keys.input_key(date, "big.ndjson")).read_bytes()
    pending_records = sum(
        1 for k, v in records(table).items() if k[1].startswith("MANIFEST#") and v["status"] == "pending"
    )
    assert flushed["launch_failures"] == pending_records  # every manifest is (re)started: none orphaned
    print(f"ingest: {len(writes)} writes, {len(points)} crash points exercised (kill before/after)")


# --------------------------------------------------------------------------- item 7: quarantined files come back


def test_a_quarantined_file_uploaded_again_is_validated_again_and_batched(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    big = write_input(root, TODAY, "late.ndjson", good_lines(40, 1))
    first = ndjson_ingest(file_urls=[big], merge_deployment=MISSING_DEPLOYMENT)
    assert first["quarantined"] == 1 and records(table)[(TODAY, "late.ndjson")]["status"].startswith("quarantined#")
    again = ndjson_ingest(file_urls=[big], merge_deployment=MISSING_DEPLOYMENT)  # same bytes: still refused, not copied
    assert again["quarantined"] == 1 and records(table)[(TODAY, "late.ndjson")]["status"].startswith("quarantined#")

    write_input(root, TODAY, "late.ndjson", good_lines(1, 1))  # uploaded again, the right size
    fixed = ndjson_ingest(file_urls=[big], merge_deployment=MISSING_DEPLOYMENT)
    assert fixed["revalidated"] == 1
    item = records(table)[(TODAY, "late.ndjson")]
    assert item["status"] == f"pending#{item['shard_id']}" and item["released_at"] and item["error_message"] == ""
    flushed = ndjson_flush_orphans(today="2026-03-02", merge_deployment=MISSING_DEPLOYMENT)
    assert len(flushed["manifests"]) == 1
    assert _consistent(table, root, TODAY) == {records(table)[(TODAY, "late.ndjson")]["manifest_path"]: ["late.ndjson"]}


def test_a_quarantined_file_uploaded_again_with_the_same_size_is_validated_again(etl_env, monkeypatch):
    """A new version of the same size (another ETag; locally another mtime) is validated again with the settings
    of the day; the same version is not (that takes `etl release-quarantine`)."""
    root, table = etl_env["root"], etl_env["table"]
    url = write_input(root, TODAY, "same-size.ndjson", good_lines(40, 1))
    size = Path(root / "pipeline" / "input" / TODAY / "same-size.ndjson").stat().st_size
    assert ndjson_ingest(file_urls=[url], merge_deployment=MISSING_DEPLOYMENT)["quarantined"] == 1
    monkeypatch.setenv("ETL_EXPECTED_FILE_SIZE_MB", str(size / (1024 * 1024)))  # the settings are fixed
    unchanged = ndjson_ingest(file_urls=[url], merge_deployment=MISSING_DEPLOYMENT)  # the same version again
    assert unchanged["revalidated"] == 0 and records(table)[(TODAY, "same-size.ndjson")]["status"].startswith(
        "quarantined#"
    )

    path = root / "pipeline" / "input" / TODAY / "same-size.ndjson"
    data = path.read_bytes()
    path.write_bytes(data.replace(b"row-", b"ROW-"))  # other bytes, same length
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # a later upload
    assert path.stat().st_size == size and path.read_bytes() != data
    again = ndjson_ingest(file_urls=[url], merge_deployment=MISSING_DEPLOYMENT)
    item = records(table)[(TODAY, "same-size.ndjson")]
    assert again["revalidated"] == 1 and item["status"] == f"pending#{item['shard_id']}" and item["released_at"]


def test_release_quarantine_after_the_settings_are_fixed(etl_env, monkeypatch, capsys):
    from deployments.cli import main

    root, table = etl_env["root"], etl_env["table"]
    config = etl.settings()
    urls = [write_input(root, TODAY, f"q-{i}.ndjson", good_lines(40, i)) for i in range(2)]
    etl.quarantine_files(etl.validate_files(urls, config), config)
    assert main(["etl", "release-quarantine", "--date", TODAY, "--file", "nope.ndjson"]) == 2
    assert "not quarantined" in capsys.readouterr().err
    assert main(["etl", "release-quarantine", "--date", TODAY]) == 0  # settings unchanged: still refused
    assert set(json.loads(capsys.readouterr().out)["refused"]) == {"q-0.ndjson", "q-1.ndjson"}
    assert {k[1]: v["status"].split("#")[0] for k, v in records(table).items()} == {
        "q-0.ndjson": "quarantined",
        "q-1.ndjson": "quarantined",
    }

    monkeypatch.setenv("ETL_EXPECTED_FILE_SIZE_MB", "0.01")  # the settings are fixed
    assert main(["etl", "release-quarantine", "--date", TODAY, "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["would_release"] == ["q-0.ndjson", "q-1.ndjson"]
    out = etl_ops.release_quarantine(TODAY, ["q-0.ndjson"], dry_run=True)
    assert out["would_release"] == ["q-0.ndjson"] and records(table)[(TODAY, "q-0.ndjson")]["status"].startswith(
        "quarantined#"
    )
    assert etl_ops.release_quarantine(TODAY, ["q-0.ndjson"])["released"] == ["q-0.ndjson"]
    assert main(["etl", "release-quarantine", "--date", TODAY]) == 0
    assert etl_ops.release_quarantine(TODAY)["released"] == []  # nothing quarantined is left: a no-op
    statuses = {k[1]: v["status"] for k, v in records(table).items()}
    assert all(s.startswith("pending#") for s in statuses.values()), statuses
    made = etl.create_manifests(TODAY, 1, config, partial=True)
    assert sum(r.file_count for r in made) == 2


# --------------------------------------------------------------------------- item 8: quarantine streams, once


def test_a_refused_file_is_streamed_to_quarantine_once_per_version(etl_env, tmp_path):
    root, table = etl_env["root"], etl_env["table"]
    path = root / keys.input_key(TODAY, "huge.ndjson")
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"pad": "x" * 1000}) + "\n"
    with open(path, "w") as handle:
        for _ in range(24 * 1024):  # ~24 MB, refused as too big
            handle.write(line)
    config = etl.settings()
    checks = etl.validate_files([path.as_uri()], config)
    log = tmp_path / "writes.log"
    tracemalloc.start()
    try:
        with faults.inject(log=str(log)):
            etl.quarantine_files(checks, config)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, f"quarantine held {peak} bytes: the file was read whole"
    copies = [line for line in log.read_text().splitlines() if "\tobjects\t" in line and "reason.json" not in line]
    assert len(copies) == 1 and "put_file" in copies[0]
    quarantined = root / keys.quarantine_key(TODAY, "huge.ndjson")
    assert quarantined.stat().st_size == path.stat().st_size and quarantined.read_bytes() == path.read_bytes()
    item = records(table)[(TODAY, "huge.ndjson")]
    assert (item["source_size_bytes"], item["status"].split("#")[0]) == (path.stat().st_size, "quarantined")

    log.unlink()
    with faults.inject(log=str(log)):  # the next landing scan sees it again: nothing is copied or written
        etl.quarantine_files(etl.validate_files([path.as_uri()], config), config)
    assert not log.exists() or log.read_text() == ""

    with open(path, "a") as handle:  # a new version, still too big: copied once more, reason and record updated
        handle.write(line)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    out = etl.quarantine_files(etl.validate_files([path.as_uri()], config), config)
    assert out[0]["outcome"] == "applied" and quarantined.stat().st_size == path.stat().st_size
    assert records(table)[(TODAY, "huge.ndjson")]["source_size_bytes"] == path.stat().st_size
