"""A merge run's drain (docs/design.md, "The ETL drain"): after the manifest it was started for, the further
``pending`` manifests it takes, oldest first, each by its own conditional ``pending → processing``.

    take (its own manifest) ─▶ merges: its merge, then take more while in flight < parallel_manifests, none pending
        (stay_for_more: look again every STAY_POLL_S), the bound, the deadline or the breaker stop it
    ─▶ each merge as it ends: the flow's status update, recorded (a failure or a full disk stops the taking)
    ─▶ hand_on: a run stopped by its bound or a failure with manifests still pending announces one ─▶ result

Plain functions and classes: the flow (flows/etl.py) passes its Prefect tasks in (the merge, the first scan).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tasks.core.errors import Unavailable
from tasks.core.runtime import run_logger, utc_now
from tasks.etl import breaker as etl_breaker
from tasks.etl import ingest as etl
from tasks.etl import merge as etl_merge
from tasks.etl.ingest import ManifestRef


@dataclass(frozen=True)
class Taken:
    """A manifest this run moved to ``processing``: where it is and when its chain began."""

    date_prefix: str
    manifest_name: str
    manifest_path: str
    started: Any  # utc_now() when it was taken: the run report's start
    merge_started: float  # time.monotonic() when its merge was submitted: the metric's seconds
    report_part: str = ""  # the run's own manifest: the seed's report name; a further one: its manifest's stem
    holder: str | None = None  # the flow run it is processing under: only that run finishes it


def take(
    date_prefix: str, manifest_name: str, retry_delays_s: Sequence[float], rerun: bool = False, own: bool = True
) -> Taken | None:
    """MANIFEST ``pending → processing`` for this run (conditional: None when another run has it), retried after
    each of ``retry_delays_s`` (a throttle, a dropped connection; a manifest with no record is not retried)."""
    for delay in (*retry_delays_s, None):
        try:
            record = etl_merge.start_processing(date_prefix, manifest_name, rerun)
            break
        except LookupError:
            raise
        except Exception as error:  # any other error, as the take's task run retried them
            if delay is None:
                raise
            run_logger(__name__).warning(
                "%s: not taken (%s: %s); again in %s s", manifest_name, type(error).__name__, error, delay
            )
            time.sleep(delay)
    if record is None:
        return None
    part = "" if own else manifest_name.removesuffix(".json")
    holder = record.get("prefect_flow_run_id")
    return Taken(date_prefix, manifest_name, record["manifest_path"], utc_now(), time.monotonic(), part, holder)


class Merging(Protocol):
    """A manifest's merge under way: a Prefect task future, or a ``MergedHere``."""

    def result(self) -> dict[str, Any]: ...


class MergedHere:
    """A merge that runs in the flow's own thread when its result is asked for (one manifest at a time): the flow's
    timeout interrupts it there, where a task runner's thread would hold the run past its timeout."""

    def __init__(self, merge: Callable[[], dict[str, Any]]) -> None:
        self._merge = merge

    def result(self) -> dict[str, Any]:
        return self._merge()


class PendingQueue:
    """Pending manifests to take after the run's own, oldest first; the list is read again whenever it runs out.
    The first scan is ``first_scan`` (the flow's task run, seen in the UI); a staying run's later scans are plain
    reads, as a scan a second as task runs would cost the Prefect API more than the runs it saves."""

    def __init__(self, first_scan: Callable[..., list[ManifestRef]]) -> None:
        self.first_scan = first_scan
        self.tried: set[tuple[str, str]] = set()
        self.queue: list[ManifestRef] = []
        self.scans = 0
        self.missed = False  # a staying run's look failed: it hands a pending manifest on at its end

    def next(self) -> ManifestRef | None:
        """The next pending manifest not tried by this run (a fresh scan when the last one is used up), or None."""
        if not self.queue:
            self.queue = [ref for ref in self._scan() if (ref.date_prefix, ref.manifest_name) not in self.tried]
        if not self.queue:
            return None
        ref = self.queue.pop(0)
        self.tried.add((ref.date_prefix, ref.manifest_name))
        return ref

    def _scan(self) -> list[ManifestRef]:
        self.scans += 1
        if self.scans == 1:
            return self.first_scan(older_than_seconds=0)
        try:
            return etl.pending_manifests(older_than_seconds=0)
        except Unavailable as error:  # the run ends at its deadline and hands on what is pending then
            run_logger(__name__).warning("pending manifests not read (%s): looking again", error)
            self.missed = True
            return []


@dataclass
class Drain:
    """The manifests a merge run merges: its own, then further pending ones within its bounds (how many, for how
    many seconds, the breaker of ``deployment``; ``parallel`` at a time; ``stay``: with none pending, look again
    until the seconds are over), what it merged (``outcomes``) and why it stopped taking ("" while it goes on).
    ``scan`` is the first read of pending manifests and the hand-on's (the flow's task run); ``take_retry_delays_s``
    the take's retries."""

    limit: int
    seconds: float
    deployment: str | None
    parallel: int
    stay: bool
    scan: Callable[..., list[ManifestRef]]
    take_retry_delays_s: Sequence[float]
    queue: PendingQueue = field(init=False)
    deadline: float = field(init=False, default=0.0)  # time.monotonic() after which no further manifest is taken
    taken: int = 0
    stop: str = ""
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    breaker: tuple[etl_breaker.BreakerState, float] | None = None  # the breaker as last read, and when

    def __post_init__(self) -> None:
        self.queue = PendingQueue(self.scan)

    @property
    def here(self) -> bool:
        """Whether merges run one at a time in the flow's own thread (``MergedHere``) rather than as task futures."""
        return self.parallel <= 1

    def take(self, date_prefix: str, manifest_name: str, rerun: bool = False) -> Taken | None:
        """The run's own manifest ``pending → processing`` (None when another run has it)."""
        return take(date_prefix, manifest_name, self.take_retry_delays_s, rerun)

    def merges(self, own: Taken | None, start: Callable[[Taken, bool], Merging]) -> Iterator[tuple[Taken, Merging]]:
        """Each manifest taken and its merge (``start``: in this thread when ``here``, else a task future), as each
        ends: ``own`` first, then further ones taken while ``record`` has not stopped the taking."""
        in_flight: dict[Merging, Taken] = {} if own is None else {start(own, self.here): own}
        self.deadline = time.monotonic() + self.seconds
        while True:
            self._take_more(in_flight, start)
            if not in_flight:
                if self.stay and self._wait_for_more():
                    continue
                return
            if self.here:
                done = next(iter(in_flight))
            else:
                from prefect.futures import as_completed

                done = next(as_completed(list(in_flight)))
            yield in_flight.pop(done), done

    def record(self, outcome: dict[str, Any]) -> None:
        """One manifest's outcome; a failed one or one back to pending (disk full) ends the taking."""
        self.outcomes.append(outcome)
        if outcome["manifest_status"] == etl_merge.FAILED:
            self.stop = "failed"  # the run fails after what is in flight: the breaker counts it, a next run goes on
        elif outcome["manifest_status"] == etl_merge.PENDING:
            self.stop = "disk full"  # the next manifest would meet it too: the flush restarts them once space is freed

    def hand_on(self) -> None:
        """A run stopped by its bound or a failure with manifests still pending announces one: the next run takes
        them."""
        if (
            (self.stop in ("bound", "failed") or self.queue.missed)
            and self.deployment is not None
            and (left := self.scan(older_than_seconds=0))
        ):
            etl.launch_merges(left[:1], etl.deployment_launcher(self.deployment))  # the chain goes on in a new run

    def result(self, own: Taken | None, manifest_name: str) -> dict[str, Any]:
        """The run's answer: the first manifest's outcome with every manifest's status; raises when any failed."""
        failed = [o for o in self.outcomes if o["manifest_status"] == etl_merge.FAILED]
        if failed:
            raise RuntimeError(
                f"{len(failed)} of {len(self.outcomes)} manifest(s) failed: " + "; ".join(o["error"] for o in failed)
            )
        first = next(
            (o for o in self.outcomes if own is not None and o["manifest"] == own.manifest_name),
            {"manifest": manifest_name, "skipped": True},
        )
        return {
            **first,
            "merged": [
                {"manifest": o["manifest"], "date_prefix": o["date_prefix"], "status": o["manifest_status"]}
                for o in self.outcomes
            ],
        }

    def _breaker_state(self) -> etl_breaker.BreakerState:
        """The merge deployment's breaker, read at most every ``RECHECK_S`` (a read a manifest costs the API more)."""
        now = time.monotonic()
        if self.breaker is None or now - self.breaker[1] >= etl_breaker.RECHECK_S:
            self.breaker = (etl_breaker.load(self.deployment), now)
        return self.breaker[0]

    def _wait_for_more(self) -> bool:
        """None was pending: wait ``STAY_POLL_S`` and take again while the run's deadline is ahead (True), else False.
        The last look comes after the deadline less ``STAY_POLL_S``, which the launcher's margin covers."""
        if self.stop != "none pending" or time.monotonic() + etl.STAY_POLL_S >= self.deadline:
            return False
        time.sleep(etl.STAY_POLL_S)
        self.stop = ""
        return True

    def _take_more(self, in_flight: dict[Merging, Taken], start: Callable[[Taken, bool], Merging]) -> None:
        """Take pending manifests (``pending → processing``) and start their merges until ``parallel`` are in flight,
        none is pending now, or the taking stops (its bound, its deadline, the breaker)."""
        while not self.stop and len(in_flight) < max(1, self.parallel):
            if self.taken >= self.limit or time.monotonic() >= self.deadline:
                self.stop = "bound" if self.limit > 0 else "single"
                return
            ref = self.queue.next()
            if ref is None:
                self.stop = "none pending" if not in_flight else ""
                return
            if self.deployment is not None and not etl_breaker.admits(
                self._breaker_state(), ref.date_prefix, ref.manifest_name
            ):
                self.stop = "breaker"  # the held manifests stay pending; closing the breaker starts them
                return
            taken = take(ref.date_prefix, ref.manifest_name, self.take_retry_delays_s, own=False)
            if taken is not None:
                self.taken += 1
                in_flight[start(taken, self.here)] = taken
