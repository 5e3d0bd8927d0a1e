"""Crash points for tests: die (SIGKILL) or raise at write number N of this process, before or after it lands.

Every write the product makes goes through the state store (DynamoDB) or the object store; both call
``before``/``after`` around each request. Off unless a test switches it on, either for a child process through
``PIPELINES_FAULT`` or in-process with ``inject()``; when off each write pays one attribute lookup (``armed``).

``PIPELINES_FAULT`` values:
- ``count``: only count (and log, with ``PIPELINES_FAULT_LOG``) the writes, to learn a run's crash points;
- ``N:kill:before`` / ``N:kill:after`` / ``N:raise:before`` / ``N:raise:after``: at write N, SIGKILL this
  process or raise ``InjectedFault``, before the request is sent or after it landed;
- ``N:enospc:before`` / ``N:enospc:after``: write N meets a full disk (``OSError`` ENOSPC), before it is sent or
  after it landed (a write whose answer was lost as the disk filled);
- ``N:stall:before``: write N hangs (``STALL_SECONDS``) before it is sent, as a request that never answers: what a
  timeout must end;
- any of those followed by ``:KIND`` (``1:kill:after:objects:put_bytes:decompositions``): N counts only the writes
  of that kind (``write_kind``), so the point holds however many writes of other kinds (a lease renewed on a
  timer) come first.
``PIPELINES_FAULT_LOG`` names a file that gets one line per write: ``N<TAB>store<TAB>operation<TAB>target``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from tasks.core.errors import PipelineError
from tasks.core.settings import MachineSettings

ENV = MachineSettings.env_name("fault")
STALL_SECONDS = 3600.0
LOG_ENV = MachineSettings.env_name("fault_log")


class InjectedFault(PipelineError, RuntimeError):
    """The fault a test asked for (mode ``raise``): a crash at a write, as an exception."""


@dataclass(frozen=True)
class Plan:
    """Where to fail: write number ``at`` (1-based; of ``kind`` alone when set), ``kill`` or ``raise``, ``before``
    or ``after`` the write."""

    at: int | None = None  # None: count only
    mode: str = "kill"
    when: str = "before"
    log: str | None = None
    kind: str | None = None

    @classmethod
    def parse(cls, value: str, log: str | None = None) -> Plan:
        """A plan from ``PIPELINES_FAULT`` (``count`` or ``N:mode:when[:KIND]``); ValueError when malformed."""
        if value == "count":
            return cls(None, log=log)
        modes = "kill|raise|enospc|stall"
        expected = f"{ENV}={value!r}: expected 'count' or 'N:{modes}:before|after[:store:operation:prefix]'"
        try:
            at, mode, when, *kind = value.split(":", 3)
            plan = cls(int(at), mode, when, log, kind[0] if kind else None)
        except ValueError:
            raise ValueError(expected) from None
        if plan.at < 1 or mode not in ("kill", "raise", "enospc", "stall") or when not in ("before", "after"):
            raise ValueError(expected)
        if plan.kind is not None and plan.kind.count(":") != 2:
            raise ValueError(expected)
        return plan


def write_kind(store: str, operation: str, target: str) -> str:
    """What kind of write this is: its store, operation and table (or the object key's top-level prefix)."""
    return f"{store}:{operation}:{target.split('/')[0]}"


# read on every write: the only cost when off. True until the first write reads ``PIPELINES_FAULT`` (at that write,
# not at import: a module preloaded by the engine fork server was imported with the server's environment, not the
# run's)
armed = True
_from_environment = True  # the plan is still to be read from the environment
_plan = Plan()
_count = 0
_counted = 0  # the writes the plan counts toward ``at``: every write, or those of its kind
_hit: int | None = None  # the number of the write the plan fails at, once it is made
_lock = threading.Lock()


def arm(plan: Plan | None) -> None:
    """Switch the injector on with ``plan`` (None: off) and restart the write count."""
    with _lock:
        _set(plan)


def _set(plan: Plan | None) -> None:
    """Switch to ``plan`` (None: off) with the count restarted; the caller holds ``_lock``."""
    global armed, _plan, _count, _counted, _hit, _from_environment
    _plan, _count, _counted, _hit, armed = plan or Plan(), 0, 0, None, plan is not None
    _from_environment = False


def _arm_from_environment() -> None:
    """The plan ``PIPELINES_FAULT`` asks for in this process's environment (none: off), once, at its first write."""
    with _lock:
        if _from_environment:  # not armed meanwhile by another thread's first write or by ``arm``
            settings = MachineSettings.read()
            _set(Plan.parse(settings.fault, settings.fault_log) if settings.fault else None)


def writes() -> int:
    """How many writes this process has made since the injector was armed."""
    return _count


@contextlib.contextmanager
def inject(
    at: int | None = None, mode: str = "raise", when: str = "before", log: str | None = None, kind: str | None = None
) -> Iterator[None]:
    """In-process crash points for a test: fail at write ``at`` (of ``kind`` alone when set; None: count only); off
    again on exit."""
    arm(Plan(at, mode, when, log, kind))
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
    if _plan.mode == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (injected at write {number}: {operation})", target)
    raise InjectedFault(f"injected fault at write {number} ({_plan.when} {operation} {target})")


def before(store: str, operation: str, target: str = "") -> int:
    """Called before a write request is sent; returns the write's number for ``after``."""
    global _count, _counted, _hit
    if _from_environment:
        _arm_from_environment()
        if not armed:
            return 0
    with _lock:
        _count += 1
        number = _count
        if _plan.log:
            with open(_plan.log, "a") as log:
                log.write(f"{number}\t{store}\t{operation}\t{target}\n")
        if _plan.kind is None or write_kind(store, operation, target) == _plan.kind:
            _counted += 1
            if _counted == _plan.at:
                _hit = number
    if number == _hit and _plan.when == "before":
        _fire(number, operation, target)
    return number


def after(number: int, operation: str, target: str = "") -> None:
    """Called once write ``number`` has landed."""
    if number == _hit and _plan.when == "after":
        _fire(number, operation, target)
