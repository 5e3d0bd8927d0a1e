"""Arrivals from a listing: what a catch-up scan finds under a prefix, with the sizes the listing itself
returned (ListObjectsV2 in S3, one stat per file locally), never a request per object."""

from __future__ import annotations

from tasks.core.config import object_store
from tasks.landing.sources import Arrival


def listed_arrivals(store_url: str | None, prefix: str = "") -> list[Arrival]:
    """Every object under ``prefix`` of the store at ``store_url`` (the configured store when empty) as an Arrival."""
    return [
        # the same object unchanged lists with the same id, so a scan repeated finds nothing new to say
        Arrival(
            url=o.url,
            key=o.key,
            size=o.size,
            event_time=o.last_modified,
            event_id=f"{o.key}:{o.size}:{o.last_modified}",
        )
        for o in object_store(store_url).list_objects(prefix)
    ]
