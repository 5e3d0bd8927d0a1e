"""The DynamoDB door's own SigV4 computation gives botocore's signature, and refuses what botocore's check refused."""

from __future__ import annotations

import time

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from deployments.dynamodb_keys import Key
from deployments.sigv4_door import Door, Refused, Request, _parse_head, expected_signature

KEY = Key("AKIDDOORTEST", "a-secret-of-the-stack-0123456789abcdef")


def botocore_signature(request: Request, key: Key, region: str, amz_date: str, signed_names: list[str]) -> str:
    """The reference: botocore's signer over a request rebuilt from the signed headers, body and X-Amz-Date."""
    rebuilt = AWSRequest(
        method=request.method,
        url=f"http://{request.headers['host']}{request.target}",
        data=request.body,
        headers={name: request.headers[name] for name in signed_names},
    )
    rebuilt.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(key.access_key_id, key.secret_access_key), "dynamodb", region)
    return signer.signature(signer.string_to_sign(rebuilt, signer.canonical_request(rebuilt)), rebuilt)


def signed_request(
    body: bytes, target: str = "/", extra: dict[str, str] | None = None, region: str = "us-east-1"
) -> tuple[Request, list[str], str]:
    """A request as boto3 sends it (signed by botocore), parsed as the door reads it; its signed names and date."""
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "DynamoDB_20120810.GetItem"}
    headers.update(extra or {})
    aws = AWSRequest(method="POST", url=f"http://127.0.0.1:8000{target}", data=body, headers=headers)
    SigV4Auth(Credentials(KEY.access_key_id, KEY.secret_access_key), "dynamodb", region).add_auth(aws)
    lines = [f"POST {target} HTTP/1.1", "Host: 127.0.0.1:8000"]
    lines += [f"{name}: {value}" for name, value in aws.headers.items()]
    lines += [f"Content-Length: {len(body)}", "User-Agent: Boto3/1", "", ""]
    head = "\r\n".join(lines).encode("latin-1")
    method, parsed_target, parsed = _parse_head(head)
    authorization = parsed["authorization"]
    names = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    return Request(head, method, parsed_target, parsed, body), names, parsed["x-amz-date"]


@pytest.mark.parametrize(
    "body,target,extra",
    [
        (b'{"TableName":"t"}', "/", {}),
        (b"", "/", {}),
        (b'{"TableName":"t","Key":{"k":{"S":"' + b"x" * 50_000 + b'"}}}', "/", {}),
        (b"{}", "/a/./b/../c", {}),
        (b"{}", "/?b=2&a=1&a=0", {}),
        (b"{}", "/", {"X-Amz-Security-Token": "  spaced   token  "}),
        (b"{}", "/", {"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"}),
    ],
)
def test_the_door_computes_botocores_signature(body, target, extra):
    request, names, amz_date = signed_request(body, target, extra)
    ours = expected_signature(request, KEY, "us-east-1", amz_date, names)
    assert ours == botocore_signature(request, KEY, "us-east-1", amz_date, names)
    assert request.headers["authorization"].endswith(f"Signature={ours}")  # what the client itself signed


def test_a_signed_request_passes_the_door_and_a_changed_one_does_not():
    door = Door(lambda: {KEY.access_key_id: KEY})
    request, _, _ = signed_request(b'{"TableName":"t"}')
    door.check(request, now=time.time())
    tampered = Request(request.head, request.method, request.target, request.headers, b'{"TableName":"u"}')
    with pytest.raises(Refused, match="signature we calculated does not match"):
        door.check(tampered, now=time.time())


@pytest.mark.parametrize(
    "names,why",
    [
        (["content-type", "host", "x-amz-date", "user-agent"], "does not sign"),  # a header SigV4 leaves out
        (["x-amz-date", "host", "content-type"], "does not sign"),  # not sorted
        (["content-type", "host", "host", "x-amz-date"], "does not sign"),  # twice
        (["content-type", "host", "x-amz-date", "x-not-sent"], "is missing"),
    ],
)
def test_signed_headers_that_botocore_would_not_sign_are_refused(names, why):
    request, _, amz_date = signed_request(b"{}")
    with pytest.raises(Refused, match=why):
        expected_signature(request, KEY, "us-east-1", amz_date, names)


@pytest.mark.parametrize("amz_date", ["", "20261305T000000Z", "2026-12-05T00:00:00Z", "20261205T000000"])
def test_a_malformed_date_is_refused(amz_date):
    door = Door(lambda: {KEY.access_key_id: KEY})
    request, _, _ = signed_request(b"{}")
    headers = {**request.headers, "x-amz-date": amz_date}
    with pytest.raises(Refused, match="X-Amz-Date"):
        door.check(Request(request.head, request.method, request.target, headers, request.body), now=time.time())
