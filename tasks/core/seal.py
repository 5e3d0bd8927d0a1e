"""A record is data, not an order: what a row says to run runs only as the launch that accepted it wrote it.

A launch seals the fields of a row that decide what runs (a command, its env, ...) with an HMAC-SHA256 under the
stack's launch key, over what the seal is for, the row's id and a canonical JSON of those fields; the seal and the
key's id are stored in the row by the same create write. Whatever starts, restarts or resumes the row's work
verifies the seal first: a row written by anyone else (a neighbour through an open door to the table) or changed
after its launch fails the check (``SealBroken``, refused input) and runs nothing.

The key comes from ``PIPELINES_LAUNCH_KEY`` (base64 or hex, at least 32 bytes): locally `make up` makes it once in
.data/secrets/launch-key and passes it to every process; in AWS a Secrets Manager secret fills it. Its id (a hash of
the key, never the key) is stored with every seal, so a later rotation can keep verifying rows sealed under the key
before (``PIPELINES_LAUNCH_KEY_PREVIOUS``, comma-separated) while new launches use the new one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from tasks.core.errors import RefusedInput, Unavailable
from tasks.core.settings import MachineSettings

KEY_ENV = MachineSettings.env_name("launch_key")
PREVIOUS_KEYS_ENV = MachineSettings.env_name("launch_key_previous")
MIN_KEY_BYTES = 32
SEAL_ATTR, KEY_ID_ATTR = "launch_seal", "launch_key_id"


class LaunchKeyMissing(Unavailable, RuntimeError):
    """No launch key is configured (or it cannot be read): nothing is launched, rather than launched unsealed."""


class SealBroken(RefusedInput):
    """A row's seal is missing or does not match what the row says now: it was not written by a launch, or was
    changed since. Refused: its work never runs."""


def decode_key(text: str) -> bytes:
    """The key bytes of a hex or base64 (standard or URL-safe) text; LaunchKeyMissing if neither or too short."""
    text = text.strip()
    key = None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        try:
            key = base64.b64decode(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            pass
    if key is None or len(key) < MIN_KEY_BYTES:
        raise LaunchKeyMissing(f"{KEY_ENV} must be at least {MIN_KEY_BYTES} bytes, written as hex or base64")
    return key


def key_id(key: bytes) -> str:
    """A short public name of ``key`` (a hash of it, domain-separated): stored beside seals, never the key."""
    return hashlib.sha256(b"pipelines-launch-key-id\0" + key).hexdigest()[:16]


def launch_key() -> tuple[str, bytes]:
    """(key id, key) that new seals use; LaunchKeyMissing when ``PIPELINES_LAUNCH_KEY`` is unset or invalid."""
    secret = MachineSettings.read().launch_key
    text = secret.get_secret_value() if secret else ""
    if not text.strip():
        raise LaunchKeyMissing(
            f"no launch key: set {KEY_ENV} (`make up` makes one in .data/secrets/launch-key); nothing is launched "
            "unsealed"
        )
    key = decode_key(text)
    return key_id(key), key


def known_keys() -> dict[str, bytes]:
    """Every key a seal may have been made with: the current one and any previous ones (a rotation), by id."""
    current_id, current = launch_key()
    keys = {current_id: current}
    previous_keys = MachineSettings.read().launch_key_previous
    for text in (previous_keys.get_secret_value() if previous_keys else "").split(","):
        if text.strip():
            previous = decode_key(text)
            keys[key_id(previous)] = previous
    return keys


def canonical(value: Any) -> bytes:
    """One byte string per value: JSON with sorted keys, no spaces, UTF-8 (so equal rows seal equally)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _mac(key: bytes, purpose: str, record_id: str, fields: Mapping[str, Any]) -> str:
    message = canonical({"purpose": purpose, "id": record_id, "fields": dict(fields)})
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def seal(purpose: str, record_id: str, fields: Mapping[str, Any]) -> dict[str, str]:
    """The attributes to store with the row: the seal of ``fields`` for ``record_id`` and the key's id."""
    kid, key = launch_key()
    return {SEAL_ATTR: _mac(key, purpose, record_id, fields), KEY_ID_ATTR: kid}


def verify(purpose: str, record_id: str, fields: Mapping[str, Any], row: Mapping[str, Any]) -> None:
    """Nothing if ``row``'s seal matches ``fields`` for ``record_id`` under a known key; SealBroken otherwise."""
    stored, kid = row.get(SEAL_ATTR), row.get(KEY_ID_ATTR)
    if not isinstance(stored, str) or not isinstance(kid, str):
        raise SealBroken(f"{purpose} {record_id} carries no launch seal: it was not written by a launch; refused")
    key = known_keys().get(kid)
    if key is None:
        raise SealBroken(f"{purpose} {record_id} is sealed under launch key {kid!r}, which this stack does not know")
    if not hmac.compare_digest(stored, _mac(key, purpose, record_id, fields)):
        raise SealBroken(f"{purpose} {record_id}: what it says to run differs from what its launch sealed; refused")
