"""A listener's heartbeat: a file its receive loop touches, whose age a container health check reads.

    listener loop ──(each receive, at most every BEAT_EVERY_S)──> touch $PIPELINES_LISTENER_HEARTBEAT
    python -m tasks.landing.heartbeat PATH MAX_AGE_S            ──> exit 0: fresh, 1: stale or missing

A process that exists but no longer receives (a loop stuck in a handler, a source that keeps failing) lets the
file age, so the check tells whether the listener is alive and receiving, not only running. Without the variable
nothing is written (local listeners are supervised by their deployments' triggers instead).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from tasks.landing.settings import ListenerSettings

LOG = logging.getLogger(__name__)
HEARTBEAT_VARIABLE = ListenerSettings.env_name("listener_heartbeat")
BEAT_EVERY_S = 5.0  # one mtime update per 5 s at most, however fast the loop turns


class Heartbeat:
    """Touches ``path`` at most every ``every_s`` seconds; a failed touch is logged, never stops the listener."""

    def __init__(self, path: str | Path | None, every_s: float | None = None) -> None:
        self.path = Path(path) if path else None
        self.every_s = BEAT_EVERY_S if every_s is None else every_s
        self._last = float("-inf")

    @classmethod
    def from_env(cls) -> Heartbeat:
        """The heartbeat ``PIPELINES_LISTENER_HEARTBEAT`` names (none when unset)."""
        return cls(ListenerSettings.read().listener_heartbeat)

    def beat(self) -> None:
        """Touch the file unless it was touched less than ``every_s`` ago."""
        now = time.monotonic()
        if self.path is None or now - self._last < self.every_s:
            return
        self._last = now
        try:
            self.path.touch()
        except OSError as exc:  # the health check will say so; the arrivals still get handled
            LOG.warning("could not touch the heartbeat %s: %s", self.path, exc)


def age_seconds(path: str | Path) -> float | None:
    """Seconds since ``path`` was last touched; None if it does not exist."""
    try:
        return time.time() - Path(path).stat().st_mtime
    except FileNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    """The health check: 0 when the heartbeat is at most ``MAX_AGE_S`` old, else 1 with the reason."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m tasks.landing.heartbeat PATH MAX_AGE_S", file=sys.stderr)
        return 2
    path, max_age_s = argv[0], float(argv[1])
    age = age_seconds(path)
    if age is None:
        print(f"no heartbeat at {path}: the listener has not received yet", file=sys.stderr)
        return 1
    if age > max_age_s:
        print(
            f"heartbeat {path} is {age:.0f} s old (over {max_age_s:.0f} s): the listener stopped receiving",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
