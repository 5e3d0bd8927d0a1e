"""The Dockerfile, checked without building it (no image can be pulled here): it installs what `make test`
installs (the same constraints file, the same package, without the dev extra), in a build stage whose result
the runtime stage copies, runs as a non-root user, takes ffmpeg from the pinned imageio-ffmpeg wheel, and
hadolint reports nothing."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

REPO_ROOT = Path(__file__).resolve().parents[2]
HADOLINT = REPO_ROOT / ".venv-tools" / "bin" / "hadolint"  # `make lint-tools` (make test depends on it)


def stages() -> list[list[dict]]:
    """The Dockerfile's instructions, one list per stage (each starting with its FROM)."""
    found: list[list[dict]] = []
    for instruction in DockerfileParser(str(REPO_ROOT / "Dockerfile")).structure:
        if instruction["instruction"] == "FROM":
            found.append([])
        if found and instruction["instruction"] != "COMMENT":
            found[-1].append(instruction)
    return found


def runs(stage: list[dict]) -> list[list[str]]:
    """Each RUN of a stage as its shell words, one list per `&&`-joined command."""
    commands = []
    for instruction in stage:
        if instruction["instruction"] == "RUN":
            commands += [shlex.split(part) for part in instruction["value"].split("&&")]
    return commands


def pip_install(words: list[str]) -> tuple[str, str] | None:
    """(constraints file, what is installed) of a `pip install` command; None for any other command."""
    if "pip" not in words or "install" not in words:
        return None
    args = words[words.index("install") + 1 :]
    constraints = args[args.index("-c") + 1]
    targets = [a for i, a in enumerate(args) if not a.startswith("-") and args[i - 1] not in ("-c", "-r")]
    return constraints, " ".join(targets)


def make_install() -> tuple[str, str]:
    """(constraints file, what is installed) of the Makefile's project install (the venv `make test` uses)."""
    line = next(
        row for row in (REPO_ROOT / "Makefile").read_text().splitlines() if "pip install" in row and "-e" in row
    )
    constraints, target = pip_install(shlex.split(line.replace("$(PY)", "python")))
    return constraints, target


def test_the_build_stage_installs_what_make_test_installs_without_the_dev_extra():
    build, runtime = stages()[0], stages()[-1]
    installs = [found for words in runs(build) if (found := pip_install(words))]
    constraints, target = make_install()
    assert (constraints, target) == ("constraints.txt", ".[dev]")
    assert installs == [(constraints, re.sub(r"\[.*\]$", "", target))]  # the same pins, the package without [dev]
    assert not [words for words in runs(runtime) if pip_install(words)], "the runtime stage installs nothing itself"

    copied = {source for i in build if i["instruction"] == "COPY" for source in i["value"].split()[:-1]}
    packages = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
        "include"
    ]
    assert {"pyproject.toml", "constraints.txt"} <= copied
    assert {f"{p.rstrip('*')}/" for p in packages} <= copied  # every package the install finds is in the stage


def test_multi_stage_the_runtime_copies_the_built_venv_and_runs_as_a_non_root_user():
    all_stages = stages()
    assert len(all_stages) >= 2
    build_name = all_stages[0][0]["value"].split()[-1]
    runtime = all_stages[-1]
    assert " AS " in all_stages[0][0]["value"].upper() and build_name not in runtime[0]["value"].split()[0]
    assert any(
        i["instruction"] == "COPY" and f"--from={build_name}" in i["value"] and "/opt/venv" in i["value"]
        for i in runtime
    )
    users = [i["value"].split(":")[0] for i in runtime if i["instruction"] == "USER"]
    assert users and users[-1] not in ("root", "0"), users
    assert runtime[-1]["instruction"] in ("CMD", "ENTRYPOINT") and runtime[-2]["instruction"] == "USER"

    pull = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())["definitions"]["pulls"]["ecs"]
    workdirs = [i["value"] for i in runtime if i["instruction"] == "WORKDIR"]
    assert workdirs[-1] == pull[0]["prefect.deployments.steps.set_working_directory"]["directory"]


def test_ffmpeg_is_the_pinned_imageio_ffmpeg_wheels_and_no_distribution_package():
    text = (REPO_ROOT / "Dockerfile").read_text()
    assert not re.search(r"\b(apt-get|apt|apk|yum|dnf)\b[^\n]*\binstall\b", text)
    pins = (REPO_ROOT / "constraints.txt").read_text()
    assert re.search(r"^imageio-ffmpeg==", pins, re.M)
    build = stages()[0]
    smoke = [words for words in runs(build) if any("imageio_ffmpeg.get_ffmpeg_exe()" in w for w in words)]
    assert smoke, "the build checks that the wheel's ffmpeg runs in the image"


def test_hadolint_reports_nothing():
    result = subprocess.run([str(HADOLINT), "Dockerfile"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_hadolint_reports_a_bad_dockerfile(tmp_path):
    """The linter runs for real: an untagged base image and a root user are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install numpy\n")
    result = subprocess.run([str(HADOLINT), str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3006" in result.stdout and "DL3013" in result.stdout, result.stdout


@pytest.mark.parametrize("path", [".venv/", "node_modules/", ".data/", "test-output/", ".git/", "tests/"])
def test_the_build_context_leaves_out_local_state(path):
    ignored = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    assert "**" in ignored  # everything is left out unless named
    assert not [
        line for line in ignored if line.startswith("!") and (path.startswith(line[1:]) or line[1:].startswith(path))
    ]
