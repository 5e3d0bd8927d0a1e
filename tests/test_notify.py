"""Failure notifications: a failed flow notifies through a notification block, or logs when there is none."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from prefect import flow

from tasks.core.notify import notify_on_failure


@flow(name="notify-test-fails", on_failure=[notify_on_failure])
def fails() -> None:
    raise RuntimeError("disk full")


def test_without_a_block_the_alert_is_logged(monkeypatch, caplog):
    monkeypatch.delenv("PIPELINES_NOTIFY_BLOCK", raising=False)
    with pytest.raises(RuntimeError):
        fails()
    alerts = [r.getMessage() for r in caplog.records if r.name == "pipelines.notify"]
    assert len(alerts) == 1 and "notify-test-fails" in alerts[0] and "disk full" in alerts[0]


def test_with_a_block_the_alert_goes_through_it(monkeypatch):
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    received: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        CustomWebhookNotificationBlock(
            name="on-call", url=f"http://127.0.0.1:{server.server_port}/hook",
            json_data={"subject": "{{subject}}", "body": "{{body}}"},
        ).save("test-on-call", overwrite=True)
        monkeypatch.setenv("PIPELINES_NOTIFY_BLOCK", "custom-webhook/test-on-call")
        with pytest.raises(RuntimeError):
            fails()
    finally:
        server.shutdown()
    assert len(received) == 1
    assert received[0]["subject"].startswith("notify-test-fails run ") and received[0]["subject"].endswith("is Failed")
    assert "disk full" in received[0]["body"]
