"""The backup's parts, fast: every attribute type through DynamoDB's export format (DYNAMODB_JSON) and back on a real
DynamoDB Local, the listeners' watermarks of a restored tree (what was acked is not offered again, what was not
is), and the AWS template keeping point-in-time recovery and versioning on. The whole stack's backup and restore
mid-feed is tests/stack/test_backup_restore.py (sweep)."""

from __future__ import annotations

import gzip
import json
import os
import time
import uuid
from decimal import Decimal

import boto3
import pytest

from deployments import backup
from tasks.landing import watch

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

EVERY_TYPE = {
    "pk": {"S": "item-1"},
    "sk": {"N": "42"},
    "text": {"S": "héllo\nworld \u2603"},
    "number": {"N": "-12345678901234567890.125"},
    "binary": {"B": b"\x00\xffbinary"},
    "strings": {"SS": ["a", "b"]},
    "numbers": {"NS": ["1", "2.5"]},
    "binaries": {"BS": [b"\x01", b"\x02\x03"]},
    "nothing": {"NULL": True},
    "flag": {"BOOL": False},
    "list": {"L": [{"S": "x"}, {"N": "1"}, {"B": b"\x04"}, {"L": []}]},
    "map": {"M": {"inner": {"M": {"b": {"B": b"\x05"}, "ok": {"BOOL": True}}}, "empty": {"M": {}}}},
    "expires_at": {"N": str(int(time.time()) + 3600)},
}


def test_every_attribute_type_round_trips_through_the_export_format(tmp_path):
    client = boto3.client("dynamodb")
    name = f"backup-{uuid.uuid4().hex[:8]}"
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "N"},
            {"AttributeName": "text", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-text",
                "KeySchema": [{"AttributeName": "text", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    client.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"})
    client.put_item(TableName=name, Item=EVERY_TYPE)
    for n in range(30):  # more than one batch write on the way back
        client.put_item(TableName=name, Item={"pk": {"S": f"more-{n}"}, "sk": {"N": str(n)}})

    assert backup.export_table(client, name, tmp_path / name) == 31

    summary = json.loads((tmp_path / name / "manifest-summary.json").read_text())
    assert (summary["outputFormat"], summary["exportType"], summary["itemCount"]) == (
        "DYNAMODB_JSON",
        "FULL_EXPORT",
        31,
    )
    assert summary["version"] == "2020-06-30" and summary["exportArn"].startswith(summary["tableArn"] + "/export/")
    files = [json.loads(line) for line in (tmp_path / name / "manifest-files.json").read_text().splitlines()]
    assert sum(f["itemCount"] for f in files) == 31 and all(f["dataFileS3Key"].endswith(".json.gz") for f in files)
    lines = [
        json.loads(line)
        for f in files
        for line in gzip.decompress((tmp_path / name / f["dataFileS3Key"]).read_bytes()).decode().splitlines()
    ]
    (written,) = [line["Item"] for line in lines if line["Item"]["pk"] == {"S": "item-1"}]
    assert set(lines[0]) == {"Item"}
    assert written["binary"] == {"B": "AP9iaW5hcnk="}  # base64, as AWS writes binaries
    assert written["map"]["M"]["inner"]["M"]["b"] == {"B": "BQ=="}
    assert written["number"] == {"N": "-12345678901234567890.125"}  # a number's digits, never a float

    client.delete_table(TableName=name)
    client.get_waiter("table_not_exists").wait(TableName=name)
    assert backup.import_table(client, tmp_path / name) == 31
    back = client.get_item(TableName=name, Key={"pk": {"S": "item-1"}, "sk": {"N": "42"}}, ConsistentRead=True)
    assert _canonical(back["Item"]) == _canonical(EVERY_TYPE)
    description = client.describe_table(TableName=name)["Table"]
    assert [i["IndexName"] for i in description["GlobalSecondaryIndexes"]] == ["by-text"]
    assert client.describe_time_to_live(TableName=name)["TimeToLiveDescription"]["AttributeName"] == "expires_at"
    assert client.scan(TableName=name, Select="COUNT")["Count"] == 31
    client.delete_table(TableName=name)


def _canonical(item: dict) -> dict:
    """Sets compared as sets, numbers as numbers (DynamoDB keeps neither order nor spelling)."""

    def value(v):
        ((kind, inner),) = v.items()
        if kind in ("SS", "BS"):
            return kind, frozenset(inner)
        if kind == "NS":
            return kind, frozenset(Decimal(n) for n in inner)
        if kind == "N":
            return kind, Decimal(inner)
        if kind == "L":
            return kind, tuple(value(x) for x in inner)
        if kind == "M":
            return kind, _canonical(inner)
        return kind, inner

    return {k: value(v) for k, v in item.items()}


def test_a_corrupt_data_file_is_refused_by_its_checksum(tmp_path):
    client = boto3.client("dynamodb")
    name = f"backup-{uuid.uuid4().hex[:8]}"
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.put_item(TableName=name, Item={"pk": {"S": "a"}})
    backup.export_table(client, name, tmp_path)
    client.delete_table(TableName=name)
    data = next((tmp_path / "data").iterdir())
    data.write_bytes(gzip.compress(b'{"Item": {"pk": {"S": "b"}}}\n'))
    with pytest.raises(ValueError, match="checksum"):
        list(backup.exported_items(tmp_path))


def _drop(folder, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f".{name}.part").write_text(name)
    os.rename(folder / f".{name}.part", folder / name)


def test_a_restored_tree_offers_what_was_not_acked_at_the_backup_and_nothing_else(tmp_path):
    live, restored = tmp_path / "live", tmp_path / "restored"
    incoming = live / "pipeline" / "input"
    _drop(incoming / "2026-01-01", "acked-1.ndjson")
    _drop(incoming / "2026-01-02", "acked-2.ndjson")
    time.sleep(watch.WATERMARK_SLACK_S + 0.1)
    seen: dict[str, int] = {}
    listing = watch.fs_now(incoming)
    list(watch.changed_files(incoming, watch.Watermark(), listing, seen=seen))
    boot_id, boot_s = watch._boot()
    mark = watch.Watermark(listing - watch.WATERMARK_SLACK_S, seen, boot_id, boot_s)
    watch.write_watermark(incoming, mark)  # as the listener writes it once that listing's files are acked
    _drop(incoming / "2026-01-02", "not-acked.ndjson")  # landed in a known folder after the watermark
    _drop(incoming / "2026-01-03", "new-folder.ndjson")  # in a folder the watermark does not know

    marks = backup.read_marks(live)
    assert list(marks) == ["pipeline/input"]
    backup.copy_tree(live, restored)
    unacked = backup.unacked_files(live, marks)
    assert unacked == {"pipeline/input": ["2026-01-02/not-acked.ndjson", "2026-01-03/new-folder.ndjson"]}

    # a copy (new ctimes, new folder inodes) lists everything from the old watermark: the restore's own does not
    again = restored / "pipeline" / "input"
    old = watch.read_watermark(again)
    files = lambda path: not watch.ignored_name(path.name)  # noqa: E731 - the listener's own filter, named
    assert len(list(watch.changed_files(again, old, watch.fs_now(again), files))) == 4
    assert backup.restore_watermarks(restored, unacked) == 2
    offered = watch.changed_files(again, watch.read_watermark(again), watch.fs_now(again), files)
    assert sorted(str(f.path.relative_to(again)) for f in offered) == unacked["pipeline/input"]
    assert (again / "2026-01-01" / "acked-1.ndjson").read_text() == "acked-1.ndjson"


def test_a_backup_refuses_a_folder_that_is_not_empty_and_a_restore_a_data_folder_in_use(tmp_path, monkeypatch):
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "something").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        backup.backup(tmp_path / "dest")
    (tmp_path / "data" / "dynamodb").mkdir(parents=True)
    with pytest.raises(ValueError, match="already holds a stack"):
        backup._refuse_unless_fresh(tmp_path / "data", None)


def test_the_aws_template_keeps_point_in_time_recovery_on_every_table_and_versioning_on_the_bucket():
    from infra import cloudformation as cfn

    resources = json.loads(cfn.TEMPLATE_PATH.read_text())["Resources"]
    tables = {n: r for n, r in resources.items() if r["Type"] == "AWS::DynamoDB::Table"}
    buckets = {n: r for n, r in resources.items() if r["Type"] == "AWS::S3::Bucket"}
    assert tables and buckets
    for name, table in tables.items():
        assert table["Properties"]["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}, name
        assert table.get("DeletionPolicy") != "Delete", name
    for name, bucket in buckets.items():
        assert bucket["Properties"]["VersioningConfiguration"] == {"Status": "Enabled"}, name


def test_a_store_restored_elsewhere_moves_the_records_urls_with_it():
    old, new = "file:///srv/a/objects", "file:///srv/b/objects"
    item = {
        "file_key": {"S": "f.ndjson"},
        "file_path": {"S": f"{old}/pipeline/input/2026-12-04/f.ndjson"},
        "parts": {"L": [{"S": f"{old}/pipeline/output/p-0.parquet"}, {"S": "s3://bucket/x"}]},
        "detail": {"M": {"manifest": {"S": f"{old}/manifests/m.json"}, "rows": {"N": "3"}}},
        "sibling": {"S": f"{old}-other/f.ndjson"},  # another folder that only starts with the same text
    }
    assert backup.moved_store(item, old, new) == {
        "file_key": {"S": "f.ndjson"},
        "file_path": {"S": f"{new}/pipeline/input/2026-12-04/f.ndjson"},
        "parts": {"L": [{"S": f"{new}/pipeline/output/p-0.parquet"}, {"S": "s3://bucket/x"}]},
        "detail": {"M": {"manifest": {"S": f"{new}/manifests/m.json"}, "rows": {"N": "3"}}},
        "sibling": {"S": f"{old}-other/f.ndjson"},
    }


def test_the_objects_copy_holds_the_tables_point_in_time_outside_the_landing_places(tmp_path):
    live, copy = tmp_path / "objects", tmp_path / "copy"
    landing, output = live / "pipeline" / "input", live / "pipeline" / "output"
    landing.mkdir(parents=True)
    output.mkdir(parents=True)
    (output / "published-before.parquet").write_bytes(b"a")
    (landing / "landed-before.ndjson").write_bytes(b"b")
    time.sleep(0.05)
    as_of = time.time()
    time.sleep(0.05)
    (output / "published-after.parquet").write_bytes(b"c")  # its records are not in the tables' snapshot
    (landing / "landed-after.ndjson").write_bytes(b"d")  # an arrival: its listener sorts it out
    backup.copy_tree(live, copy, as_of, (landing,))
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file()) == [
        "pipeline/input/landed-after.ndjson",
        "pipeline/input/landed-before.ndjson",
        "pipeline/output/published-before.parquet",
    ]
