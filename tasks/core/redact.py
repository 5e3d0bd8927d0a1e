"""Secrets out of failure reasons, alarms and notifications: the one redaction every such message goes through.

A URL in a message may carry a credential in its user info (``user:pass@``), its query (a presigned URL's
signature, ``?token=``) or, for a webhook, its path (``/services/T…/B…/XXXX``). ``redact`` rewrites every URL it
finds: user info and fragment dropped, every query value masked, and in http(s) paths every segment that looks
like a token masked (a canonical UUID counts as an id). Object URLs (``s3://``, ``file://``) keep their paths: their
keys name data, and a reason
must say which object failed. Known secrets (an API key) are masked wherever they appear.

The state store passes every reason attribute it writes through here (``REASON_ATTRIBUTE``),
``tasks.core.notify`` every notification and its delivery errors, and every flow module the run logs
(``redact_logs``: the pipelines' messages and Prefect's own, tracebacks included). A sink like ``keys``:
standard library only.
"""

from __future__ import annotations

import logging
import re
import traceback
import urllib.parse
from collections.abc import Iterable
from typing import Any

MASK = "***"
# a URL inside free text: scheme:// up to whitespace, a quote or a bracket that ends it in messages and reprs
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`\\]+")
_PATH_SCHEMES = ("http", "https", "ws", "wss")  # paths that may hold a token (webhooks, signed links)
TOKEN_MIN = 16  # a path segment this long is treated as a token, whatever its characters
# a canonical UUID is an id, not a credential: Prefect run links (…/runs/flow-run/<id>) must still work
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# attributes that hold a reason or an error message (failure_reason, error_message, error, detail, stop_reason, …)
REASON_ATTRIBUTE = re.compile(r"reason|error|detail|message", re.IGNORECASE)


def _token_like(segment: str) -> bool:
    """Whether a path segment may be a credential: long, or letters mixed with digits or with both cases (a
    canonical UUID is an id)."""
    if _UUID.match(segment):
        return False
    if len(segment) >= TOKEN_MIN:
        return True
    if len(segment) < 8:
        return False
    letters = any(c.isalpha() for c in segment)
    mixed_case = any(c.isupper() for c in segment) and any(c.islower() for c in segment)
    return (letters and any(c.isdigit() for c in segment)) or mixed_case


def public_url(url: str) -> str:
    """``url`` fit for messages: no user info or fragment, every query value masked, token-like path segments of
    web URLs masked (object keys of ``s3://``/``file://`` URLs stay readable)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:  # not a URL after all (a bad port, an odd netloc): keep only its scheme
        return f"{url.split('://', 1)[0]}://{MASK}"
    host = (parts.hostname or "") + (f":{port}" if port else "")
    path = parts.path
    if parts.scheme.lower() in _PATH_SCHEMES:
        path = "/".join(MASK if _token_like(s) else s for s in path.split("/"))
    query = "&".join(
        f"{name}={MASK}" if value else name
        for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    )
    return urllib.parse.urlunsplit((parts.scheme, host, path, query, ""))


def url_secrets(url: str | None) -> list[str]:
    """The secret-looking parts of a URL: user, password, query values and token-like path segments."""
    if not url:
        return []
    parts = urllib.parse.urlsplit(url)
    values = [value for _, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)]
    tokens = [s for s in parts.path.split("/") if _token_like(s)] if parts.scheme.lower() in _PATH_SCHEMES else []
    return [v for v in (*values, *tokens, parts.username, parts.password) if v]


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every URL made public (``public_url``) and every known secret (and its URL-quoted forms)
    masked; longest secret first."""
    for secret in sorted({s for s in secrets if s and len(s) >= 3}, key=len, reverse=True):
        for form in {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}:
            text = text.replace(form, MASK)
    return _URL.sub(lambda match: public_url(match.group(0)), text)


def redact_value(value: Any) -> Any:
    """``redact`` applied to every string inside ``value`` (a string, or lists and maps of them)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value


def redact_attribute(name: str, value: Any) -> Any:
    """``value`` redacted when attribute ``name`` holds a reason or an error (``REASON_ATTRIBUTE``), else as is."""
    return redact_value(value) if REASON_ATTRIBUTE.search(name) else value


class RedactingFilter(logging.Filter):
    """A log record's message and traceback through ``redact`` before any handler (console, Prefect API) sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; never drop it."""
        message = record.getMessage()
        public = redact(message)
        if public != message:
            record.msg, record.args = public, None
        if record.exc_info and not record.exc_text:  # formatters reuse exc_text instead of formatting again
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info))).rstrip("\n")
        return True


# where failure reasons are logged: Prefect's run loggers (run_logger, the engine's "Finished in state Failed(…)"
# and its tracebacks) and the notifier; a logger's filter sees the records made on that logger itself
REDACTED_LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "pipelines.notify")


def redact_logs(names: Iterable[str] = REDACTED_LOGGERS) -> None:
    """Give each logger in ``names`` a ``RedactingFilter`` (once; Prefect's logging setup keeps logger filters)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
