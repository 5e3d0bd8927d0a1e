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
    "tests/checksum/test_checksum.py",
]
# what `pipelines new` regenerates in a repository
GENERATED = ["prefect.yaml", "infra/pipelines.template.json", "docs/operations.md", "docs/aws.md"]
# what a scaffolded pipeline must pass in a copy of the repository, beside its own test: the house, the registry,
# what derives from the declarations (prefect.yaml, the template, docs/aws.md's counts and cost, the generator's drift
# test), and the shared checks that visit every pipeline (health, retention)
HOUSE_TESTS = [
    "tests/house/test_house.py",
    "tests/house/test_test_layout.py",
    "tests/house/test_pipeline_registry.py",
    "tests/house/test_prefect_yaml.py",
    "tests/aws/test_aws_template.py",
    "tests/aws/test_aws_stack.py",
    "tests/aws/test_aws_cost.py",
    "tests/house/test_pipeline_package.py",
    "tests/house/test_generate.py",
    "tests/health/test_health.py",
    "tests/retention/test_retention.py",
]


def pipelines(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``pipelines ARGS`` in the repository ``cwd``, importing the project from there."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    command = [sys.executable, "-m", "deployments.cli", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


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
    said = json.loads(capsys.readouterr().out)
    assert (said["written"], said["generated"]) == (WRITTEN, [])  # a bare folder has no generator to run
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
    (tmp_path / "tests/checksum").mkdir(parents=True)
    (tmp_path / "tests/checksum/test_checksum.py").write_text("kept\n")

    assert cli.main(["new", "checksum", "--root", str(tmp_path)]) == 2

    assert capsys.readouterr().err == "error: not overwriting tests/checksum/test_checksum.py: nothing written\n"
    assert sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*")) == [
        "tests",
        "tests/checksum",
        "tests/checksum/test_checksum.py",
    ]
    assert (tmp_path / "tests/checksum/test_checksum.py").read_text() == "kept\n"


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
    for linked in (".venv", ".venv-tools", "node_modules"):
        if (ROOT / linked).exists():
            (target / linked).symlink_to((ROOT / linked).resolve())


def _contents(root: Path) -> dict[str, bytes]:
    """Path -> bytes of every file under ``root``, its linked environments and Python's caches aside."""
    return {
        (Path(folder) / name).relative_to(root).as_posix(): (Path(folder) / name).read_bytes()
        for folder, _, names in os.walk(root)  # a linked folder is listed, never entered
        if "__pycache__" not in Path(folder).parts
        for name in names
        if not (Path(folder) / name).is_symlink()
    }


def test_in_a_repository_it_writes_its_files_and_regenerates_prefect_yaml_and_the_template_and_nothing_else(tmp_path):
    copy = tmp_path / "repository"
    _copy_of_the_repository(copy)
    before = _contents(copy)

    made = pipelines("new", "checksum", "--seed", "7", cwd=copy)

    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout) == {
        "written": WRITTEN,
        "generated": GENERATED,
        "next": "write the work in tasks/checksum/work.py, then run tests/checksum/test_checksum.py",
    }
    after = _contents(copy)
    assert sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path)) == sorted(
        WRITTEN + GENERATED
    )
    manifest, template, settings_doc, aws_doc = (copy / path for path in GENERATED)
    assert "flows/checksum.py:checksum_listen" in manifest.read_text()
    assert "ChecksumListenerService" in json.loads(template.read_text())["Resources"]
    assert "`CHECKSUM_STUCK_MINUTES`" in settings_doc.read_text()
    assert "| Fargate service checksum-listen | 42.53 |" in aws_doc.read_text()
    checked = pipelines("generate", "--check", cwd=copy)
    assert (checked.returncode, json.loads(checked.stdout)) == (0, {"stale": []}), checked.stderr


def test_a_failing_generator_is_an_error_naming_what_it_said_with_the_files_kept(tmp_path):
    copy = tmp_path / "repository"
    _copy_of_the_repository(copy)
    (copy / "prefect.yaml").write_text("name: no marker\n")  # the generator refuses a manifest without its marker

    made = pipelines("new", "checksum", cwd=copy)

    assert made.returncode == 2
    assert made.stderr.startswith(f"error: `pipelines generate` failed in {copy}: error: prefect.yaml has no line")
    assert made.stderr.endswith("(the pipeline's files are written)\n")
    assert all((copy / path).is_file() for path in WRITTEN)


@pytest.mark.sweep
def test_a_scaffolded_pipeline_passes_its_own_test_the_house_tests_and_ruff_in_a_copy_of_the_repository(tmp_path):
    copy = tmp_path / "repository"
    _copy_of_the_repository(copy)

    made = pipelines("new", "demo_pipe", cwd=copy)
    assert made.returncode == 0, made.stderr
    tests = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not sweep and not crashpoints"),
            "tests/demo_pipe/test_demo_pipe.py",
            *HOUSE_TESTS,
        ],
        cwd=copy,
        env={**os.environ, "PYTHONPATH": str(copy)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert tests.returncode == 0, tests.stdout[-4000:]
    checked, formatted = ruff("check", cwd=copy), ruff("format", "--check", cwd=copy)
    assert (checked.returncode, formatted.returncode) == (0, 0), checked.stdout + formatted.stdout
