"""A generated part of a hand-written document: the text from one marker comment to another, which ``pipelines
generate`` rewrites and leaves the rest as written."""

from __future__ import annotations

from tasks.core.errors import RefusedInput


class MarkersMissing(RefusedInput):
    """The document lacks the marker comments a generated part goes between."""


def with_part(text: str, begin: str, end: str, part: str, document: str) -> str:
    """``text`` with its part from ``begin`` to ``end`` (the markers included) replaced by ``part``."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise MarkersMissing(f"{document} has no {begin!r} ... {end!r}: the generated part goes between them")
    return text[:start] + part + text[stop + len(end) :]
