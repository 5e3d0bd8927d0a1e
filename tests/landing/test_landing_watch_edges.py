"""The file watch source at its edges: a file its writer still holds, names that are no valid key, folders in a
suffix-filtered watch, and the catch-up watermark (a restart never offers what was acked, whatever expired since,
and notes only what changed)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from tasks.landing import watch
from tasks.landing.watch import LocalWatchSource, open_for_writing, read_watermark
from tests.helpers.landing import receive_all

INPUT = "pipeline/input/"


def test_a_file_its_writer_still_holds_is_not_offered_however_long_it_is_stable(tmp_path, make_source):
    source = make_source(settle_seconds=0.3)
    path = tmp_path / INPUT / "2026-01-05" / "slow.ndjson"
    path.parent.mkdir(parents=True)
    with open(path, "w") as handle:
        handle.write('{"i": 0}\n')
        handle.flush()
        if open_for_writing(path) is not True:
            pytest.skip("this file system gives no read leases: a held file cannot be told apart")
        assert receive_all(source, 1.5) == []  # stable 5x the settle time, but its writer holds it
        handle.write('{"i": 1}\n')
    got = receive_all(source, 5, until=1)
    assert [(a.key, a.size) for a in got] == [("pipeline/input/2026-01-05/slow.ndjson", 18)]  # whole, once closed


def test_a_name_that_is_not_utf8_is_quarantined_with_its_reason_and_its_neighbours_go_on(tmp_path, make_source):
    source = make_source(rescan_seconds=3600)  # only the watch (started again after the bad name) can see the rest
    day = tmp_path / INPUT / "2026-01-05"
    day.mkdir(parents=True)
    assert receive_all(source, 0.3) == []
    bad = os.fsencode(day) + b"/bad\xff\xfe.ndjson"
    with open(bad, "wb") as handle:
        handle.write(b"{}\n")
    (day / "good.ndjson").write_text("{}\n")
    got = receive_all(source, 10, until=1)
    assert [a.key for a in got] == ["pipeline/input/2026-01-05/good.ndjson"]
    source.ack(got)
    assert not os.path.exists(bad)
    quarantined = tmp_path / watch.quarantine_key(b"pipeline/input/2026-01-05/bad\xff\xfe.ndjson")
    assert quarantined.name == "bad_.ndjson-" + hashlib.sha256(b"bad\xff\xfe.ndjson").hexdigest()[:16]
    assert quarantined.read_bytes() == b"{}\n"
    reason = json.loads(Path(f"{quarantined}.reason.json").read_text())
    assert (
        reason["reason"] == "the name is not UTF-8"
        and reason["name"] == "pipeline/input/2026-01-05/bad\\xff\\xfe.ndjson"
    )
    (day / "later.ndjson").write_text("{}\n")  # the watch still runs: seen long before the next listing
    assert [a.key for a in receive_all(source, 10, until=1)] == ["pipeline/input/2026-01-05/later.ndjson"]


def test_a_folder_moved_into_a_suffix_filtered_watch_is_listed_at_once(tmp_path, make_source):
    source = make_source("input/", suffixes=[".mp4"], rescan_seconds=3600)
    assert receive_all(source, 0.3) == []
    staged = tmp_path / "staging" / "job-1"
    staged.mkdir(parents=True)
    (staged / "source.mp4").write_bytes(b"not a video")
    (staged / "notes.txt").write_text("not an upload")
    os.rename(staged, tmp_path / "input" / "job-1")
    got = receive_all(source, 5, until=1)
    assert [a.key for a in got] == ["input/job-1/source.mp4"]


def _land(root: Path, key: str) -> None:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}\n")


def test_a_restart_offers_only_what_was_not_acked_and_notes_only_what_changed(tmp_path, make_source, monkeypatch):
    old = [f"{INPUT}2026-01-0{d}/f-{i}.ndjson" for d in (1, 2, 3) for i in range(20)]
    for key in old:
        _land(tmp_path, key)
    time.sleep(
        watch.WATERMARK_SLACK_S + 0.1
    )  # (a file changed within the slack before a watermark is offered once more)
    first = make_source()
    got = receive_all(first, 10, until=len(old))
    assert sorted(a.key for a in got) == sorted(old)
    first.ack(got)
    assert read_watermark(tmp_path / INPUT).at > 0  # every file the first listing found is acked: kept beside the data
    first.close()
    time.sleep(watch.WATERMARK_SLACK_S + 0.1)  # what lands now is after the watermark however coarse the clock
    new = [f"{INPUT}2026-01-03/late.ndjson", f"{INPUT}2026-01-04/new.ndjson"]
    for key in new:
        _land(tmp_path, key)

    # the tracking records of the old files may have expired by now: nothing but the watermark keeps them out
    noted: list[str] = []
    real_note = LocalWatchSource._note
    monkeypatch.setattr(
        LocalWatchSource, "_note", lambda self, key, *args, **kw: noted.append(key) or real_note(self, key, *args, **kw)
    )
    second = make_source()
    offered = receive_all(second, 5, until=len(new))
    assert sorted(a.key for a in offered) == sorted(new)
    assert receive_all(second, 1) == []
    assert sorted(set(noted)) == sorted(new)  # the work per file (offer, tracking, events) is for the new ones only
