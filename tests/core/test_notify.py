"""Failure notifications: a failed flow notifies through a notification block, or logs when there is none; a
block that cannot deliver (webhook down) is a failure with a secret-free reason, never a notification sent."""

from __future__ import annotations

import logging

import pytest
from prefect import flow

from tasks.core.notify import DeliveryError, deliver, notify_on_failure

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

SECRET_PATH = "/services/T0001/B0002/Zm9vYmFyc2VjcmV0"  # a Slack-style webhook: the path is the credential


@flow(name="notify-test-fails", on_failure=[notify_on_failure])
def fails() -> None:
    raise RuntimeError("disk full")


def save_webhook_block(url: str, name: str) -> str:
    """A real CustomWebhook notification block posting subject/body as JSON to ``url``; its 'type/name'."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    CustomWebhookNotificationBlock(name=name, url=url, json_data={"subject": "{{subject}}", "body": "{{body}}"}).save(
        name, overwrite=True
    )
    return f"custom-webhook/{name}"


def test_without_a_block_the_alert_is_logged(monkeypatch, caplog):
    monkeypatch.delenv("PIPELINES_NOTIFY_BLOCK", raising=False)
    with pytest.raises(RuntimeError):
        fails()
    alerts = [r.getMessage() for r in caplog.records if r.name == "pipelines.notify"]
    assert len(alerts) == 1 and "notify-test-fails" in alerts[0] and "disk full" in alerts[0]


def test_with_a_block_the_alert_goes_through_it(monkeypatch, webhook):
    url, received = webhook
    monkeypatch.setenv("PIPELINES_NOTIFY_BLOCK", save_webhook_block(url, "test-on-call"))
    with pytest.raises(RuntimeError):
        fails()
    assert len(received) == 1
    assert received[0]["subject"].startswith("notify-test-fails run ") and received[0]["subject"].endswith("is Failed")
    assert "disk full" in received[0]["body"]


def test_a_webhook_that_answers_500_is_a_delivery_error_without_the_url_secret(webhook_server):
    webhook_server.status = 500
    block = save_webhook_block(f"{webhook_server.url}{SECRET_PATH}?token=s3cr3tvalue", "test-down")
    with pytest.raises(DeliveryError) as raised:
        deliver("subject", "body", block)
    reason = str(raised.value)
    assert reason.startswith(f"notification block {block} did not deliver: HTTPStatusError: Server error '500")
    assert f"{webhook_server.url}/***/***/***/***?token=***" in reason  # the host stays: where it failed
    assert "T0001" not in reason and "Zm9vYmFyc2VjcmV0" not in reason and "s3cr3tvalue" not in reason
    assert [p["path"] for p in webhook_server.posts] == [f"{SECRET_PATH}?token=s3cr3tvalue"]  # it did try
    webhook_server.status = 200
    assert deliver("subject", "body", block) == f"block:{block}"


def test_an_apprise_block_that_fails_is_a_delivery_error_too(webhook_server):
    """Apprise blocks (Slack, Teams, Mattermost, …) return quietly on failure unless asked to raise."""
    from prefect.blocks.notifications import MattermostWebhook

    webhook_server.status = 503
    port = int(webhook_server.url.rsplit(":", 1)[1])
    MattermostWebhook(hostname="127.0.0.1", port=port, secure=False, token="mm0secret0token").save(
        "test-mm", overwrite=True
    )
    with pytest.raises(DeliveryError) as raised:
        deliver("subject", "body", "mattermost-webhook/test-mm")
    assert "NotificationError" in str(raised.value) and "mm0secret0token" not in str(raised.value)
    assert [p["path"] for p in webhook_server.posts] == ["/hooks/mm0secret0token"]
    webhook_server.status = 200
    assert deliver("subject", "body", "mattermost-webhook/test-mm") == "block:mattermost-webhook/test-mm"


def test_a_failed_hook_notification_is_logged_and_never_raised_into_the_hook(monkeypatch, webhook_server, caplog):
    webhook_server.status = 500
    monkeypatch.setenv(
        "PIPELINES_NOTIFY_BLOCK", save_webhook_block(f"{webhook_server.url}{SECRET_PATH}", "test-hook-down")
    )
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError, match="disk full"):  # the flow's own error
        fails()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "pipelines.notify"]
    assert [level for level, _ in lines] == ["WARNING", "ERROR"]
    assert lines[0][1].startswith(
        "notification not delivered: notification block custom-webhook/test-hook-down did not"
    )
    assert "disk full" in lines[1][1]  # the message itself is kept in the log
    ours = [
        r for r in caplog.records if r.name.startswith(("pipelines", "prefect"))
    ]  # (httpx logs its requests at INFO)
    assert ours and not any("Zm9vYmFyc2VjcmV0" in r.getMessage() for r in ours)
    assert len(webhook_server.posts) == 1


def test_an_incident_whose_webhook_is_down_is_retried_until_delivered_once(
    tables, store_root, monkeypatch, webhook_server, caplog, record_alarms_only
):
    """Outage: the incident row shows the failure and no notified_at; within the retry interval nothing is
    sent; webhook back and the interval passed: the next pipeline-health run delivers it, exactly once."""
    from blocks.base import clear_cache
    from flows.health import pipeline_health
    from tasks.health import incidents
    from tasks.records import dead_letter

    alarm = "records-dead-letter-archive"
    monkeypatch.setenv("PIPELINES_USE_BLOCKS", "0")
    monkeypatch.setenv("HEALTH_NOTIFY_BLOCK", save_webhook_block(f"{webhook_server.url}{SECRET_PATH}", "test-incident"))
    monkeypatch.setenv("HEALTH_NOTIFY_RETRY_SECONDS", "3600")
    clear_cache()
    dead_letter.archive("m-1", {"type": "ValidationError", "message": "no granules"}, body="{not json")
    webhook_server.status = 500

    with caplog.at_level(logging.WARNING):
        row = {r["name"]: r for r in pipeline_health()}[alarm]
    item = incidents.get(alarm)
    assert item["status"] == "OPEN" and "notified_at" not in item and "notify_claimed_at" not in item
    assert int(item["notify_attempts"]) == 1 and item["notify_failed_at"]
    assert item["notify_error"].startswith(
        "notification block custom-webhook/test-incident did not deliver: HTTPStatusError"
    )
    assert row["notified"] == f"not delivered (1 attempts): {item['notify_error']}"
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and "not delivered (attempt 1" in r.getMessage()
    ]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"notification of {alarm} not delivered (attempt 1; retried after 3600 s)"
    )
    assert "Zm9vYmFyc2VjcmV0" not in item["notify_error"] + warnings[0]

    pipeline_health()  # within the retry interval: no second try
    assert len(webhook_server.posts) == 1 and int(incidents.get(alarm)["notify_attempts"]) == 1

    webhook_server.status = 200
    monkeypatch.setenv("HEALTH_NOTIFY_RETRY_SECONDS", "0")
    clear_cache()
    row = {r["name"]: r for r in pipeline_health()}[alarm]
    item = incidents.get(alarm)
    assert row["notified"] == "sent now" and item["notified_at"] and int(item["notify_attempts"]) == 2
    assert "notify_error" not in item and "notify_failed_at" not in item
    pipeline_health()  # delivered: never sent again while the incident lasts
    assert [(p["status"], p["body"]["subject"]) for p in webhook_server.posts] == [
        (500, f"CRITICAL ALARM {alarm} (records): incident 1"),
        (200, f"CRITICAL ALARM {alarm} (records): incident 1"),
    ]
