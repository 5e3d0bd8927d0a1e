"""Landing test helpers: arrivals written to the store, a list as an event source, the runs a landing started,
records message files, and queues of a test's own on moto (``aws``)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from tasks.core.object_store import LocalStore
from tasks.landing.sources import Arrival
from tasks.landing.watch import LocalWatchSource


def arrive(store_root: Path, key: str, data: bytes) -> Arrival:
    """Write ``data`` at ``key`` of the store and the arrival a watch would report for it."""
    path = store_root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    stat = path.stat()
    return Arrival(
        url=LocalStore(store_root).url_for(key),
        key=key,
        size=stat.st_size,
        event_time="2026-01-01T00:00:00+00:00",
        event_id=f"{key}:{stat.st_size}:{stat.st_mtime_ns}",
    )


@pytest.fixture(scope="module")
def deployed() -> str:
    """The pipelines' flows as deployments named for this module (no work pool: their runs stay Scheduled)."""
    from flows.phspectra_survey import phspectra_survey
    from flows.video import video_process

    name = f"landing-{uuid.uuid4().hex[:6]}"
    for flow in (video_process, phspectra_survey):
        flow.to_deployment(name=name, enforce_parameter_schema=True).apply()
    return name


def runs_of(deployment: str) -> list:
    """Every flow run of ``deployment`` (``flow/name``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        deployment_id = client.read_deployment_by_name(deployment).id
        return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


def record_messages(first: int, count: int) -> list[dict]:
    """``count`` completed workflow messages, granules ``LAND.G{first:03d}`` on."""
    from deployments.samples.records import _message

    return [
        _message("completed", f"land-exec-{i}", 1_700_000_000_000 + i, [f"LAND.G{i:03d}"])
        for i in range(first, first + count)
    ]


def arrivals(n: int) -> list[Arrival]:
    """``n`` one-byte arrivals ``in/0`` … (a list source's feed)."""
    return [
        Arrival(url=f"file:///in/{i}", key=f"in/{i}", size=1, event_time="2024-01-01T00:00:00Z", event_id=str(i))
        for i in range(n)
    ]


class ListSource:
    """An event source over a list: the smallest real implementation of the interface."""

    def __init__(self, arrivals):
        self.waiting = list(arrivals)
        self.acked: list[str] = []
        self.released: list[tuple[str, str]] = []

    def receive(self, max_items=10, wait_seconds=20.0):
        taken, self.waiting = self.waiting[:max_items], self.waiting[max_items:]
        return taken

    def ack(self, arrivals):
        self.acked += [a.key for a in arrivals]

    def release(self, arrivals, reason):
        self.released += [(a.key, reason) for a in arrivals]

    def close(self):
        pass


@pytest.fixture
def make_source(tmp_path):
    """A factory of watch sources over ``tmp_path`` (``pipeline/input/`` unless told; closed after the test)."""
    sources = []

    def make(prefix: str = "pipeline/input/", **options) -> LocalWatchSource:
        options.setdefault("settle_seconds", 0.3)
        source = LocalWatchSource(tmp_path.as_uri(), prefix, **options)
        sources.append(source)
        return source

    yield make
    for source in sources:
        source.close()


def receive_all(source: LocalWatchSource, seconds: float, until: int | None = None) -> list:
    """Everything the source offers within ``seconds`` (or until ``until`` arrivals came)."""
    got, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline and (until is None or len(got) < until):
        got += source.receive(max_items=10, wait_seconds=min(0.5, max(0.0, deadline - time.monotonic())))
    return got


@pytest.fixture
def aws(s3_base, s3_endpoint, monkeypatch):
    """This test's bucket (s3_base) and queues of its own (a unique env in their names), SQS on moto's server."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", s3_endpoint)
    monkeypatch.setenv("TABLE_ENV", f"t{uuid.uuid4().hex[:8]}")
    for pipeline in ("ETL", "VIDEO", "RECORDS"):
        monkeypatch.delenv(f"PIPELINES_{pipeline}_QUEUE_URL", raising=False)
    return s3_base.split("/")[2]
