"""A full disk: ENOSPC is a transient fault (``DiskFull``), writes are made durable before they are published, and a
folder's disk reports how full it is.

A write that meets a full disk removes what it had written and raises ``DiskFull``; its input is never refused for it
(no quarantine, no FAILED record): the work waits and is taken again once space is freed. pyarrow reports ENOSPC as
an ``OSError`` whose text carries the errno rather than in ``errno``, so ``is_disk_full`` reads both.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tasks.core.errors import DiskFull

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_TEXTS = ("no space left on device", "disk quota exceeded", "[errno 28]", "[errno 122]")


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from) is a write refused for want of space."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DiskFull):
            return True
        if isinstance(error, OSError) and (
            error.errno in FULL_ERRNOS or any(text in str(error).lower() for text in FULL_TEXTS)
        ):
            return True
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def full_disk_as_unavailable(where: str | Path) -> Iterator[None]:
    """Turn a full disk met inside the block into ``DiskFull`` naming ``where`` (other errors pass unchanged)."""
    try:
        yield
    except DiskFull:
        raise
    except OSError as error:
        if not is_disk_full(error):
            raise
        code = error.errno if error.errno in FULL_ERRNOS else errno.ENOSPC
        raise DiskFull(code, f"{os.strerror(code)} writing {where}") from error


def sync_file(path: str | Path) -> None:
    """Flush a written file's bytes to the disk (an fsync through a new descriptor flushes the whole file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(path: str | Path) -> None:
    """Flush a folder's entries (a rename into it) to the disk; a file system that cannot sync folders is skipped."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some file systems refuse fsync on a folder: nothing more to do there
            os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class DiskUsage:
    """How full the disk holding ``path`` is: bytes and inodes (a disk out of inodes refuses writes as well)."""

    path: str
    mount: str
    total_bytes: int
    free_bytes: int
    used_percent: float  # the larger of the bytes' and the inodes' share in use, as ENOSPC comes from either

    def describe(self) -> str:
        """One line for an alarm: which disk, how full, how much is left."""
        return (
            f"{self.path} on {self.mount}: {self.used_percent:.1f}% used, "
            f"{self.free_bytes / 2**20:.1f} MiB free of {self.total_bytes / 2**20:.1f} MiB"
        )


def mount_point(path: str | Path) -> str:
    """The mount point of the file system holding ``path`` (the nearest folder above it on another device)."""
    current = Path(path).resolve()
    while not current.exists():
        current = current.parent
    device = current.stat().st_dev
    while current.parent != current and current.parent.stat().st_dev == device:
        current = current.parent
    return str(current)


def usage(path: str | Path) -> DiskUsage:
    """How full the disk holding ``path`` (or its nearest existing parent) is; space kept for root counts as used,
    as the stack's own processes may not run as root."""
    existing = Path(path).resolve()
    while not existing.exists():
        existing = existing.parent
    stat = os.statvfs(existing)
    total = stat.f_blocks * stat.f_frsize
    free = stat.f_bavail * stat.f_frsize
    byte_share = 100.0 * (total - free) / total if total else 0.0
    inode_share = 100.0 * (stat.f_files - stat.f_favail) / stat.f_files if stat.f_files else 0.0
    return DiskUsage(str(path), mount_point(existing), total, free, max(byte_share, inode_share))


MIN_ROOM_BYTES = 1 << 20  # work waiting for space is taken again only once at least this much is free


def short_of_space(path: str | Path, needed_bytes: int = 0) -> DiskUsage | None:
    """The reading of the disk holding ``path`` while it has less than ``needed_bytes`` (at least ``MIN_ROOM_BYTES``)
    free: work that met a full disk goes on waiting. None once there is room to take it again."""
    reading = usage(path)
    return reading if reading.free_bytes < max(needed_bytes, MIN_ROOM_BYTES) else None
