"""The seeds' capacity and time limits: what AWS enforced for them, as Prefect settings here.

Deployment concurrency limits live in prefect.yaml (``definitions.limits``); each pipeline declares its flows' and
tasks' timeouts in its ``pipeline.py``, read here for the flows and the duration alarm; a machine's CPU slots bound
its CPU-heavy tasks.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tasks.core import registry
from tasks.core.private_folder import private_folder, runtime_folder
from tasks.core.settings import MachineSettings

# seeds 000/003: their workers were Lambdas, capped at 15 min a call (a phspectra chunk has its lease instead)
SEGMENT_TIMEOUT_S = 15 * 60
# a maintenance run (sweeps, reconcile, health) that hangs must not hold its one-at-a-time slot for ever
MAINTENANCE_TIMEOUT_S = 10 * 60

# Prefect Cloud counts every request: a client sends its run's log lines in one `POST /logs/` every 5 s (Prefect's
# default, 2 s, made the long-running listeners' and merge runs' log posts a sixth of the stack's requests)
PREFECT_CLIENT_ENV = {"PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "5"}

# seed 001: CloudWatch logs kept 3 days; here the Prefect server's flow runs (with their logs and artifacts) and events
PREFECT_RETENTION_DAYS = 3


def maintenance_flows() -> tuple[str, ...]:
    """Every pipeline's scheduled upkeep flows, in seed order (each runs one at a time)."""
    return tuple(name for p in registry.pipelines() for name in p.maintenance_flows)


def flow_timeouts() -> dict[str, float]:
    """Flow name -> its timeout: the flows' decorators and the duration-near-timeout alarm read the same numbers."""
    timeouts: dict[str, float] = {}
    for p in registry.pipelines():
        timeouts |= dict(p.flow_timeouts) | {name: MAINTENANCE_TIMEOUT_S for name in p.maintenance_flows}
    return timeouts


def flow_timeout(name: str) -> float | None:
    """One flow's timeout in seconds (None: the flow runs as long as it needs)."""
    return flow_timeouts().get(name)


def task_timeouts() -> dict[str, float]:
    """Task name -> its timeout, as the pipelines declare them (read by the duration-near-timeout alarm too)."""
    return {name: timeout for p in registry.pipelines() for name, timeout in p.task_timeouts.items()}


# A Prefect tag concurrency limit of this name is stale configuration and `make up` deletes it: a tag limit is one
# count on the server for every worker machine at once, and each task pays its lease round trips (seconds when
# SQLite is busy); the machine's own CPU slots below bound the same tasks where the cores are.
CPU_HEAVY_TAG = "cpu-heavy"
SLOT_POLL_S = 0.05

F = TypeVar("F", bound=Callable[..., Any])


def cpu_heavy_slots() -> int:
    """How many CPU-heavy tasks may run at once on a machine (``PIPELINES_CPU_HEAVY_SLOTS``, default: its cores)."""
    return MachineSettings.read().cpu_heavy_slots or os.cpu_count() or 1


def cpu_slots_dir() -> Path:
    """The folder of this machine's CPU slot files (``PIPELINES_CPU_SLOTS_DIR``, default: ``cpu-slots`` in the
    user's private runtime folder): created 0700, refused if another user owns it or may reach it (they could hold
    every slot)."""
    configured = MachineSettings.read().cpu_slots_dir
    return private_folder(Path(configured) if configured else runtime_folder() / "cpu-slots")


@contextlib.contextmanager
def cpu_slot(slots: int | None = None, on_wait: Callable[[int], None] | None = None) -> Iterator[int]:
    """Hold one of this machine's ``slots`` CPU slots (default ``cpu_heavy_slots()``) while the block runs; yield its
    index.

    A slot is an exclusive ``flock`` on a file shared by every process (and thread) on the machine, so no server is
    asked and a holder that dies (SIGKILL included) lets go at once: the kernel drops the lock with the process.
    When every slot is taken, ``on_wait(slots)`` is called once and the slots are tried again every ``SLOT_POLL_S``.
    """
    slots = slots or cpu_heavy_slots()
    folder = cpu_slots_dir()
    handles = [os.open(folder / f"slot-{i}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600) for i in range(slots)]
    held = None
    try:
        waited = False
        while held is None:
            for index, handle in enumerate(handles):
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                held = index
                break
            else:
                if not waited and on_wait is not None:
                    on_wait(slots)
                waited = True
                time.sleep(SLOT_POLL_S)
        yield held
    finally:
        for handle in handles:  # closing the held descriptor releases its lock
            os.close(handle)


def _print_wait(slots: int) -> None:
    print(f"all {slots} CPU slots of this machine are busy: waiting for one")  # a task's print is its run log


def holding_cpu_slot(function: F) -> F:
    """``function`` run while holding one of this machine's CPU slots (see ``cpu_slot``); its signature unchanged."""

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        with cpu_slot(on_wait=_print_wait):
            return function(*args, **kwargs)

    return bounded  # type: ignore[return-value]
