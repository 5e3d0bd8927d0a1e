"""Releases: one version everywhere it is said (pyproject, `pipelines --version`, the image's label), each release's
commit in releases.json and in main's history (no tags needed), CHANGELOG.md a section per release, and `make up`'s
notice when the stack's data was written by another release."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from deployments import releases
from tasks.core.release import VERSION

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_one_version_in_pyproject_the_command_the_image_and_releases_json():
    assert tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"] == VERSION
    shown = subprocess.run(
        [sys.executable, "-m", "deployments.cli", "--version"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert (shown.returncode, shown.stdout.strip()) == (0, f"pipelines {VERSION}")
    assert DockerfileParser(str(REPO_ROOT / "Dockerfile")).labels["org.opencontainers.image.version"] == VERSION
    recorded = releases.releases()
    assert list(recorded)[-1] == VERSION, "releases.json's newest release is this tree's"


def test_each_published_release_is_a_commit_of_this_clones_history():
    """CI's clone carries no tags: releases.json and the history are the record."""
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    published = {v: c for v, c in releases.releases().items() if c}
    assert set(published) >= {"0.1.0", "0.2.0"}
    for version, commit in published.items():
        ancestor = subprocess.run(["git", "-C", str(REPO_ROOT), "merge-base", "--is-ancestor", commit, "HEAD"])
        assert ancestor.returncode == 0, f"v{version} ({commit}) is not in HEAD's history"
    assert releases.release_commit("0.2.0") == published["0.2.0"]
    with pytest.raises(LookupError):
        releases.release_commit(VERSION)  # not tagged until it is released


def test_the_changelog_has_a_section_per_release_newest_first():
    sections = list(releases.changelog_sections())
    assert sections == sorted(releases.releases(), key=releases.version_key, reverse=True)


def test_operator_steps_are_the_do_items_of_the_releases_in_between():
    since_v1 = releases.operator_steps("0.1.0")
    assert any(step.startswith("v0.2.0:") and "launch seal" in step for step in since_v1)
    assert not any(step.startswith("v0.1.0:") for step in since_v1)
    assert releases.operator_steps(VERSION) == []
    from_scratch = releases.operator_steps(None)
    assert [s.split(":")[0] for s in from_scratch] == sorted(
        (s.split(":")[0] for s in from_scratch), key=lambda v: releases.version_key(v[1:])
    ), "oldest release first"


def test_up_names_the_release_that_wrote_the_data_and_what_to_do(tmp_path):
    fresh = tmp_path / "fresh"
    assert releases.upgrade_notice(fresh) == []  # a folder no stack used
    v2 = tmp_path / "v2"
    (v2 / "secrets").mkdir(parents=True)
    (v2 / "secrets" / "launch-key").write_text("k")  # v0.2.0's, from before the stamp
    notice = "\n".join(releases.upgrade_notice(v2))
    assert "written by v0.2.0 (inferred" in notice and f"to v{VERSION}" in notice
    v1 = tmp_path / "v1"
    (v1 / "dynamodb").mkdir(parents=True)
    notice = "\n".join(releases.upgrade_notice(v1))
    assert "written by v0.1.0" in notice and "launch seal" in notice  # v0.2.0's step applies to a v0.1.0 folder
    releases.write_stamp(v1)
    assert releases.read_stamp(v1) == VERSION and releases.upgrade_notice(v1) == []
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / releases.STAMP_NAME).write_text(json.dumps({"version": "99.0.0"}))
    (line,) = releases.upgrade_notice(newer)
    assert "written by v99.0.0" in line and "older" in line  # said, never refused
