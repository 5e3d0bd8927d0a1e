"""Requests to DynamoDB as an attacker sends them: whole HTTP requests as bytes, signed with a given key or not."""

from __future__ import annotations

import datetime
import json
from unittest import mock

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def raw(port: int, target: str, payload: dict, key: tuple[str, str] | None, when=None, close=True) -> bytes:
    """A whole HTTP request for DynamoDB's ``target``: SigV4-signed with ``key`` (id, secret) at ``when`` (now by
    default), or unsigned (``key`` None)."""
    body = json.dumps(payload).encode()
    request = AWSRequest(
        "POST",
        f"http://127.0.0.1:{port}/",
        data=body,
        headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"DynamoDB_20120810.{target}"},
    )
    if key is not None:
        with mock.patch("botocore.auth.get_current_datetime", return_value=when or datetime.datetime.utcnow()):
            SigV4Auth(Credentials(*key), "dynamodb", "us-east-1").add_auth(request)
    head = f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in request.headers.items())
    head += f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n"
    return head.encode() + body
