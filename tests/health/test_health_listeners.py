"""The listeners' alarms in `pipeline-health`: a listener deployment with no live run, and files that landed and
wait past the listener's watermark longer than the alarm allows."""

from __future__ import annotations

import time
import uuid

import pytest

from blocks.health import HealthThresholds
from tasks.core.object_store import LocalStore
from tasks.etl import keys
from tasks.health import listeners
from tasks.landing.watch import Watermark, changed_files, fs_now, write_watermark

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

LIMITS = HealthThresholds()


def test_a_listener_deployment_without_a_live_run_raises_the_alarm():
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from flows.video import video_listen

    name = f"alarm-{uuid.uuid4().hex[:6]}"
    deployment_id = video_listen.to_deployment(name=name).apply()
    assert f"video-listen/{name}" in listeners.listeners_not_running(LIMITS).detail
    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(deployment_id)
        client.set_flow_run_state(run.id, Running(), force=True)
        assert f"video-listen/{name}" not in listeners.listeners_not_running(LIMITS).detail  # one listens
        client.delete_flow_run(run.id)


def test_files_past_the_watermark_for_too_long_are_a_backlog_and_acked_ones_never(tmp_path):
    store = LocalStore(tmp_path)
    place = listeners.places()["etl"]
    store.put_bytes(f"{keys.INPUT_PREFIX}2026-01-01/old.ndjson", b"{}\n")
    store.put_bytes(f"{keys.INPUT_PREFIX}2026-01-01/.hidden.part", b"{}\n")  # an unfinished write: never counted
    later = time.time() + listeners.LISTENER_BACKLOG_S + 1
    assert listeners.local_backlog(store, place, listeners.LISTENER_BACKLOG_S) == []  # just landed: not late yet
    assert listeners.local_backlog(store, place, listeners.LISTENER_BACKLOG_S, now=later) == [
        f"{keys.INPUT_PREFIX}2026-01-01/old.ndjson"
    ]  # nothing took it in 5 minutes
    time.sleep(0.05)
    folder, folders = tmp_path / keys.INPUT_PREFIX, {}
    list(changed_files(folder, Watermark(), 0.0, seen=folders))
    write_watermark(folder, Watermark(fs_now(folder), folders))  # the listener acked everything up to now
    assert listeners.local_backlog(store, place, listeners.LISTENER_BACKLOG_S, now=later) == []
