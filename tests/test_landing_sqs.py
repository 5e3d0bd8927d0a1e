"""Listing for the landing scan: the sizes ListObjectsV2 returns (S3) or one stat per file (locally), never a
HEAD per object.
"""

from __future__ import annotations

from collections import Counter

import boto3

from tasks.core import keys
from tasks.core.object_store import ListedObject, LocalStore, S3Store
from tasks.etl import ingest as etl
from tasks.landing.listing import listed_arrivals

import pytest

DAY = "2026-02-01"


@pytest.fixture
def aws(s3_base):
    """This test's bucket on moto's server."""
    return s3_base.split("/")[2]




def test_list_objects_returns_sizes_with_no_head_request(aws):
    session = boto3.Session()
    requests = Counter()
    session.events.register("before-call.s3", lambda model, **_: requests.update([model.name]))
    store = S3Store(aws, "pipelines", session=session)
    sizes = {keys.input_key(DAY, f"part-{i}.ndjson"): 10 + i for i in range(3)}
    for key, size in sizes.items():
        store.put_bytes(key, b"x" * size)
    store.put_bytes("elsewhere/other.ndjson", b"x")
    requests.clear()

    listed = store.list_objects(keys.INPUT_PREFIX)
    assert [(o.key, o.size, o.url) for o in listed] == [(k, s, store.url_for(k)) for k, s in sorted(sizes.items())]
    assert requests == Counter({"ListObjectsV2": 1})
    assert all(o.last_modified.endswith("+00:00") for o in listed)

    arrivals = listed_arrivals(f"s3://{aws}/pipelines/{keys.INPUT_PREFIX}")
    assert [(a.url, a.key, a.size) for a in arrivals] == [(o.url, o.key.removeprefix(keys.INPUT_PREFIX), o.size) for o in listed]


def test_local_list_objects_skips_unfinished_writes(tmp_path):
    store = LocalStore(tmp_path)
    store.put_bytes("in/a.ndjson", b"abc")
    store.put_bytes("in/sub/b.ndjson", b"abcdef")
    (tmp_path / "in" / ".c.ndjson.x1.part").write_bytes(b"half")  # a writer killed mid-write
    listed = store.list_objects("in/")
    assert [(o.key, o.size, o.url) for o in listed] == [
        ("in/a.ndjson", 3, store.url_for("in/a.ndjson")), ("in/sub/b.ndjson", 6, store.url_for("in/sub/b.ndjson"))
    ]
    assert isinstance(listed[0], ListedObject) and etl.landing_objects(store.url_for("in")) == [
        ListedObject(o.key.removeprefix("in/"), o.size, o.url, o.last_modified) for o in listed
    ]
