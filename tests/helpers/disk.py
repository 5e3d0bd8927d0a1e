"""A small disk for tests: a tmpfs mounted over a folder (as root; skipped cleanly otherwise), filled on purpose."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.core import disk


@contextlib.contextmanager
def small_disk(folder: Path, megabytes: int = 8) -> Iterator[Path]:
    """A tmpfs of ``megabytes`` mounted over ``folder`` (unmounted after); skips the test when it cannot mount."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0755", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path, leave_bytes: int = 0, name: str = "filler.bin") -> Path:
    """A filler file (``name``, written anew) that takes the disk's space, all of it or all but ``leave_bytes``."""
    filler = folder / name
    block = b"\0" * (1 << 16)
    with open(filler, "wb") as handle:
        while True:
            room = disk.usage(folder).free_bytes - leave_bytes
            if room <= 0:
                break
            try:
                handle.write(block[: min(len(block), room)])
                handle.flush()
            except OSError as error:
                assert error.errno == errno.ENOSPC
                break
    return filler


def hidden_parts(root: Path) -> list[str]:
    """Every unfinished write (``.part``) under ``root``."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.part"))
