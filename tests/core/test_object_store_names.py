"""Object URLs for keys holding ``#``, ``?``, ``%xx`` and spaces: a store's URL of a key leads back to that key."""

from __future__ import annotations

import pytest

from tasks.core.object_store import LocalStore, ObjectStore, object_version, open_url

NAMES = ["surveys/incoming/s/a#1.json", "surveys/incoming/s/b?x=1.json", "surveys/incoming/s/c%41 d.json", "e%2Ff.json"]


@pytest.mark.parametrize("key", NAMES)
def test_a_local_url_of_a_key_with_url_characters_opens_that_key(tmp_path, key):
    store = LocalStore(tmp_path)
    store.put_bytes(key, b"manifest")
    url = store.url_for(key)
    opened, name = open_url(url)
    assert (opened.path(name), opened.get_bytes(name)) == (store.path(key), b"manifest")
    assert object_version(url)[0] == len(b"manifest")
    assert ObjectStore.from_url(store.url).get_bytes(key) == b"manifest"  # the store's own URL round-trips too


@pytest.mark.parametrize("key", NAMES)
def test_an_s3_url_of_a_key_with_url_characters_opens_that_key(s3_base, key):
    store = ObjectStore.from_url(s3_base)
    store.put_bytes(key, b"manifest")
    opened, name = open_url(store.url_for(key))
    assert opened.get_bytes(name) == b"manifest"
    assert object_version(store.url_for(key))[0] == len(b"manifest")


def test_a_local_folders_hidden_files_are_its_bookkeeping_and_never_listed(tmp_path):
    store = LocalStore(tmp_path)
    store.put_bytes("in/a.json", b"{}")
    store.put_bytes("in/sub/b.json", b"{}")
    (tmp_path / "in" / ".landing-watermark").write_text('{"watermark": 1}')  # a listener's own state
    (tmp_path / "in" / ".DS_Store").write_bytes(b"\0")
    (tmp_path / "in" / ".concat-x").mkdir()
    (tmp_path / "in" / ".concat-x" / "list.txt").write_text("file a")  # scratch space beside a target
    (tmp_path / "in" / ".c.json.123.part").write_text("{")  # an unfinished write
    assert list(store.list("in/")) == ["in/a.json", "in/sub/b.json"]
    assert [o.key for o in store.list_objects("in/")] == ["in/a.json", "in/sub/b.json"]
    assert store.delete_prefix("in/") == 2
    assert not (tmp_path / "in" / ".c.json.123.part").exists()  # unfinished writes still go with their prefix


def test_a_local_prefix_ending_inside_a_name_lists_the_names_and_folders_starting_with_it(tmp_path):
    """A manifest's parts (``…/batch-0001-part-``) among a date's thousands of files: the same keys as a full walk."""
    store = LocalStore(tmp_path)
    for key in ("out/ab-1.parquet", "out/abc/d.json", "out/x/ab.json", "out/b.json", "out/ab"):
        store.put_bytes(key, b"{}")
    (tmp_path / "out" / ".ab-2.parquet.123.part").write_text("{")  # an unfinished write of a part
    (tmp_path / "out" / ".b.json.456.part").write_text("{")
    assert list(store.list("out/ab")) == ["out/ab", "out/ab-1.parquet", "out/abc/d.json"]
    assert store.delete_prefix("out/ab") == 3
    assert not (tmp_path / "out" / ".ab-2.parquet.123.part").exists()  # it went with its prefix
    assert (tmp_path / "out" / ".b.json.456.part").exists() and list(store.list("out/")) == [
        "out/b.json",
        "out/x/ab.json",
    ]
