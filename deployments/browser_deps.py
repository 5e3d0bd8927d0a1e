"""Install Debian's Chromium for the browser test when possible (root, apt reachable); never fails the build."""

from __future__ import annotations

import os
import shutil
import subprocess


def main() -> int:
    """Install chromium with apt-get when it is missing and possible; always exit code 0."""
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        return 0
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        print("chromium not installed and cannot install it here: the browser test will be skipped")
        return 0
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, timeout=600).returncode != 0:
            print("could not install chromium: the browser test will be skipped")
            return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
