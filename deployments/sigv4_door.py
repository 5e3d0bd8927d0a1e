"""The DynamoDB door: the loopback relay forwards an HTTP request to DynamoDB Local only when it carries a valid AWS
SigV4 signature under the stack's key, checked the way AWS checks it.

Each request (every one on a keep-alive connection) is read whole, head and body, before anything reaches the jar.
The expected signature is SigV4's, computed as botocore's signer (``SigV4Auth``) computes it over a request rebuilt
from the signed headers, the body and ``X-Amz-Date`` (``expected_signature``: the same canonical request, the derived
signing key kept per key, day and region, as every request of a day shares it: about 12 us of CPU a small request), and
compared in constant time; the access key id must be one the stack accepts (``deployments/dynamodb_keys.py``), the
credential scope's service ``dynamodb``, ``X-Amz-Date`` within five minutes of now (AWS's skew rule), and an
``X-Amz-Content-Sha256`` header the body's own SHA-256. A chunked body
(``Transfer-Encoding``), a head over 16 KiB or a body over DynamoDB's 16 MB request limit is refused. A refused
request is answered with a DynamoDB-style JSON error and its connection closed.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import hmac
import json
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from botocore.auth import SIGNED_HEADERS_BLACKLIST
from botocore.utils import normalize_url_path

from deployments import dynamodb_keys
from deployments.dynamodb_keys import Key
from tasks.core.errors import RefusedInput, Unavailable

SERVICE = "dynamodb"
SKEW_S = 300  # AWS refuses a signature more than five minutes from its clock
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024  # DynamoDB's own limit on one request (a BatchWriteItem of 25 large items)
ALGORITHM = "AWS4-HMAC-SHA256"
UNRECOGNIZED = "com.amazon.coral.service#UnrecognizedClientException"
INVALID_SIGNATURE = "com.amazon.coral.service#InvalidSignatureException"
SERIALIZATION = "com.amazon.coral.service#SerializationException"
REASONS = {400: "Bad Request", 403: "Forbidden", 413: "Request Entity Too Large", 503: "Service Unavailable"}


class NoKey(Unavailable, RuntimeError):
    """The relay was given no key to check requests against."""


class Refused(RefusedInput):
    """A request the door does not forward: the status, DynamoDB error type and message its caller is answered."""

    def __init__(self, message: str, kind: str = INVALID_SIGNATURE, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.kind, self.status = message, kind, status

    def response(self) -> bytes:
        """The HTTP response that answers the refused request and closes its connection."""
        body = json.dumps({"__type": self.kind, "message": self.message}).encode()
        reason = REASONS.get(self.status, "Refused")
        head = (
            f"HTTP/1.1 {self.status} {reason}\r\nContent-Type: application/x-amz-json-1.0\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode() + body


@dataclass
class Request:
    """One HTTP request as read: its raw head (forwarded as is), parsed line and headers, and body."""

    head: bytes
    method: str
    target: str
    headers: dict[str, str]  # lower-case name -> value (repeated headers joined by ",", as SigV4 joins them)
    body: bytes


class Reader:
    """Reads whole HTTP/1.1 requests, one after the other, from a connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()

    def _fill(self) -> bool:
        chunk = self.sock.recv(262144)
        self.buffer += chunk
        return bool(chunk)

    def request(self) -> Request | None:
        """The next whole request; None when the caller ends the connection (a request cut short included: none of
        it is forwarded); Refused for one the door will not read."""
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise Refused(f"request head over {MAX_HEAD_BYTES} bytes", SERIALIZATION)
            if not self._fill():
                return None
        if end > MAX_HEAD_BYTES:
            raise Refused(f"request head over {MAX_HEAD_BYTES} bytes", SERIALIZATION)
        head = bytes(self.buffer[: end + 4])
        del self.buffer[: end + 4]
        method, target, headers = _parse_head(head)
        if "transfer-encoding" in headers:
            raise Refused("Transfer-Encoding is not accepted: send the body with a Content-Length", SERIALIZATION)
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise Refused("Content-Length is not a number", SERIALIZATION) from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise Refused(f"request body over {MAX_BODY_BYTES} bytes", SERIALIZATION, 413)
        while len(self.buffer) < length:
            if not self._fill():
                return None
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        return Request(head, method, target, headers, body)


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise Refused("not an HTTP request line", SERIALIZATION) from None
    if not version.startswith("HTTP/1."):
        raise Refused(f"{version[:20]!r} is not HTTP/1.x", SERIALIZATION)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or name != name.strip():
            raise Refused("a malformed header line", SERIALIZATION)
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return method, target, headers


class Door:
    """Checks requests against the keys ``keys()`` returns (access key id -> key) at the time of each request."""

    def __init__(self, keys: Callable[[], dict[str, Key]]) -> None:
        self.keys = keys

    @classmethod
    def from_environment(cls, environ: dict[str, str]) -> Door:
        """The keys of the file ``PIPELINES_DYNAMODB_KEYS`` names (re-read whenever it changes: a rotation needs no
        restart), else the one key of ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``; NoKey when neither is set."""
        path = environ.get(dynamodb_keys.KEYS_FILE_ENV)
        if path:
            return cls(_file_keys(Path(path)))
        key_id, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
        if not key_id or not secret:
            raise NoKey(
                f"no key to check requests against: set {dynamodb_keys.KEYS_FILE_ENV} (the stack's key file) or "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        keys = {key_id: Key(key_id, secret)}
        return cls(lambda: keys)

    def check(self, request: Request, now: float | None = None) -> None:
        """Refused unless ``request`` is signed (SigV4, service dynamodb) with an accepted key, dated within five
        minutes of ``now``, over the body it carries."""
        headers = request.headers
        scope, signed_names, signature = _authorization(headers.get("authorization"))
        key_id, date, region, service, terminator = scope
        key = self.keys().get(key_id)
        if key is None:
            raise Refused("The security token included in the request is invalid.", UNRECOGNIZED)
        if service != SERVICE or terminator != "aws4_request":
            raise Refused(f"Credential should be scoped to correct service: '{SERVICE}'.")
        amz_date = headers.get("x-amz-date", "")
        signed_at = _amz_time(amz_date)
        now = datetime.datetime.now(datetime.UTC).timestamp() if now is None else now
        if abs(now - signed_at.timestamp()) > SKEW_S:
            raise Refused(f"Signature expired: {amz_date} is more than {SKEW_S // 60} minutes from the time now")
        if date != amz_date[:8] or not {"host", "x-amz-date"} <= set(signed_names):
            raise Refused("the credential scope's date, or the signed headers (host, x-amz-date), do not match")
        claimed = headers.get("x-amz-content-sha256")
        if claimed is not None and not hmac.compare_digest(claimed, hashlib.sha256(request.body).hexdigest()):
            raise Refused("X-Amz-Content-Sha256 is not the body's SHA-256")
        expected = expected_signature(request, key, region, amz_date, signed_names)
        if not hmac.compare_digest(expected, signature):
            raise Refused(
                "The request signature we calculated does not match the signature you provided. Check your AWS "
                "Secret Access Key and signing method."
            )


def _authorization(value: str | None) -> tuple[list[str], list[str], str]:
    """The credential scope (key id, date, region, service, terminator), signed header names and signature of an
    ``Authorization`` header."""
    if not value:
        raise Refused("the request carries no AWS SigV4 signature (Authorization header)", UNRECOGNIZED)
    algorithm, _, rest = value.partition(" ")
    fields = dict(part.strip().partition("=")[::2] for part in rest.split(","))
    scope = fields.get("Credential", "").split("/")
    if algorithm != ALGORITHM or len(scope) != 5 or not fields.get("SignedHeaders") or not fields.get("Signature"):
        raise Refused(f"Authorization is not an {ALGORITHM} Credential, SignedHeaders and Signature", UNRECOGNIZED)
    return scope, fields["SignedHeaders"].split(";"), fields["Signature"]


_AMZ_DATE = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z")


def _amz_time(amz_date: str) -> datetime.datetime:
    """``X-Amz-Date`` (``YYYYMMDDTHHMMSSZ``) as a UTC time; Refused when it is missing or not of that form."""
    match = _AMZ_DATE.fullmatch(amz_date)
    try:
        if match is None:
            raise ValueError(amz_date)
        return datetime.datetime(*map(int, match.groups()), tzinfo=datetime.UTC)
    except ValueError:
        raise Refused("X-Amz-Date is missing or not of the form YYYYMMDDTHHMMSSZ") from None


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


@functools.lru_cache(maxsize=64)
def _signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """SigV4's derived key (secret → day → region → service → ``aws4_request``): the same for every request of a day,
    so derived once, not four HMACs a request."""
    return _hmac(_hmac(_hmac(_hmac(f"AWS4{secret}".encode(), date), region), service), "aws4_request")


def _canonical_query(query: str) -> str:
    """The query string as botocore's signer orders it (pairs sorted, as sent)."""
    if not query:
        return ""
    return "&".join(f"{key}={value}" for key, value in sorted(pair.partition("=")[::2] for pair in query.split("&")))


def expected_signature(request: Request, key: Key, region: str, amz_date: str, signed_names: list[str]) -> str:
    """SigV4's signature of ``request`` under ``key`` over its signed headers, body and X-Amz-Date: what botocore's
    ``SigV4Auth`` computes for a request rebuilt from those (tests/stack/test_sigv4_door.py compares the two); Refused
    when a signed header is missing or SignedHeaders is not what SigV4 signs, sorted."""
    headers = request.headers
    if any(name not in headers for name in signed_names):
        raise Refused("a header named in SignedHeaders is missing")
    if signed_names != sorted(set(signed_names).difference(SIGNED_HEADERS_BLACKLIST) | {"host"}):
        raise Refused("SignedHeaders names a header SigV4 does not sign, or is not in sorted order")
    url = urlsplit(f"http://{headers['host']}{request.target}")
    if "x-amz-content-sha256" in signed_names:
        payload = headers["x-amz-content-sha256"]
    else:
        payload = hashlib.sha256(request.body).hexdigest()
    canonical = "\n".join(
        [
            request.method.upper(),
            quote(normalize_url_path(url.path), safe="/~"),
            _canonical_query(url.query),
            "".join(f"{name}:{' '.join(headers[name].split())}\n" for name in signed_names),
            ";".join(signed_names),
            payload,
        ]
    )
    scope = f"{amz_date[:8]}/{region}/{SERVICE}/aws4_request"
    to_sign = f"{ALGORITHM}\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode('utf-8')).hexdigest()}"
    signing_key = _signing_key(key.secret_access_key, amz_date[:8], region, SERVICE)
    return hmac.new(signing_key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()


def _file_keys(path: Path) -> Callable[[], dict[str, Key]]:
    """The accepted keys of the key file ``path``, read again when the file changes (a rotation replaces it)."""
    cache: dict[str, object] = {}

    def keys() -> dict[str, Key]:
        info = os.stat(path)
        version = (info.st_ino, info.st_mtime_ns, info.st_size)
        if cache.get("version") != version:
            cache["record"], cache["version"] = dynamodb_keys.load(path), version
        return dynamodb_keys.accepted(cache["record"])

    return keys
