"""No credential from a URL reaches a failure reason, an alarm, a notification or its log lines
(``tasks.core.redact``, applied by the state store to reason attributes and by ``notify``)."""

from __future__ import annotations

import json
import logging
import re
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.core import state_store
from tasks.core.notify import notify
from tasks.core.redact import redact
from tasks.phspectra import survey

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# a credential: 16+ URL-safe characters (Slack 24, Discord 68, a SigV4 signature 64); a UUID counts as an id
tokens = st.text(string.ascii_letters + string.digits + "-_", min_size=16, max_size=64).filter(
    lambda t: not UUID.match(t)
)
hosts = st.sampled_from(["hooks.slack.com", "discord.com", "127.0.0.1:8080", "bucket.s3.amazonaws.com", "example.org"])
words = st.lists(
    st.sampled_from(["services", "hooks", "api", "webhooks", "v1", "T0", "in", "2024-01-01", "x.ndjson"]), max_size=3
).map("/".join)
around = st.sampled_from(["POST {} failed: 500", "for url '{}'", "({})", "unreachable: {}.", "url={}\nnext line"])

SLACK = "abcDEFghiJKLmnoPQRstuVWX"
PASSWORD = "pw-0123456789-secret"
SIGNATURE = "0123456789abcdef0123456789abcdef"
SECRET_URL = (
    f"https://user:{PASSWORD}@objects.example.com/hooks/T0123ABCD/B0123ABCD/{SLACK}/cube.npy"
    f"?X-Amz-Signature={SIGNATURE}&X-Amz-Expires=3600"
)


def _path(parts: list[str]) -> str:
    return "/".join(p for p in parts if p)


@given(tokens, hosts, words, words, around, st.sampled_from(["https", "http"]))
def test_a_token_in_a_web_urls_path_never_survives(token, host, before, after, template, scheme):
    text = template.format(f"{scheme}://{host}/{_path([before, token, after])}")
    assert token not in redact(text)


@given(
    tokens,
    hosts,
    words,
    st.sampled_from(["token", "key", "X-Amz-Signature", "sig"]),
    around,
    st.sampled_from(["https", "http", "s3", "file"]),
)
def test_a_token_in_a_query_never_survives(token, host, path, name, template, scheme):
    text = template.format(f"{scheme}://{host}/{path}?a=1&{name}={token}&b=2")
    assert token not in redact(text)


@given(
    tokens,
    st.text(string.ascii_lowercase, min_size=1, max_size=8),
    hosts,
    words,
    around,
    st.sampled_from(["https", "http", "s3"]),
    st.booleans(),
)
def test_a_token_in_user_info_never_survives(token, user, host, path, template, scheme, as_password):
    userinfo = f"{user}:{token}" if as_password else token
    text = template.format(f"{scheme}://{userinfo}@{host}/{path}")
    assert token not in redact(text)


@given(
    st.from_regex(r"[a-z0-9][a-z0-9.-]{2,30}[a-z0-9]", fullmatch=True),
    st.dates(),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,40}", fullmatch=True),
    st.sampled_from(["s3://", "file:///data/"]),
)
def test_object_urls_stay_readable(bucket, day, name, root):
    text = f"cannot read {root}{bucket}/pipeline/input/{day.isoformat()}/{name}.ndjson: not found"
    assert redact(text) == text


def test_what_a_secret_url_becomes():
    assert redact(f"cannot read cube {SECRET_URL}: 403") == (
        "cannot read cube https://objects.example.com/hooks/***/***/***/cube.npy"
        "?X-Amz-Signature=***&X-Amz-Expires=*** 403"
    )
    link = "http://127.0.0.1:4200/runs/flow-run/0b6f7c1e-4c1e-4a55-9d38-3b1b0c1e2f3a"
    assert redact(f"ended Failed\n{link}") == f"ended Failed\n{link}"  # run links still work
    assert redact("key sk-live-0123 in body", ["sk-live-0123"]) == "key *** in body"


def _no_secret(text: str) -> bool:
    return not any(secret in text for secret in (PASSWORD, SLACK, SIGNATURE))


def test_a_failing_object_url_leaves_no_secret_in_the_failure_reason_or_the_run_logs(
    tables, store_root, caplog, monkeypatch
):
    from flows.phspectra_survey import phspectra_survey

    monkeypatch.delenv("PIPELINES_NOTIFY_BLOCK", raising=False)  # the failure alert goes to the log
    caplog.set_level(logging.INFO)
    with pytest.raises(ValueError):
        phspectra_survey(cube_url=SECRET_URL, survey="grs", run_id="run-secret", chunk_size=4)
    run = state_store.get_item(tables["phspectra_runs"], survey.run_key("run-secret"))
    assert run["status"] == survey.RUN_FAILED
    assert run["error"].startswith(
        "cannot read cube https://objects.example.com/hooks/***/***/***/cube.npy?X-Amz-Signature=***"
    )
    assert _no_secret(run["error"])
    # the engine's traceback, the task's and flow's final states and the failure alert are logged, redacted
    assert (
        "Traceback" in caplog.text
        and "cannot read cube https://objects.example.com/hooks/***/***/***/cube.npy" in caplog.text
    )
    assert any(r.name == "pipelines.notify" for r in caplog.records)
    assert _no_secret(caplog.text)


@pytest.fixture
def failing_webhook(webhook_server):
    """A webhook whose URL holds a token and that answers 500 (its client's error quotes the URL)."""
    webhook_server.status = 500
    yield f"{webhook_server.url}/services/T0123ABCD/B0123ABCD/{SLACK}", webhook_server.received


def test_a_failing_webhook_with_a_secret_path_logs_no_secret(failing_webhook, caplog):
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    url, received = failing_webhook
    CustomWebhookNotificationBlock(name="secret-hook", url=url, json_data={"body": "{{body}}"}).save(
        "test-secret-hook", overwrite=True
    )
    caplog.set_level(logging.WARNING)  # the root level Prefect's logging config runs with (httpx logs URLs at INFO)
    where = notify("ALARM x", f"merge failed: cannot read {SECRET_URL}", "custom-webhook/test-secret-hook")
    assert where == "undelivered" and len(received) == 1  # sent once, refused by the server
    assert _no_secret(json.dumps(received[0]))  # what was sent carries no secret either
    lines = [r.getMessage() for r in caplog.records if r.name == "pipelines.notify"]
    assert any(
        "500 Internal Server Error" in line and "/***/***/***/***" in line for line in lines
    )  # the whole webhook path
    assert _no_secret(caplog.text)
