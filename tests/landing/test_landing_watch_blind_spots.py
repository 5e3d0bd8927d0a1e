"""The folder listener's blind spots (issue 42): what lands while no listener runs, or lands oddly, is offered once
stable or quarantined with its reason, and the backlog health check counts it until then."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tasks.core.object_store import LocalStore
from tasks.health import listeners
from tasks.landing import watch
from tasks.landing.watch import WATERMARK_NAME
from tests.helpers.landing import receive_all

INPUT = "pipeline/input/"  # the ETL landing's prefix: its registry entry serves the backlog check
LATER = 10**7  # seconds: a "now" for the backlog check past any file's age


@pytest.fixture(autouse=True)
def short_slack(monkeypatch):
    """A watermark's slack of 0.3 s (2 s in use, for clocks that tick coarser than this kernel's): shorter waits."""
    monkeypatch.setattr(watch, "WATERMARK_SLACK_S", 0.3)


def land(root: Path, key: str, data: bytes = b"{}\n") -> Path:
    """Write ``data`` at ``key`` under ``root`` (closed once written)."""
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def backlog(root: Path) -> list[str]:
    """What the health check counts as waiting for the ETL listener under ``root``, whatever its age."""
    return sorted(listeners.local_backlog(LocalStore(root), listeners.places()["etl"], 0, now=time.time() + LATER))


def take_everything(source, count: int) -> list:
    """Receive ``count`` arrivals and ack them: the listing that found them becomes the watermark."""
    got = receive_all(source, 10, until=count)
    assert len(got) == count
    source.ack(got)
    assert (source.folder / WATERMARK_NAME).exists()
    return got


def past_the_watermark() -> None:
    """Wait until what changes now is past the watermark's slack (a watermark is taken that much early)."""
    time.sleep(watch.WATERMARK_SLACK_S + 0.1)


def offered(source, seconds: float = 5, until: int | None = None) -> list[tuple[str, int]]:
    return sorted((a.key, a.size) for a in receive_all(source, seconds, until=until))


# ------------------------------------------------------------------ 1. a file rewritten in place, folder unchanged


def test_a_file_rewritten_in_place_while_no_listener_runs_is_offered_and_counted(tmp_path, make_source):
    old = [land(tmp_path, f"{INPUT}2026-01-0{d}/f-{i}.ndjson") for d in (1, 2) for i in range(3)]
    past_the_watermark()
    first = make_source()
    take_everything(first, len(old))
    first.close()
    past_the_watermark()
    with open(old[4], "r+b") as handle:  # in place: the folder's entries (and times) stay as they were
        handle.write(b'{"v": 2}\n')
    assert backlog(tmp_path) == [f"{INPUT}2026-01-02/f-1.ndjson"]
    second = make_source()
    assert offered(second, 3, until=1) == [(f"{INPUT}2026-01-02/f-1.ndjson", 9)]
    assert receive_all(second, 0.5) == []  # the unchanged ones: acked before the watermark


def test_a_file_still_settling_when_the_listener_stops_is_offered_by_the_next(tmp_path, make_source):
    path = land(tmp_path, f"{INPUT}2026-01-01/f.ndjson")
    past_the_watermark()
    first = make_source(settle_seconds=30)  # the rewrite below cannot settle before this listener stops
    take_everything(first, 1)
    past_the_watermark()
    with open(path, "r+b") as handle:  # the watch sees the write: it settles for 30 s
        handle.write(b'{"v": 22}\n')
    assert receive_all(first, 1) == []
    first.close()
    second = make_source()
    assert offered(second, 3, until=1) == [(f"{INPUT}2026-01-01/f.ndjson", 10)]


# ------------------------------------------------------------------ 2. a folder written to, then moved in


def test_a_folder_written_to_then_moved_in_while_no_listener_runs_has_all_its_files_offered(tmp_path, make_source):
    staged = tmp_path / "staging" / "2026-01-03"
    land(staged, "early.ndjson")
    land(staged, "deep/early.ndjson")
    land(tmp_path, f"{INPUT}2026-01-01/f.ndjson")
    past_the_watermark()
    first = make_source()
    take_everything(first, 1)
    first.close()
    past_the_watermark()
    land(staged, "late.ndjson")  # the folder changes after the watermark, then moves in
    os.rename(staged, tmp_path / INPUT / "2026-01-03")
    expected = [f"{INPUT}2026-01-03/{name}" for name in ("deep/early.ndjson", "early.ndjson", "late.ndjson")]
    assert backlog(tmp_path) == expected
    second = make_source()
    assert offered(second, 5, until=3) == [(key, 3) for key in expected]


def test_a_folder_renamed_within_the_prefix_while_no_listener_runs_offers_its_files_under_their_new_keys(
    tmp_path, make_source
):
    land(tmp_path, f"{INPUT}2026-01-01/a/f.ndjson")
    past_the_watermark()
    first = make_source()
    take_everything(first, 1)
    first.close()
    past_the_watermark()
    os.rename(tmp_path / INPUT / "2026-01-01", tmp_path / INPUT / "2026-01-02")
    assert backlog(tmp_path) == [f"{INPUT}2026-01-02/a/f.ndjson"]
    assert offered(make_source(), 3, until=1) == [(f"{INPUT}2026-01-02/a/f.ndjson", 3)]


def test_a_folder_renamed_under_a_file_still_settling_holds_up_neither_the_file_nor_the_watermark(
    tmp_path, make_source
):
    """The watch reports only the folder: the file's old key, gone with it, is settled at once, not taken for
    another user's file (a lease check on a gone path) that keeps the watermark back for a minute."""
    held = land(tmp_path, f"{INPUT}2026-01-01/held.ndjson", b"")
    source = make_source(settle_seconds=2.0)
    with open(held, "ab") as writer:
        writer.write(b"{}")
        writer.flush()
        assert receive_all(source, 0.5) == []  # listed and watched while a writer holds it
        writer.write(b"\n")
    assert receive_all(source, 0.5) == []  # the last write seen; the file settles for 2 s
    os.rename(tmp_path / INPUT / "2026-01-01", tmp_path / INPUT / "2026-01-02")
    take_everything(source, 1)
    past_the_watermark()
    source._next_rescan = 0.0
    assert receive_all(source, 0.5) == []
    renamed = tmp_path / INPUT / "2026-01-02" / "held.ndjson"
    assert watch.read_watermark(source.folder).at > os.stat(renamed).st_ctime
    assert backlog(tmp_path) == []


# ------------------------------------------------------------------ 4. the same invalid name twice


def test_two_files_with_the_same_invalid_name_are_both_kept_in_quarantine_with_their_reasons(tmp_path, make_source):
    source = make_source(rescan_seconds=3600)
    day = tmp_path / INPUT / "2026-01-05"
    day.mkdir(parents=True)
    bad = os.fsencode(day) + b"/bad\xff.ndjson"
    quarantined = tmp_path / "quarantine/landing/pipeline/input/2026-01-05"
    for body in (b"first\n", b"second\n"):
        with open(bad, "wb") as handle:
            handle.write(body)
        deadline = time.monotonic() + 10
        while os.path.exists(bad) and time.monotonic() < deadline:
            source.receive(max_items=10, wait_seconds=0.2)
        assert not os.path.exists(bad)
    first = watch.quarantine_name(b"bad\xff.ndjson")
    kept = sorted(p.name for p in quarantined.iterdir())
    assert kept == [first, f"{first}.reason.json", f"{first}~2", f"{first}~2.reason.json"]
    assert (quarantined / first).read_bytes() == b"first\n"
    assert (quarantined / f"{first}~2").read_bytes() == b"second\n"
    for name in (first, f"{first}~2"):
        reason = json.loads((quarantined / f"{name}.reason.json").read_text())
        assert (reason["reason"], reason["name"]) == ("the name is not UTF-8", f"{INPUT}2026-01-05/bad\\xff.ndjson")


# ------------------------------------------------------------------ 5. the clock stepped back


def test_a_clock_stepped_back_while_no_listener_runs_hides_nothing(tmp_path, make_source):
    land(tmp_path, f"{INPUT}2026-01-01/f.ndjson")
    past_the_watermark()
    first = make_source()
    take_everything(first, 1)
    first.close()
    # the watermark was taken while the clock was an hour fast; it was stepped back since
    mark_file = tmp_path / INPUT / WATERMARK_NAME
    mark = json.loads(mark_file.read_text())
    mark["watermark"] += 3600
    mark_file.write_text(json.dumps(mark))
    past_the_watermark()
    land(tmp_path, f"{INPUT}2026-01-01/in-the-gap.ndjson")
    assert backlog(tmp_path) == [f"{INPUT}2026-01-01/in-the-gap.ndjson"]
    assert offered(make_source(), 3, until=1) == [(f"{INPUT}2026-01-01/in-the-gap.ndjson", 3)]


def test_the_watermark_comes_from_the_file_systems_clock_not_the_listeners(tmp_path, make_source):
    land(tmp_path, f"{INPUT}2026-01-01/f.ndjson")
    past_the_watermark()
    fast = make_source(wall_clock=lambda: time.time() + 3600)  # this process's clock is an hour ahead
    take_everything(fast, 1)
    fast.close()
    past_the_watermark()
    land(tmp_path, f"{INPUT}2026-01-01/g.ndjson")
    assert backlog(tmp_path) == [f"{INPUT}2026-01-01/g.ndjson"]
    assert offered(make_source(wall_clock=lambda: time.time() - 3600), 3, until=1) == [
        (f"{INPUT}2026-01-01/g.ndjson", 3)
    ]


# ------------------------------------------------------------------ 6. symbolic links


def test_a_symbolic_link_is_quarantined_never_followed_and_counted_until_then(tmp_path, make_source):
    outside = land(tmp_path, "secrets/key.pem", b"secret\n")
    day = tmp_path / INPUT / "2026-01-01"
    day.mkdir(parents=True)
    os.symlink(outside, day / "key.ndjson")
    os.symlink(outside.parent, day / "folder")
    os.symlink(tmp_path / "nowhere", day / "dangling.ndjson")
    links = [f"{INPUT}2026-01-01/{name}" for name in ("dangling.ndjson", "folder", "key.ndjson")]
    assert backlog(tmp_path) == links
    source = make_source(rescan_seconds=3600)
    assert receive_all(source, 1) == []
    os.symlink(outside, day / "later.ndjson")  # seen by the watch
    assert receive_all(source, 1) == []
    assert sorted(os.listdir(day)) == []
    quarantined = tmp_path / "quarantine/landing" / INPUT / "2026-01-01"
    for name in ("dangling.ndjson", "folder", "key.ndjson", "later.ndjson"):
        kept = quarantined / watch.quarantine_name(name.encode())
        assert os.path.islink(kept)  # the link itself, as it was
        reason = json.loads(Path(f"{kept}.reason.json").read_text())
        assert reason["reason"].startswith("a symbolic link (to ") and "never followed" in reason["reason"]
    assert os.readlink(quarantined / watch.quarantine_name(b"key.ndjson")) == str(outside)
    assert outside.read_bytes() == b"secret\n"
    assert backlog(tmp_path) == []


# ------------------------------------------------------------------ 7. an empty folder whose name is not UTF-8


def test_an_empty_folder_whose_name_is_not_utf8_is_quarantined_once_and_the_watch_goes_on(
    tmp_path, make_source, caplog
):
    caplog.set_level(logging.WARNING, logger=watch.__name__)
    source = make_source(rescan_seconds=3600)  # only the watch can see the file landing after it
    day = tmp_path / INPUT / "2026-01-05"
    day.mkdir(parents=True)
    assert receive_all(source, 0.3) == []
    bad = os.fsencode(day) + b"/sub\xff"
    os.mkdir(bad)
    assert receive_all(source, 2) == []
    assert not os.path.exists(bad)
    quarantined = tmp_path / watch.quarantine_key(b"pipeline/input/2026-01-05/sub\xff")
    assert quarantined.is_dir()
    reason = json.loads(Path(f"{quarantined}.reason.json").read_text())
    assert reason["reason"] == "the name is not UTF-8"
    land(day, "later.ndjson")
    assert offered(source, 5, until=1) == [(f"{INPUT}2026-01-05/later.ndjson", 3)]
    stopped = [r for r in caplog.records if "file watch" in r.getMessage()]
    assert len(stopped) <= 2, [r.getMessage() for r in stopped]
    assert len([r for r in caplog.records if "quarantined" in r.getMessage()]) == 1


# ------------------------------------------------------------------ 3. a writer the kernel cannot check

LISTENER_UID, WRITER_UID = 65533, 65534  # two users that are not root (nobody writes; the listener is another)

# each script imports what it needs, then becomes its user (the interpreter may live where only root can read)
BECOME = "import os, sys; os.setgroups([]); os.setgid(int(sys.argv[-1])); os.setuid(int(sys.argv[-1]))\n"
LISTEN = (
    """
import json, sys, time
from tasks.landing.watch import LocalWatchSource
"""
    + BECOME
    + """
source = LocalWatchSource(sys.argv[1], "pipeline/input/", settle_seconds=0.3, unchecked_settle_seconds=3.0)
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    for arrival in source.receive(wait_seconds=0.2):
        print(json.dumps([arrival.key, arrival.size]), flush=True)
        source.ack([arrival])
source.close()
"""
)
WRITE = (
    BECOME
    + """
with open(sys.argv[1], "w") as handle:
    handle.write('{"message": 1}\\n')
    handle.flush()
    print("part", flush=True)
    sys.stdin.readline()  # paused, as a slow copy does, far past settle_seconds
    handle.write('{"message": 2}\\n{"message": 3}\\n')
print("done", flush=True)
"""
)


def as_user(uid: int, script: str, *args: str) -> subprocess.Popen:
    """``script`` run by this project's Python as ``uid`` (no supplementary groups), lines in and out."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args, str(uid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": "/tmp"},
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a writer and a listener as two other users")
def test_a_writer_running_as_another_user_is_waited_for_until_its_file_stays_unchanged_much_longer():
    root = Path(tempfile.mkdtemp())
    try:
        root.chmod(0o755)
        folder = root / INPUT / "2026-01-01"
        folder.mkdir(parents=True)
        for path in (root / "pipeline", root / INPUT, folder):
            path.chmod(0o777)
        listener = as_user(LISTENER_UID, LISTEN, root.as_uri(), "12")
        assert listener.stdout.readline() == "ready\n"
        writer = as_user(WRITER_UID, WRITE, str(folder / "slow.ndjson"))
        assert writer.stdout.readline() == "part\n"
        time.sleep(1.0)  # past settle_seconds: only the longer window keeps the first message alone from going
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout.readline() == "done\n"
        first = json.loads(listener.stdout.readline() or "null")
        listener.kill()
        _, errors = listener.communicate()
        assert first == [f"{INPUT}2026-01-01/slow.ndjson", 45], errors  # whole: all three messages
        assert errors.count("cannot tell whether pipeline/input/2026-01-01/slow.ndjson is still being written") == 1
        assert f"owner uid {WRITER_UID}, this listener runs as uid {LISTENER_UID}" in errors
    finally:
        shutil.rmtree(root)


def test_a_watermark_an_older_listener_wrote_is_still_honoured_after_the_upgrade(tmp_path, make_source):
    old = land(tmp_path, f"{INPUT}2026-01-01/old.ndjson")
    past_the_watermark()
    (tmp_path / INPUT / WATERMARK_NAME).write_text(json.dumps({"watermark": old.stat().st_ctime + 0.1}))  # no folders
    new = land(tmp_path, f"{INPUT}2026-01-01/new.ndjson")
    assert backlog(tmp_path) == [f"{INPUT}2026-01-01/new.ndjson"]
    assert offered(make_source(), 2) == [(f"{INPUT}2026-01-01/new.ndjson", 3)]  # what it had acked stays acked
    assert new.exists()


def test_a_listing_starts_earlier_by_as_much_as_the_clock_was_stepped_back():
    boot_id, boot_s = watch._boot()
    now, slack = 1_800_000_000.0, watch.WATERMARK_SLACK_S
    taken_10_s_ago = watch.Watermark(now - 10 - slack, {}, boot_id, boot_s - 10)
    assert taken_10_s_ago.since(now) == pytest.approx(now - 10 - slack, abs=1)  # no step: the watermark
    assert taken_10_s_ago.since(now - 3600) == pytest.approx(now - 3600 - 10 - slack, abs=1)  # stepped back 1 h
    assert taken_10_s_ago.since(now + 3600) == now - 10 - slack  # stepped forward: nothing is hidden by that
    another_boot = watch.Watermark(now - 10 - slack, {}, "another boot", 5.0)
    assert another_boot.since(now) == now - 10 - slack
    # after a reboot to a clock behind the watermark: from this boot's start too, never from the beginning of time
    assert another_boot.since(now - 3600) == pytest.approx(now - 3600 - watch._boot()[1] - slack, abs=1)
    assert watch.Watermark().since(now) == 0.0
