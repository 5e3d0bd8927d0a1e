"""Failure notifications: a failed flow notifies through a notification block, or logs when there is none."""

from __future__ import annotations

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


def test_with_a_block_the_alert_goes_through_it(monkeypatch, webhook):
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    url, received = webhook
    CustomWebhookNotificationBlock(
        name="on-call", url=url, json_data={"subject": "{{subject}}", "body": "{{body}}"},
    ).save("test-on-call", overwrite=True)
    monkeypatch.setenv("PIPELINES_NOTIFY_BLOCK", "custom-webhook/test-on-call")
    with pytest.raises(RuntimeError):
        fails()
    assert len(received) == 1
    assert received[0]["subject"].startswith("notify-test-fails run ") and received[0]["subject"].endswith("is Failed")
    assert "disk full" in received[0]["body"]
