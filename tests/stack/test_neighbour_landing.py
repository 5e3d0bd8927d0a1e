"""A landing place shared with other local users: names it cannot decode (made by another uid) are quarantined
under a bounded name with the original recorded, and never stop or slow the watch for good files beside them; a
replacement that keeps the old size and mtime (``cp -p``, rsync) is offered again, an unchanged file never."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tasks.landing import watch
from tasks.landing.watch import LocalWatchSource
from tests.helpers.landing import receive_all
from tests.helpers.other_user import as_nobody_python

INPUT = "pipeline/input/"
DAY = f"{INPUT}2026-01-05"
BAD_FOLDER = b"\xff" * 90  # 270 bytes percent-encoded: past the 255-byte limit of a file name
BAD_FILE = b"\xfe" * 90 + b".ndjson"


def _latency(source: LocalWatchSource, folder: Path, name: str) -> float:
    """Seconds from a good file written in ``folder`` to its offer (acked at once)."""
    start = time.monotonic()
    (folder / name).write_text("{}\n")
    got = receive_all(source, 40, until=1)
    assert [a.key for a in got] == [f"{DAY}/{name}"]
    source.ack(got)
    return time.monotonic() - start


def _quarantined(root: Path) -> dict[bytes, Path]:
    """What lies in the landing quarantine: original name (bytes, from its reason file) -> where it lies."""
    kept = {}
    for reason in (root / "quarantine/landing").rglob("*.reason.json"):
        kept[bytes.fromhex(json.loads(reason.read_text())["name_hex"])] = Path(str(reason).removesuffix(".reason.json"))
    return kept


@pytest.fixture
def shared_place():
    """A landing place other users may write into (their own files and folders), outside root's private tmp."""
    root = Path(tempfile.mkdtemp())
    root.chmod(0o755)
    day = root / DAY
    day.mkdir(parents=True)
    for path in (root / "pipeline", root / INPUT, day):
        path.chmod(0o777)
    yield root
    shutil.rmtree(root)


def test_undecodable_names_from_another_user_are_quarantined_and_good_files_keep_their_latency(shared_place):
    root, day = shared_place, shared_place / DAY
    (day / "deep").mkdir()
    (day / "deep").chmod(0o777)
    source = LocalWatchSource(root.as_uri(), INPUT, settle_seconds=0.3, rescan_seconds=3600)  # the watch alone
    try:
        assert receive_all(source, 0.5) == []
        before = max(_latency(source, day, f"before-{i}.ndjson") for i in range(3))
        folder, file, deep = os.fsencode(day) + b"/" + BAD_FOLDER, os.fsencode(day) + b"/" + BAD_FILE, b"deep/"
        made = as_nobody_python(
            "import os\n"
            f"os.mkdir({folder!r})\n"
            f"open({folder + b'/inside.ndjson'!r}, 'wb').write(b'kept\\n')\n"
            f"open({file!r}, 'wb').write(b'file\\n')\n"
            f"os.mkdir({os.fsencode(day) + b'/' + deep + BAD_FOLDER!r})\n"
        )
        assert made.returncode == 0, made.stderr
        assert receive_all(source, 6) == []  # nothing with an odd name is offered; a stopped watch would back off
        after = max(_latency(source, day, f"after-{i}.ndjson") for i in range(3))
        assert after <= before + 2.0, (before, after)
        assert sorted(os.listdir(os.fsencode(day))) == [b"after-0.ndjson", b"after-1.ndjson", b"after-2.ndjson"] + [
            b"before-0.ndjson",
            b"before-1.ndjson",
            b"before-2.ndjson",
            b"deep",
        ]
        assert os.listdir(os.fsencode(day / "deep")) == []
        kept = _quarantined(root)
        relative = os.fsencode(DAY) + b"/"
        assert sorted(kept) == sorted([relative + BAD_FOLDER, relative + BAD_FILE, relative + deep + BAD_FOLDER])
        assert (kept[relative + BAD_FOLDER] / "inside.ndjson").read_bytes() == b"kept\n"  # the folder, whole
        assert kept[relative + BAD_FILE].read_bytes() == b"file\n"
        assert all(len(os.fsencode(path.name)) < 100 for path in kept.values())
        reason = json.loads(Path(f"{kept[relative + BAD_FILE]}.reason.json").read_text())
        assert reason["reason"] == "the name is not UTF-8" and reason["name"].endswith("\\xfe" * 90 + ".ndjson")
        assert source._thread.is_alive()
        assert _latency(source, day, "later.ndjson") <= before + 2.0  # still the watch: no listing for an hour
    finally:
        source.close()


def test_any_name_has_a_quarantine_name_the_file_system_takes():
    for name in (b"\xff" * 255, "é".encode() * 127, b"a\\b" * 80, b"." * 200, b"\x01"):
        key = watch.quarantine_key(b"pipeline/input/" + b"\xfe" * 200 + b"/" + name)
        assert all(0 < len(segment.encode()) <= 100 for segment in key.split("/")), key
        assert not key.rsplit("/", 1)[1].startswith(".")  # never a hidden (ignored) name
    assert watch.quarantine_name(b"a\xff") != watch.quarantine_name(b"a\xfe")  # the hash tells them apart


def test_a_replacement_with_the_old_size_and_mtime_is_offered_again_and_an_unchanged_file_never(tmp_path, make_source):
    source = make_source(rescan_seconds=1)  # listings every second too: they must not offer it again either
    day = tmp_path / DAY
    day.mkdir(parents=True)
    target = day / "f.ndjson"
    target.write_text('{"v": 1}\n')
    first = receive_all(source, 5, until=1)
    assert [a.key for a in first] == [f"{DAY}/f.ndjson"]
    source.ack(first)
    assert receive_all(source, 2.5) == []  # unchanged: not offered twice

    staged = tmp_path / "staged.ndjson"
    staged.write_text('{"v": 2}\n')  # the same size
    stat = target.stat()
    os.utime(staged, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same mtime
    subprocess.run(["cp", "-p", str(staged), str(target)], check=True)  # rewritten in place, its times kept
    assert (target.stat().st_size, target.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    second = receive_all(source, 5, until=1)
    assert [(a.key, a.size) for a in second] == [(f"{DAY}/f.ndjson", stat.st_size)]
    assert second[0].event_id != first[0].event_id
    source.ack(second)

    synced = day / ".f.ndjson.rsync"  # rsync: a hidden temporary with the old times, renamed over
    synced.write_text('{"v": 3}\n')
    os.utime(synced, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.rename(synced, target)
    third = receive_all(source, 5, until=1)
    assert [a.key for a in third] == [f"{DAY}/f.ndjson"] and third[0].event_id not in (
        first[0].event_id,
        second[0].event_id,
    )
    source.ack(third)
    assert receive_all(source, 2.5) == []
    source.close()
    time.sleep(watch.WATERMARK_SLACK_S + 0.1)
    assert receive_all(make_source(), 2) == []  # a restart offers nothing unchanged either
