"""The release stamp's crash points: `make up` ends by writing .data/stack-version.json. A process killed at that
write, before it lands or after, leaves the stamp of the release before or this release's, always whole, and the next
`up`'s notice reads it (a torn stamp would read as none: the folder taken for an older release's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployments import releases
from tests.helpers.crashpoints import count_writes, crash_points, killed, report, run_child

pytestmark = pytest.mark.crashpoints  # one write: its two crash states, by hand and in `make test-sweep` alike

BEFORE = "0.2.0"  # the release whose stamp the upgrade replaces


def stamp(data: str) -> str | None:
    """The child's step: the stamp `up` writes last, read back."""
    releases.write_stamp(Path(data))
    return releases.read_stamp(Path(data))


def _stamped_by_the_release_before(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / releases.STAMP_NAME).write_text(json.dumps({"version": BEFORE, "code": f"v{BEFORE} (old)"}) + "\n")
    return folder


def test_release_stamp_crash_points(tmp_path):
    counted = _stamped_by_the_release_before(tmp_path / "counted")
    writes = count_writes("tests.core.test_crashpoints_stamp:stamp", {"data": str(counted)}, tmp_path / "w.log")
    assert [w.kind for w in writes] == [f"objects:put_bytes:{releases.STAMP_NAME}"], writes
    assert releases.read_stamp(counted) == releases.VERSION
    plans = [(point, when) for point in crash_points(writes) for when in ("before", "after")]
    for point, when in plans:
        folder = _stamped_by_the_release_before(tmp_path / f"{point}-{when}")
        result = run_child("tests.core.test_crashpoints_stamp:stamp", {"data": str(folder)}, f"{point}:kill:{when}")
        assert killed(result), f"write {point} ({when}): {result.stderr[-2000:]}"
        stamped = json.loads((folder / releases.STAMP_NAME).read_text())  # whole, whichever it is
        assert stamped["version"] == (BEFORE if when == "before" else releases.VERSION), (point, when, stamped)
        notice = releases.upgrade_notice(folder)
        if when == "before":  # the next `up` upgrades from the release that wrote the data, as it would have
            assert notice[0].startswith(f"NOTE: this stack's data was written by v{BEFORE} (stamped)"), notice
        else:
            assert notice == []
        assert [p.name for p in folder.iterdir()] == [releases.STAMP_NAME]  # nothing staged left beside it
        print(f"point {point} ({writes[point - 1].kind}, {when}): stamp v{stamped['version']}")
    report(f"release stamp: {len(plans)} crash states exercised of {len(writes)} writes")
