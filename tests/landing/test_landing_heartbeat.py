"""A listener's heartbeat and its ECS container health check: the template's own check command passes while the
listener receives and fails once its loop is stuck or stopped for longer than the threshold."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from infra import cloudformation as cfn
from tasks.landing import heartbeat, listener
from tasks.landing.heartbeat import HEARTBEAT_VARIABLE, Heartbeat
from tasks.landing.listener import Outcome
from tests.helpers.landing import ListSource, arrivals

STALE_S = 1.0  # the test's threshold: the listener beats every 0.1 s here


class WaitingSource(ListSource):
    """A list source that waits a little when it has nothing, as a long poll does (no busy loop)."""

    def receive(self, max_items=10, wait_seconds=20.0):
        taken = super().receive(max_items, wait_seconds)
        if not taken:
            time.sleep(min(wait_seconds, 0.05))
        return taken


def listener_containers() -> dict[str, dict]:
    """Each listener task definition's container in the template."""
    resources = cfn.template()["Resources"]
    return {
        name: resource["Properties"]["ContainerDefinitions"][0]
        for name, resource in resources.items()
        if name.endswith("ListenerTaskDefinition")
    }


def check(container: dict, path, stale_s: float = STALE_S) -> subprocess.CompletedProcess:
    """The container's health-check command, run here on ``path`` with the test's threshold."""
    command = container["HealthCheck"]["Command"]
    assert command[:2] == ["CMD", "python"] and command[-2:] == [cfn.LISTENER_HEARTBEAT, str(cfn.LISTENER_STALE_S)]
    here = [sys.executable, *command[2:-2], str(path), str(stale_s)]
    return subprocess.run(here, capture_output=True, text=True, timeout=60, cwd=cfn.REPO_ROOT)


def test_every_listener_container_has_the_heartbeat_health_check():
    containers = listener_containers()
    assert len(containers) == len(cfn.listener_deployments()) > 0  # one per landing place
    worker = cfn.template()["Resources"]["WorkerTaskDefinition"]["Properties"]["ContainerDefinitions"][0]
    for container in containers.values():
        assert container["HealthCheck"] == cfn.health_check(
            ["python", "-m", "tasks.landing.heartbeat", "/tmp/listener-heartbeat", "120"]
        )
        assert {"Name": HEARTBEAT_VARIABLE, "Value": cfn.LISTENER_HEARTBEAT} in container["Environment"]
        assert cfn.LISTENER_HEARTBEAT.startswith(cfn.SCRATCH + "/")  # the writable mount
    timing = {k: v for k, v in worker["HealthCheck"].items() if k != "Command"}
    assert timing == {"Interval": 30, "Timeout": 10, "Retries": 3, "StartPeriod": 120}
    assert {k: v for k, v in containers.popitem()[1]["HealthCheck"].items() if k != "Command"} == timing


def test_the_check_passes_while_the_listener_receives_and_fails_once_its_loop_is_stuck_or_stopped(
    tmp_path, monkeypatch
):
    path = tmp_path / "listener-heartbeat"
    monkeypatch.setenv(HEARTBEAT_VARIABLE, str(path))
    monkeypatch.setattr(heartbeat, "BEAT_EVERY_S", 0.1)
    container = next(iter(listener_containers().values()))
    assert check(container, path).returncode == 1  # not received yet
    source = WaitingSource(arrivals(3))
    stuck, unstick, stop = threading.Event(), threading.Event(), threading.Event()

    def handler(batch):
        if batch[0].key == "in/2":  # the process lives on, its loop does not turn
            stuck.set()
            unstick.wait(30)
        return Outcome(done=batch)

    def run() -> None:
        listener.pump(
            source,
            handler,
            batch_size=1,
            batch_seconds=0,
            wait_seconds=0.05,
            should_stop=stop.is_set,
            heartbeat=Heartbeat.from_env(),
        )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert stuck.wait(10)
        passing = check(container, path)
        assert passing.returncode == 0, passing.stderr  # fresh: received within the threshold
        time.sleep(STALE_S + 0.3)
        failing = check(container, path)
        assert thread.is_alive() and failing.returncode == 1
        assert "the listener stopped receiving" in failing.stderr
        unstick.set()
        time.sleep(0.3)
        assert check(container, path).returncode == 0  # receiving again
    finally:
        unstick.set()
        stop.set()
        thread.join(10)
    assert source.acked == ["in/0", "in/1", "in/2"]
    time.sleep(STALE_S + 0.3)
    assert check(container, path).returncode == 1  # the loop has ended


def test_a_heartbeat_writes_at_most_once_per_interval(tmp_path):
    path = tmp_path / "beat"
    beat = Heartbeat(path)  # every BEAT_EVERY_S (5 s)
    beat.beat()
    os.utime(path, (1_000, 1_000))
    for _ in range(1000):
        beat.beat()
    assert path.stat().st_mtime == 1_000  # no write within the interval
    Heartbeat(None).beat()  # no variable, no file: nothing to do
    Heartbeat(tmp_path / "missing-dir" / "beat").beat()  # a failed touch is logged, the listener goes on
    assert heartbeat.main([str(path), "60"]) == 1 and heartbeat.main(["only-one"]) == 2
