"""Another local user for the tests that check who reaches the stack: ``nobody``, by setuid from root."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def as_nobody_run(args: list[str]) -> subprocess.CompletedProcess:
    """``args`` run as ``nobody`` (from /, with the system's PATH); skipped when this process is not root."""
    if os.geteuid() != 0:
        pytest.skip("running as another local user needs root (CI runs as root)")
    return subprocess.run(
        args,
        user="nobody",
        group="nogroup",
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"},
    )


def as_nobody_python(code: str) -> subprocess.CompletedProcess:
    """Python ``code`` run as ``nobody`` with the system's python3 (the project's may sit in root's home)."""
    python = shutil.which("python3", path=SYSTEM_PATH)
    if python is None:
        pytest.skip("no system python3 for another user to run")
    return as_nobody_run([python, "-c", code])
