"""The shared validators every pipeline's keys module builds on (``tasks/<pipeline>/keys.py``).

Each identifier that reaches a key (run ids, job ids, survey names, file names, dates) is validated so no
input can write outside its prefix: no ``/``, ``..``, backslash, control characters or empty values.
"""

from __future__ import annotations

import re
from datetime import date

from tasks.core.errors import RefusedInput

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,127}$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class InvalidKey(RefusedInput):
    """An identifier or key that could escape its prefix, or does not parse."""


def safe_id(value: str, what: str = "id") -> str:
    """``value`` if it is a single safe path segment (letters, digits, ``._=-``; no ``..``), else InvalidKey."""
    if not isinstance(value, str) or not _ID.match(value) or ".." in value:
        raise InvalidKey(f"invalid {what} {value!r}: use 1-128 letters, digits, '.', '_', '=' or '-', no '/' or '..'")
    return value


def safe_key(key: str) -> str:
    """A relative object key with no empty, '.' or '..' segments and no backslash or control characters."""
    if not isinstance(key, str) or not key or key.startswith("/") or "\\" in key:
        raise InvalidKey(f"invalid object key {key!r}")
    if any(ord(c) < 32 for c in key):
        raise InvalidKey(f"invalid object key {key!r}: control character")
    parts = key.rstrip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidKey(f"invalid object key {key!r}: empty, '.' or '..' segment")
    return key


def safe_date(value: str) -> str:
    """A ``YYYY-MM-DD`` date that parses, else InvalidKey."""
    if not isinstance(value, str) or not _DATE.match(value):
        raise InvalidKey(f"invalid date prefix {value!r}: expected YYYY-MM-DD")
    try:
        date.fromisoformat(value)
    except ValueError as error:
        raise InvalidKey(f"invalid date prefix {value!r}: {error}") from None
    return value


def quarantine_reason_key(quarantined_key: str) -> str:
    """``{quarantine key}.reason.json``: why the file at that quarantine key was refused (every pipeline's quarantine
    and the landing's write one beside the file they set aside)."""
    if not quarantined_key.startswith("quarantine/"):
        raise InvalidKey(f"not a quarantine key: {quarantined_key!r}")
    return quarantined_key + ".reason.json"
