"""Seed 001: an input file's tracking key names that object alone, so one file name under two input trees
(buckets, or prefixes before ``pipeline/input/``) is two records, both merged, each row once."""

from __future__ import annotations

import re

import pytest

from flows.etl import ndjson_flush_orphans, ndjson_ingest
from tasks.core import keys
from tasks.etl import keys as etl_keys
from tests.helpers.etl import DAY, TODAY, good_lines, merged_rows, records, write_input

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


def test_one_file_name_in_two_input_trees_is_merged_twice_once_each(etl_env, tmp_path):
    root, table = etl_env["root"], etl_env["table"]
    home = write_input(root, DAY, "x.ndjson", good_lines(3, 1))  # the pipeline's own input store
    away = write_input(tmp_path / "other-bucket", DAY, "x.ndjson", good_lines(2, 2))  # another tree, same name
    assert ndjson_ingest(file_urls=[home, away], merge_deployment=None)["tracked"] == 2
    assert ndjson_flush_orphans(today=TODAY, merge_deployment=None)["launched"] == 1

    files = {
        v["file_path"]: v
        for k, v in records(table).items()
        if k[0] == DAY and not k[1].startswith(("MANIFEST#", "LOCK#"))
    }
    assert sorted(files) == sorted([home, away])
    assert files[home]["file_key"] == "x.ndjson"  # the seed's key where the seed's single input bucket is
    assert {v["status"].split("#")[0] for v in files.values()} == {"completed"}
    assert (files[home]["rows"], files[away]["rows"]) == (3, 2)
    rows = merged_rows(root)
    assert sorted((r["_source_file"], r["id"]) for r in rows) == sorted(
        [(home, "100"), (home, "101"), (home, "102"), (away, "200"), (away, "201")]
    )


def test_file_keys_of_one_name_in_two_buckets_differ_and_stay_inside_their_date():
    home = "s3://input-bucket/env"
    keyed = {
        url: etl_keys.input_file_key(etl_keys.parse_input_path(url), home)
        for url in (
            f"s3://input-bucket/env/pipeline/input/{DAY}/x.ndjson",  # the configured input store: the seed's bare name
            f"s3://other-bucket/env/pipeline/input/{DAY}/x.ndjson",
            f"s3://other-bucket/pipeline/input/{DAY}/x.ndjson",
            f"s3://input-bucket/pipeline/input/{DAY}/x.ndjson",
        )
    }
    assert list(keyed.values())[0] == "x.ndjson" and len(set(keyed.values())) == 4
    assert all(k == "x.ndjson" or re.fullmatch(r"tree-[0-9a-f]{16}/x\.ndjson", k) for k in keyed.values())
    assert all(etl_keys.safe_file_key(k) == k for k in keyed.values())
    for bad in ("tree-0123456789abcdef/../x.ndjson", "a/b.ndjson", "tree-0123456789abcdef/", "../x.ndjson"):
        with pytest.raises(keys.InvalidKey):
            etl_keys.safe_file_key(bad)
    assert etl_keys.quarantine_key(DAY, list(keyed.values())[1]).startswith(f"quarantine/{DAY}/tree-")
