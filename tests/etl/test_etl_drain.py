"""The merge run's drain (tasks/etl/drain.py) driven by plain callables, without Prefect runs or tables: where it
stops taking and why, what it hands on, and the run's answer."""

from __future__ import annotations

import time

import pytest

from tasks.etl import drain
from tasks.etl import ingest as etl
from tasks.etl.breaker import OPEN, BreakerState
from tasks.etl.ingest import ManifestRef

OWN = drain.Taken("2026-01-01", "own.json", "store://own.json", "started", 0.0)
WAITING = ManifestRef("2026-01-01", "waiting.json", "store://waiting.json", 3)


class Scans:
    """A scan of pending manifests that answers ``found`` and counts its calls."""

    def __init__(self, found: list[ManifestRef]) -> None:
        self.found, self.calls = found, 0

    def __call__(self, older_than_seconds: float) -> list[ManifestRef]:
        assert older_than_seconds == 0
        self.calls += 1
        return list(self.found)


def a_drain(
    limit: int = 0, seconds: float = 60.0, deployment: str | None = None, stay: bool = False, scan: Scans | None = None
) -> drain.Drain:
    """A drain of one manifest at a time whose takes are not retried."""
    return drain.Drain(limit, seconds, deployment, 1, stay, scan or Scans([]), take_retry_delays_s=())


def test_a_single_manifest_run_merges_its_own_in_its_thread_and_never_scans():
    manifests = a_drain()
    started, ran = [], []

    def start(taken, here):
        started.append((taken, here))
        return drain.MergedHere(lambda: ran.append(taken) or {"rows": 1})

    yielded = []
    for taken, merging in manifests.merges(OWN, start):
        assert ran == []  # the merge runs when its result is asked for, in the flow's thread
        yielded.append((taken, merging.result()))
        manifests.record({"manifest": "own.json", "date_prefix": "2026-01-01", "manifest_status": "completed"})
    assert started == [(OWN, True)]
    assert yielded == [(OWN, {"rows": 1})]
    assert (manifests.stop, manifests.taken, manifests.scan.calls) == ("single", 0, 0)
    assert manifests.result(OWN, "own.json") == {
        "manifest": "own.json",
        "date_prefix": "2026-01-01",
        "manifest_status": "completed",
        "merged": [{"manifest": "own.json", "date_prefix": "2026-01-01", "status": "completed"}],
    }


def test_a_run_whose_manifest_another_run_had_answers_skipped():
    manifests = a_drain()
    assert list(manifests.merges(None, lambda taken, here: pytest.fail("nothing to merge"))) == []
    assert manifests.result(None, "own.json") == {"manifest": "own.json", "skipped": True, "merged": []}


@pytest.mark.parametrize(
    ("status", "stop"), [("failed", "failed"), ("pending", "disk full"), ("completed", ""), ("processing", "")]
)
def test_a_failure_or_a_full_disk_ends_the_taking(status, stop):
    manifests = a_drain(limit=5)
    manifests.record({"manifest": "own.json", "date_prefix": "2026-01-01", "manifest_status": status, "error": "e"})
    assert manifests.stop == stop


def test_a_failed_manifest_fails_the_run_with_every_failure_named():
    manifests = a_drain(limit=5)
    manifests.record({"manifest": "a.json", "date_prefix": "d", "manifest_status": "failed", "error": "a broke"})
    manifests.record({"manifest": "b.json", "date_prefix": "d", "manifest_status": "completed"})
    manifests.record({"manifest": "c.json", "date_prefix": "d", "manifest_status": "failed", "error": "c broke"})
    with pytest.raises(RuntimeError, match=r"^2 of 3 manifest\(s\) failed: a broke; c broke$"):
        manifests.result(OWN, "own.json")


def test_with_none_pending_a_run_that_does_not_stay_stops_after_one_scan():
    manifests = a_drain(limit=5, stay=False)
    assert list(manifests.merges(None, lambda taken, here: pytest.fail("nothing to merge"))) == []
    assert (manifests.stop, manifests.scan.calls) == ("none pending", 1)


def test_a_staying_run_past_its_deadline_looks_no_more():
    manifests = a_drain(limit=5, seconds=etl.STAY_POLL_S / 2, stay=True)  # a look now, none after its deadline
    began = time.monotonic()
    assert list(manifests.merges(None, lambda taken, here: pytest.fail("nothing to merge"))) == []
    assert (manifests.stop, manifests.scan.calls) == ("none pending", 1)
    assert time.monotonic() - began < etl.STAY_POLL_S  # no wait: the next look would come after the deadline


def test_an_open_breaker_stops_the_taking_before_the_take():
    manifests = a_drain(limit=5, deployment="ndjson-merge/local", scan=Scans([WAITING]))
    manifests.breaker = (BreakerState(state=OPEN), time.monotonic())  # read just now: not read again
    assert list(manifests.merges(None, lambda taken, here: pytest.fail("held: not taken"))) == []
    assert (manifests.stop, manifests.taken) == ("breaker", 0)


@pytest.mark.parametrize(
    ("stop", "missed", "deployment", "handed_on"),
    [
        ("bound", False, "ndjson-merge/local", True),
        ("failed", False, "ndjson-merge/local", True),
        ("none pending", True, "ndjson-merge/local", True),  # a staying run's look failed
        ("none pending", False, "ndjson-merge/local", False),
        ("breaker", False, "ndjson-merge/local", False),
        ("disk full", False, "ndjson-merge/local", False),
        ("bound", False, None, False),  # a run that takes no further manifests hands none on
    ],
)
def test_a_run_stopped_by_its_bound_or_a_failure_hands_one_pending_manifest_on(
    monkeypatch, stop, missed, deployment, handed_on
):
    later = ManifestRef("2026-01-02", "later.json", "store://later.json", 1)
    manifests = a_drain(limit=5, deployment=deployment, scan=Scans([WAITING, later]))
    manifests.stop, manifests.queue.missed = stop, missed
    launched = []
    monkeypatch.setattr(etl, "deployment_launcher", lambda name: ("launcher of", name))
    monkeypatch.setattr(etl, "launch_merges", lambda refs, launcher: launched.append((refs, launcher)))
    manifests.hand_on()
    assert launched == ([([WAITING], ("launcher of", deployment))] if handed_on else [])
