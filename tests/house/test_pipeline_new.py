"""`pipelines new NAME` (deployments/ops/new.py): the name and seed it takes, the files it writes and never
overwrites, and (the sweep) a scaffolded pipeline in a copy of the repository passing its own test and the house's."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployments import cli
from deployments.ops import new

ROOT = Path(__file__).resolve().parents[2]
WRITTEN = [
    "blocks/checksum.py",
    "deployments/ops/checksum.py",
    "deployments/samples/checksum.py",
    "flows/checksum.py",
    "tasks/checksum/__init__.py",
    "tasks/checksum/alarms.py",
    "tasks/checksum/items.py",
    "tasks/checksum/keys.py",
    "tasks/checksum/landing.py",
    "tasks/checksum/pipeline.py",
    "tasks/checksum/reconcile.py",
    "tasks/checksum/retention.py",
    "tasks/checksum/work.py",
    "tests/test_checksum.py",
]
# what a scaffolded pipeline must pass in a copy of the repository, beside its own test
HOUSE_TESTS = ["tests/house/test_house.py", "tests/house/test_test_layout.py", "tests/house/test_pipeline_registry.py"]


def ruff(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``ruff ARGS`` in ``cwd`` with the repository's configuration."""
    command = [sys.executable, "-m", "ruff", *args, "--no-cache", "--config", str(ROOT / "pyproject.toml"), "."]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("Checksum", "lowercase identifier"),
        ("2fast", "lowercase identifier"),
        ("check-sum", "lowercase identifier"),
        ("check__sum", "lowercase identifier"),
        ("class", "lowercase identifier"),
        ("video", "is taken"),  # a pipeline's package
        ("core", "is taken"),  # a shared package under tasks/
        ("policies", "is taken"),  # flows/policies.py
        ("new", "is taken"),  # deployments/ops/new.py: this command's own module
    ],
)
def test_a_name_that_is_no_lowercase_identifier_or_is_taken_is_refused(name, why):
    with pytest.raises(ValueError, match=why):
        new.check_name(name, ROOT)


def test_the_default_seed_is_one_above_the_highest_pipeline_seed_and_a_taken_one_is_refused():
    seeds = {0: "phspectra", 1: "etl", 4: "records", 90: "health", 91: "retention"}
    assert new.default_seed(seeds) == 5 and new.default_seed({90: "health"}) == 1
    assert new.check_seed(7, seeds) == 7
    with pytest.raises(ValueError, match="seed 4 is records's"):
        new.check_seed(4, seeds)
    with pytest.raises(ValueError, match="0 to 89"):
        new.check_seed(90, seeds)


def test_it_writes_the_pipelines_files_parsing_and_ruff_clean(tmp_path, capsys):
    assert cli.main(["new", "checksum", "--seed", "7", "--root", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["written"] == WRITTEN
    found = sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*") if path.is_file())
    assert found == WRITTEN
    for path in WRITTEN:
        ast.parse((tmp_path / path).read_text(), path)
    assert "seed=7," in (tmp_path / "tasks/checksum/pipeline.py").read_text()
    assert 'QueueSpec("checksum-{env}", "checksum-dlq-{env}"' in (tmp_path / "tasks/checksum/pipeline.py").read_text()
    assert "class ChecksumSettings(ConfigBlock)" in (tmp_path / "blocks/checksum.py").read_text()
    checked, formatted = ruff("check", cwd=tmp_path), ruff("format", "--check", cwd=tmp_path)
    assert (checked.returncode, formatted.returncode) == (0, 0), checked.stdout + formatted.stdout


def test_it_overwrites_nothing_and_writes_nothing_when_one_of_its_files_exists(tmp_path, capsys):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test_checksum.py").write_text("kept\n")

    assert cli.main(["new", "checksum", "--root", str(tmp_path)]) == 2

    assert capsys.readouterr().err == "error: not overwriting tests/test_checksum.py: nothing written\n"
    assert [path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*")] == [
        "tests",
        "tests/test_checksum.py",
    ]
    assert (tmp_path / "tests/test_checksum.py").read_text() == "kept\n"


def _copy_of_the_repository(target: Path) -> None:
    """The checkout's files (committed or not, none ignored) in ``target``; its environments linked, not copied."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for relative in filter(None, listed.split("\0")):
        source = ROOT / relative
        if source.is_file() and not source.is_symlink():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            (target / relative).write_bytes(source.read_bytes())
    for linked in (".venv", "node_modules"):
        if (ROOT / linked).exists():
            (target / linked).symlink_to((ROOT / linked).resolve())


@pytest.mark.sweep
def test_a_scaffolded_pipeline_passes_its_own_test_the_house_tests_and_ruff_in_a_copy_of_the_repository(tmp_path):
    copy = tmp_path / "repository"
    _copy_of_the_repository(copy)
    env = {**os.environ, "PYTHONPATH": str(copy)}
    run = dict(cwd=copy, env=env, capture_output=True, text=True)

    made = subprocess.run([sys.executable, "-m", "deployments.cli", "new", "demo_pipe"], **run, timeout=120)
    assert made.returncode == 0, made.stderr
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_demo_pipe.py", *HOUSE_TESTS],
        **run,
        timeout=900,
    )
    assert tests.returncode == 0, tests.stdout[-4000:]
    checked, formatted = ruff("check", cwd=copy), ruff("format", "--check", cwd=copy)
    assert (checked.returncode, formatted.returncode) == (0, 0), checked.stdout + formatted.stdout
