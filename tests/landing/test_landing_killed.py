"""The media listeners killed for real: each listener's flow runs in its own process, as a worker runs the
deployment `make up` starts (`video-listen`, `phspectra-listen`, `records-listen`), over inputs dropped before it
starts; it is SIGKILLed mid-batch (some inputs handled, others not), the worker's crash report follows, and a new
run of the same flow takes over from its catch-up listing. Then every upload / cube started exactly one run and
every message file was written and set aside, nothing left where it landed. (The ETL listener's is in
tests/landing/test_landing_local.py.)"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tasks.core import state_store
from tasks.core.object_store import LocalStore
from tasks.phspectra import keys as phspectra_keys
from tasks.records import keys as records_keys
from tasks.video import keys as video_keys
from tests.helpers.crashpoints import report_crashed_runs, start_child
from tests.helpers.landing import runs_of

pytestmark = pytest.mark.sweep  # ~45 s each on a loaded machine: two listener processes, the second runs 20 s

INPUTS = 12
LISTEN = {"source": "local", "batch_size": 100, "batch_seconds": 0.2, "wait_seconds": 1.0}


def kill_mid_batch_and_restart(call: str, kwargs: dict, handled: Callable[[], int], log: Path) -> int:
    """Start the listener, SIGKILL it once it has handled some input, then start it again for 20 s: how many
    inputs were handled when it was killed."""
    first = start_child(call, {**kwargs, "max_runtime_seconds": 300}, log)
    deadline = time.monotonic() + 180
    while handled() == 0 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=30) == -signal.SIGKILL, log.read_text()[-3000:]
    at_kill = handled()
    report_crashed_runs()  # the process worker: the listener's run is Crashed, `make up` starts a new one
    again = start_child(call, {**kwargs, "max_runtime_seconds": 20}, log)
    assert again.wait(timeout=240) == 0, log.read_text()[-3000:]
    return at_kill


def _drop(store_root: Path, key: str, data: bytes) -> None:
    path = store_root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_a_killed_video_listener_started_again_starts_each_upload_once(tables, store_root, deployed, tmp_path):
    from tasks.video import jobs

    deployment = f"video-process/{deployed}"
    job_ids = [jobs.create_job()["job_id"] for _ in range(INPUTS)]
    for job_id in job_ids:
        _drop(store_root, video_keys.source_key(job_id), b"an upload the listener does not decode")

    def with_run():
        return sum(1 for j in job_ids if jobs.get_job(j).get(jobs.PROCESS_RUN))

    at_kill = kill_mid_batch_and_restart(
        "flows.video:video_listen", {**LISTEN, "process_deployment": deployment}, with_run, tmp_path / "listener.log"
    )
    assert 0 < at_kill < INPUTS  # killed mid-batch
    runs = runs_of(deployment)
    assert sorted(r.parameters["job_id"] for r in runs) == sorted(job_ids)  # each upload exactly one run
    by_job = {r.parameters["job_id"]: str(r.id) for r in runs}
    assert {j: jobs.get_job(j)[jobs.PROCESS_RUN] for j in job_ids} == by_job  # recorded on its job


def test_a_killed_phspectra_listener_started_again_starts_each_cube_once(tables, store_root, deployed, tmp_path):
    from tasks.phspectra import landing
    from tasks.phspectra import survey as ph

    deployment = f"phspectra-survey/{deployed}"
    cubes = [f"{phspectra_keys.SURVEY_INCOMING_PREFIX}killed/c-{i:02d}.fits" for i in range(INPUTS)]
    for key in cubes:
        _drop(store_root, key, b"SIMPLE = T")

    def landings() -> list[dict]:
        return [i for i in state_store.scan_all(ph.runs_table()) if i["SK"] == phspectra_keys.LANDING_SK]

    def started():
        return sum(1 for i in landings() if i["status"] == landing.STARTED)

    at_kill = kill_mid_batch_and_restart(
        "flows.phspectra_survey:phspectra_listen",
        {**LISTEN, "survey_deployment": deployment},
        started,
        tmp_path / "listener.log",
    )
    assert 0 < at_kill < INPUTS
    runs = [r for r in runs_of(deployment) if r.parameters["survey"] == "killed"]
    urls = [LocalStore(store_root).url_for(key) for key in cubes]
    assert sorted(r.parameters["cube_url"] for r in runs) == sorted(urls)  # each cube exactly one run
    items = landings()
    assert sorted(i["url"] for i in items) == sorted(urls) and {i["status"] for i in items} == {landing.STARTED}
    assert sorted(f for i in items for f in i["flow_run_ids"]) == sorted(str(r.id) for r in runs)


def test_a_killed_records_listener_started_again_writes_each_file_once(tables, store_root, tmp_path):
    from tasks.core.runtime import today_iso
    from tests.helpers.landing import record_messages

    names = [f"m-{i:02d}.json" for i in range(INPUTS)]
    for i, name in enumerate(names):  # 5 messages a file: a batch of 10 arrivals is 50 messages, 5 ingest runs
        _drop(
            store_root, f"{records_keys.RECORDS_INCOMING_PREFIX}{name}", json.dumps(record_messages(5 * i, 5)).encode()
        )
    granules = [f"LAND.G{i:03d}" for i in range(5 * INPUTS)]

    def written():
        return len(state_store.get_many(tables["granules"], [{"granuleId": g} for g in granules]))

    at_kill = kill_mid_batch_and_restart(
        "flows.records:records_listen", {**LISTEN, "batch_size": 10}, written, tmp_path / "listener.log"
    )
    assert 0 < at_kill < len(granules)
    store = LocalStore(store_root)
    assert list(store.list(records_keys.RECORDS_INCOMING_PREFIX)) == []  # nothing left unprocessed
    assert sorted(store.list("records/processed/")) == [f"records/processed/{today_iso()}/{n}" for n in names]
    found = state_store.get_many(tables["granules"], [{"granuleId": g} for g in granules])
    assert Counter(g["status"] for g in found) == {"completed": len(granules)}
    assert list(store.list(records_keys.DEAD_LETTER_PREFIX)) == []
