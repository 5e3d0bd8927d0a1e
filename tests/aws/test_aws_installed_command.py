"""The `pipelines` console script as users run it: installed into a throwaway venv as a wheel holds it,
started from a folder outside the repository, so only what the package ships can be imported (not the checkout
on sys.path). The venv reuses the project venv's installed dependencies (a path line, so its editable finder of
the main checkout is not loaded); setuptools' build_py, the step that fills a wheel, copies in the package (the venv's
setuptools has no bdist_wheel, and build isolation would need the network)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A throwaway venv holding the package built from a copy of this checkout's tracked files; its bin folder."""
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (t.decode() for t in tracked)):
        if (REPO_ROOT / name).is_file() and not name.startswith(("tests/", "node_modules/", "benchmarks/")):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    target = root / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    site = next((target / "lib").glob("python3*/site-packages"))
    (site / "project-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # build_py fills a wheel's purelib: the packages pyproject.toml finds, with their package data
    subprocess.run(
        [sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py", "--build-lib", str(site)],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=240,
    )
    scripts = tomllib.loads((source / "pyproject.toml").read_text())["project"]["scripts"]
    for name, entry in scripts.items():  # each console script as pip writes it
        module, function = entry.split(":")
        script = target / "bin" / name
        script.write_text(
            f"#!{target / 'bin' / 'python'}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n"
        )
        script.chmod(0o755)
    shutil.rmtree(source)
    return target / "bin"


def run_installed(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``ARGS`` (a command of the venv's bin folder) from ``cwd`` with no PYTHONPATH, as a user's shell runs it."""
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8"}
    return subprocess.run(
        [str(bin_dir / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("args", [["--help"], ["aws-stack", "deploy", "--help"], ["aws-stack", "destroy", "--help"]])
def test_the_installed_console_script_starts_from_another_folder(installed, tmp_path, args):
    result = run_installed(installed, "pipelines", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "usage: pipelines" in result.stdout


def test_the_installed_package_ships_the_template_the_deploy_sends(installed, tmp_path):
    code = (
        "import infra.cloudformation as c, pathlib, sys; "
        "sys.exit(0 if c.TEMPLATE_PATH.is_file() and not c.TEMPLATE_PATH.is_relative_to(sys.argv[1]) else 1)"
    )
    result = run_installed(installed, "python", "-c", code, str(REPO_ROOT), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
