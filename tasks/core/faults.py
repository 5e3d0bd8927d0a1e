"""Crash points for tests: die (SIGKILL) or raise at write number N of this process, before or after it lands.

Every write the product makes goes through the state store (DynamoDB) or the object store; both call
``before``/``after`` around each request. Off unless a test switches it on, either for a child process through
``PIPELINES_FAULT`` or in-process with ``inject()``; when off each write pays one attribute lookup (``armed``).

``PIPELINES_FAULT`` values:
- ``count``: only count (and log, with ``PIPELINES_FAULT_LOG``) the writes, to learn a run's crash points;
- ``N:kill:before`` / ``N:kill:after`` / ``N:raise:before`` / ``N:raise:after``: at write N, SIGKILL this
  process or raise ``InjectedFault``, before the request is sent or after it landed;
- ``N:stall:before``: write N hangs (``STALL_SECONDS``) before it is sent, as a request that never answers: what a
  timeout must end.
``PIPELINES_FAULT_LOG`` names a file that gets one line per write: ``N<TAB>store<TAB>operation<TAB>target``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from tasks.core.errors import PipelineError

ENV = "PIPELINES_FAULT"
STALL_SECONDS = 3600.0
LOG_ENV = "PIPELINES_FAULT_LOG"


class InjectedFault(PipelineError, RuntimeError):
    """The fault a test asked for (mode ``raise``): a crash at a write, as an exception."""


@dataclass(frozen=True)
class Plan:
    """Where to fail: write number ``at`` (1-based), ``kill`` or ``raise``, ``before`` or ``after`` the write."""

    at: int | None = None  # None: count only
    mode: str = "kill"
    when: str = "before"
    log: str | None = None

    @classmethod
    def parse(cls, value: str, log: str | None = None) -> Plan:
        """A plan from ``PIPELINES_FAULT`` (``count`` or ``N:mode:when``); ValueError when malformed."""
        if value == "count":
            return cls(None, log=log)
        try:
            at, mode, when = value.split(":")
            plan = cls(int(at), mode, when, log)
        except ValueError:
            raise ValueError(f"{ENV}={value!r}: expected 'count' or 'N:kill|raise|stall:before|after'") from None
        if plan.at < 1 or mode not in ("kill", "raise", "stall") or when not in ("before", "after"):
            raise ValueError(f"{ENV}={value!r}: expected 'count' or 'N:kill|raise|stall:before|after'")
        return plan


armed = False  # read on every write: the only cost when off
_plan = Plan()
_count = 0
_lock = threading.Lock()


def arm(plan: Plan | None) -> None:
    """Switch the injector on with ``plan`` (None: off) and restart the write count."""
    global armed, _plan, _count
    with _lock:
        _plan, _count, armed = plan or Plan(), 0, plan is not None


def writes() -> int:
    """How many writes this process has made since the injector was armed."""
    return _count


@contextlib.contextmanager
def inject(at: int | None = None, mode: str = "raise", when: str = "before", log: str | None = None) -> Iterator[None]:
    """In-process crash points for a test: fail at write ``at`` (None: count only); off again on exit."""
    arm(Plan(at, mode, when, log))
    try:
        yield
    finally:
        arm(None)


def _fire(number: int, operation: str, target: str) -> None:
    if _plan.mode == "stall":
        deadline = time.monotonic() + STALL_SECONDS
        while time.monotonic() < deadline:  # short sleeps: a timeout's alarm or cancellation ends it
            time.sleep(0.1)
        return
    if _plan.mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFault(f"injected fault at write {number} ({_plan.when} {operation} {target})")


def before(store: str, operation: str, target: str = "") -> int:
    """Called before a write request is sent; returns the write's number for ``after``."""
    global _count
    with _lock:
        _count += 1
        number = _count
        if _plan.log:
            with open(_plan.log, "a") as log:
                log.write(f"{number}\t{store}\t{operation}\t{target}\n")
    if number == _plan.at and _plan.when == "before":
        _fire(number, operation, target)
    return number


def after(number: int, operation: str, target: str = "") -> None:
    """Called once write ``number`` has landed."""
    if number == _plan.at and _plan.when == "after":
        _fire(number, operation, target)


if os.environ.get(ENV):
    arm(Plan.parse(os.environ[ENV], os.environ.get(LOG_ENV)))
