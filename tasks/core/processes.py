"""This machine's processes as /proc tells them: whether a pid is alive, which process it is, when it started.

A pid names its process only together with its start time (the kernel reuses pids), so a stored pid is judged with
``process_identity`` (the GPU pipeline's local tasks) or ``process_started_at`` (the local stack's flow runs).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat``'s fields from field 3 (the state) on: those after ``(comm)``; OSError without it."""
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[-1].split()


def _start_ticks(pid: int) -> str:
    """Process ``pid``'s start time in clock ticks after boot (``/proc/<pid>/stat`` field 22); OSError without it."""
    fields = _stat_fields(pid)
    if len(fields) < 20:
        raise OSError(f"/proc/{pid}/stat has no start time")
    return fields[19]


def process_identity(pid: int) -> str | None:
    """Which process ``pid`` is now: this boot's id and the process's start time (``/proc/<pid>/stat`` field 22).

    The kernel reuses a pid once its process is gone, so a stored pid names its process only together with
    this. None where there is no /proc (or no such process).
    """
    try:
        start_ticks = _start_ticks(pid)
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return f"{handle.read().strip()}:{start_ticks}"
    except OSError:
        return None


def process_started_at(pid: int) -> float | None:
    """When process ``pid`` started, as a Unix time (10 ms steps): its start after boot plus the boot's wall-clock
    time (``CLOCK_BOOTTIME``, the clock the kernel stamps it with); None where there is no /proc or no such process."""
    try:
        ticks = int(_start_ticks(pid))
    except (OSError, ValueError):
        return None
    booted_at = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted_at + ticks / os.sysconf("SC_CLK_TCK")


def pid_alive(pid: int, identity: str | None = None) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an exited child nobody reaped yet); with
    ``identity`` (``process_identity`` when it started) also that it is still that process, not a reuse of its pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    try:
        if _stat_fields(pid)[0] == "Z":
            return False
    except (FileNotFoundError, IndexError):
        return os.name != "posix" or not Path("/proc/self").exists()
    return not pid_reused(pid, identity)


def pid_reused(pid: int, identity: str | None) -> bool:
    """Whether ``pid`` now names another process than the one ``identity`` recorded: only a readable, different
    start time says so (one that cannot be read now, the process just ended or no /proc, is no evidence)."""
    return identity is not None and process_identity(pid) not in (identity, None)
