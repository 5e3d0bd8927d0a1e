"""ETL merge fidelity (issue 14, items 1-5): every value as written, metadata-like fields kept, exactly once
across manifests after a failed merge, a failed manifest that can be re-run."""

from __future__ import annotations

import json
import random
import re
import threading
import time

import pyarrow.parquet as pq
import pytest

from flows.etl import ndjson_flush_orphans, ndjson_ingest, ndjson_merge
from tasks.core import faults
from tasks.etl import keys
from tasks.etl import merge as etl_merge
from tasks.etl import ops as etl_ops
from tasks.etl.ndjson_text import parse_ndjson
from tests.helpers.etl import (
    DAY,
    TODAY,
    assert_merged_exactly_once,
    file_statuses,
    lone_surrogate,
    manifests,
    merged_rows,
    records,
    write_five_inputs,
    write_input,
)

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

MISSING = "ndjson-merge/not-deployed"


def test_fields_named_like_the_metadata_columns_merge_under_a_documented_name(etl_env):
    root, table = etl_env["root"], etl_env["table"]
    lines = [
        {"id": 1, "_source_file": "upstream.csv", "_processing_timestamp": "yesterday", "_source_file__input": "x"}
    ]
    urls = [write_input(root, DAY, f"m-{i}.ndjson", lines) for i in range(5)]
    summary = ndjson_ingest(file_urls=urls, merge_deployment=None)
    assert summary["launched"] == 1
    assert file_statuses(table) == {"completed": 5}
    rows = merged_rows(root)
    assert len(rows) == 5
    row = next(r for r in rows if r["_source_file"] == urls[0])
    assert (row["_source_file__input"], row["_processing_timestamp__input"], row["_source_file__input__input"]) == (
        "upstream.csv",
        "yesterday",
        "x",
    )
    assert row["_processing_timestamp"] != "yesterday"  # the merge's own column


# keys a column can be named: an empty key, or one with a control character (tab included), refuses its file
# (tasks/etl/widths.py, tests/etl/test_etl_width_limits.py)
KEYS = [
    "métadonnées",
    "名前",
    "имя",
    "الاسم",
    "όνομα",
    "नाम",
    "🔑",
    'say "hi"',
    "back\\slash",
    "a.b",
    " spaced ",
]


def test_nested_values_under_keys_in_any_script_or_with_quotes_arrive_as_json_text(etl_env):
    root = etl_env["root"]
    text = "".join(
        json.dumps({key: {"v": i, "w": [i, "é"]}, "id": i}, ensure_ascii=i % 2 == 0) + "\n"
        for i, key in enumerate(KEYS)
    )
    (root / "pipeline" / "input" / DAY).mkdir(parents=True)
    path = root / "pipeline" / "input" / DAY / "keys.ndjson"
    path.write_text(text, encoding="utf-8")
    urls = [path.as_uri()] + [write_input(root, DAY, f"k-{i}.ndjson", [{"id": 100 + i}]) for i in range(4)]
    ndjson_ingest(file_urls=urls, merge_deployment=None)
    rows = {r["id"]: r for r in merged_rows(root) if r["_source_file"] == urls[0]}
    for i, key in enumerate(KEYS):
        escaped = '"\\u00e9"' if i % 2 == 0 else '"é"'  # nested strings keep their escapes as written
        assert rows[str(i)][key] == f'{{"v":{i},"w":[{i},{escaped}]}}', key


def test_numbers_and_strings_are_kept_exactly_as_written():
    line = (
        b'{"n": 9007199254740993, "f": 1.50, "e": 1e3, "z": -0, "big": 123456789012345678901234567890, '
        b'"s": "caf\\u00e9 \\"q\\" \\\\ \\n", "u": "\xe6\x97\xa5\xe6\x9c\xac", "b": false, "nil": null, '
        b'"deep": {"x": [1.50, 2e-7, 9007199254740993], "t": "\\u00e9"}}\n'
        b'{"n": 1.0, "f": 2}\n'
    )
    parsed = parse_ndjson("file:///x.ndjson", line)
    first, second = parsed.table.to_pylist()
    assert first == {
        "n": "9007199254740993",
        "f": "1.50",
        "e": "1e3",
        "z": "-0",
        "big": "123456789012345678901234567890",
        "s": 'café "q" \\ \n',
        "u": "日本",
        "b": "false",
        "nil": None,
        "deep": '{"x":[1.50,2e-7,9007199254740993],"t":"\\u00e9"}',
    }
    assert (second["n"], second["f"]) == ("1.0", "2")


def test_bad_lines_are_rejects_with_their_line_numbers_and_the_rest_merges():
    data = (
        b'{"a": 1}\n\n{broken\n[1]\n{"a": NaN}\n{"a": "\xff"}\n{"a": 1}{"b": 2}\n{"a": "\\ud800"}\n'
        b'{"a": "I N", "b": [1, {"c": "N"}]}\n'
    )
    parsed = parse_ndjson("file:///x.ndjson", data)
    assert [r["line_number"] for r in parsed.rejects] == [3, 4, 5, 6, 7, 8]
    assert [r["a"] for r in parsed.table.to_pylist()] == ["1", "I N"]


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _as_written(line: str) -> dict[str, str | None] | None:
    """The README's rule for one line, by a slow independent route (json's own scanner); None for a reject."""
    decoder = json.JSONDecoder(parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    try:
        if not isinstance(decoder.decode(line), dict):
            return None
    except ValueError:
        return None
    row, at = {}, line.index("{") + 1
    space = re.compile(r"[ \t\r\n]*")
    while True:
        at = space.match(line, at).end()
        if line[at] == "}":
            return row
        if line[at] == ",":
            at = space.match(line, at + 1).end()
        key, at = json.decoder.scanstring(line, at + 1)
        at = space.match(line, space.match(line, at).end() + 1).end()  # past the colon
        value, end = decoder.raw_decode(line, at)
        if isinstance(value, str) and lone_surrogate(value):  # even a value a repeated key replaces: not Unicode
            return None
        text = line[at:end]
        if text[0] in "{[":  # whitespace between tokens removed, strings untouched
            text = re.sub(r'("(?:[^"\\]|\\.)*")|[ \t\r\n]+', lambda m: m.group(1) or "", text)
        row[key] = None if value is None else value if isinstance(value, str) else text
        at = end


def test_random_odd_files_parse_as_an_independent_reading_of_the_rules_says():
    """Seeded random files of odd but valid lines (and some bad ones) against a slow reference, value by value."""
    rng = random.Random(14)
    atoms = [
        "1.",
        ".5",
        "-",
        "1e",
        "+1",
        '"\\x"',
        '"\\u12"',
        '"a\tb"',
        "01",
        "-01",
        "1.5e+",
        "tru",
        "nul",
        "[1,]",
        '{"a":1,}',
        '{"a" 1}',
        "[1 2]",
        "{1:2}",
        "[}",
        "{]",  # not JSON: the line is a reject
        "1.50",
        "-0",
        "1e3",
        "2E-7",
        "9007199254740993",
        "123456789012345678901234567890",
        "true",
        "false",
        "null",
        '"x"',
        '"caf\\u00e9"',
        '"a\\"b"',
        '"\\\\"',
        '"日本"',
        '""',
        '" : , { } [ ]"',
        '"\\n\\t\\/"',
        "NaN",
        "-Infinity",
        '"\\ud800"',
    ]
    names = ['"a"', '"b"', '"\\u00e9"', '"é"', '"k:1"', '"_source_file"', '""', '"{"', '"a\\"q"']
    gap = ["", "", "", " ", "  ", "\t", " \r"]

    def value(depth: int = 0) -> str:
        pick = rng.random()
        if depth < 3 and pick < 0.15:
            return (
                "{"
                + rng.choice(gap)
                + ",".join(
                    f"{rng.choice(names)}{rng.choice(gap)}:{value(depth + 1)}{rng.choice(gap)}"
                    for _ in range(rng.randrange(3))
                )
                + "}"
            )
        if depth < 3 and pick < 0.3:
            return (
                "["
                + ("," + rng.choice(gap)).join(value(depth + 1) for _ in range(rng.randrange(4)))
                + rng.choice(gap)
                + "]"
            )
        return rng.choice(atoms)

    def line() -> str:
        if rng.random() < 0.05:
            return rng.choice(
                ["[1,2]", "{bad", '"s"', "{}{}", '{"a":1} {"b":2}', "", "   ", '{"a":01}', "{'a':1}", '{"a":tru}']
            )
        members = ("," + rng.choice(gap)).join(
            f"{rng.choice(names)}{rng.choice(gap)}:{rng.choice(gap)}{value()}" for _ in range(rng.randrange(6))
        )
        return rng.choice(gap) + "{" + rng.choice(gap) + members + rng.choice(gap) + "}" + rng.choice(gap)

    seen_rejects = seen_nested = 0
    for _ in range(150):
        lines = [line() for _ in range(rng.randrange(1, 12))]
        parsed = parse_ndjson("file:///odd.ndjson", ("\n".join(lines) + rng.choice(["", "\n"])).encode())
        expected = {n: _as_written(text) for n, text in enumerate(lines, 1) if text.strip()}
        good = [row for row in expected.values() if row is not None]
        columns = list(dict.fromkeys(key for row in good for key in row))
        assert [r["line_number"] for r in parsed.rejects] == [n for n, row in expected.items() if row is None], lines
        assert (parsed.table.column_names if parsed.table else []) == columns, lines
        assert (parsed.table.to_pylist() if parsed.table else []) == [
            {c: row.get(c) for c in columns} for row in good
        ], lines
        seen_rejects += len(parsed.rejects)
        seen_nested += sum(1 for row in good for v in row.values() if v and v[0] in "{[")
    assert seen_rejects > 100 and seen_nested > 20  # the sample really holds both


def test_a_byte_order_mark_deep_nesting_and_refused_lines_get_clear_outcomes():
    def deep(levels):
        return '{"a":' + "[" * levels + "]" * levels + "}"

    data = (
        "\ufeff" + '{"a": 1}\n' + deep(600) + "\n" + deep(400) + '\n{"x": NaN}\n{"y":1}{"z":2}\n[1]\n{"a":01}\n'
    ).encode()
    parsed = parse_ndjson("file:///x.ndjson", data)
    assert [(r["line_number"], r["error"]) for r in parsed.rejects] == [
        (2, "values nested deeper than 512 levels"),
        (4, "NaN is not JSON"),
        (5, "more than one JSON value on the line"),
        (6, "a JSON list, not an object"),
        (7, "Expecting ',' delimiter: line 1 column 7 (char 6)"),
    ]
    assert [row["a"] for row in parsed.table.to_pylist()] == ["1", "[" * 400 + "]" * 400]


def _fail_second_part(monkeypatch):
    real = etl_merge.write_parquet

    def write(output_url, key, table):
        if key.endswith("part-00001.parquet"):
            raise RuntimeError("bad part (test)")
        return real(output_url, key, table)

    monkeypatch.setattr(etl_merge, "write_parquet", write)


@pytest.mark.parametrize("where", ["writing a part", "publishing"])
def test_a_merge_failing_midway_then_reprocess_writes_every_line_exactly_once(etl_env, monkeypatch, where):
    root, table = etl_env["root"], etl_env["table"]
    monkeypatch.setenv("ETL_TARGET_FILE_MB", "0")  # one part per file
    urls = write_five_inputs(root, "p")
    with monkeypatch.context() as patch:
        if where == "writing a part":
            _fail_second_part(patch)
            ndjson_ingest(file_urls=urls, merge_deployment=None)
        else:  # the third rename of the publish raises: two parts were visible
            real = etl_merge.publish
            patch.setattr(etl_merge, "publish", lambda *a: faults_at_third_rename(real, *a))
            ndjson_ingest(file_urls=urls, merge_deployment=None)
    assert file_statuses(table) == {"failed": 5}
    assert merged_rows(root) == []  # a failed manifest shows nothing
    assert etl_ops.reprocess_failed(DAY)["moved"] == 5
    ndjson_flush_orphans(today=TODAY, merge_deployment=None)
    assert file_statuses(table) == {"completed": 5}
    assert sorted(m["status"] for m in manifests(table).values()) == ["completed", "failed"]
    assert_merged_exactly_once(root, urls)
    # a re-run finds the published output and skips the merge
    (name,) = [keys.manifest_name_from_record_key(k) for k, m in manifests(table).items() if m["status"] == "completed"]
    again = ndjson_merge(date_prefix=DAY, manifest_name=name, rerun=True)
    assert again["already_published"] is True and again["manifest_status"] == "completed"
    assert_merged_exactly_once(root, urls)


def faults_at_third_rename(real, *args):
    with faults.inject(at=3, mode="raise", when="before"):
        return real(*args)


def test_rerunning_a_failed_manifest_completes_its_files_and_a_later_reprocess_duplicates_nothing(etl_env, monkeypatch):
    root, table = etl_env["root"], etl_env["table"]
    monkeypatch.setenv("ETL_TARGET_FILE_MB", "0")
    urls = write_five_inputs(root, "r")
    with monkeypatch.context() as patch:
        _fail_second_part(patch)
        ndjson_ingest(file_urls=urls, merge_deployment=None)
    assert file_statuses(table) == {"failed": 5}
    (key,) = manifests(table)
    rerun = ndjson_merge(date_prefix=DAY, manifest_name=keys.manifest_name_from_record_key(key), rerun=True)
    assert rerun["manifest_status"] == "completed"
    assert file_statuses(table) == {"completed": 5}
    assert etl_ops.reprocess_failed(DAY)["moved"] == 0
    ndjson_flush_orphans(today=TODAY, merge_deployment=None)
    assert_merged_exactly_once(root, urls)


@pytest.mark.sweep  # slow for make test; CI runs it in make test-sweep
def test_rerunning_a_failed_manifest_after_its_files_were_reprocessed_merges_nothing_twice(etl_env, monkeypatch):
    root, table = etl_env["root"], etl_env["table"]
    urls = write_five_inputs(root, "s")
    with monkeypatch.context() as patch:
        patch.setattr(etl_merge, "write_parquet", lambda *a: (_ for _ in ()).throw(RuntimeError("bad part (test)")))
        ndjson_ingest(file_urls=urls, merge_deployment=None)
    (old,) = manifests(table)
    etl_ops.reprocess_failed(DAY)
    ndjson_flush_orphans(today=TODAY, merge_deployment=None)  # the files go to a new manifest
    assert_merged_exactly_once(root, urls)
    late = ndjson_merge(date_prefix=DAY, manifest_name=keys.manifest_name_from_record_key(old), rerun=True)
    assert late["rows"] == 0 and late["files"] == []
    assert_merged_exactly_once(root, urls)
    assert file_statuses(table) == {"completed": 5}


def test_a_manifest_listing_a_path_that_is_no_input_file_still_merges_and_finishes_its_own_files(etl_env, caplog):
    from tasks.core.object_store import open_url

    root, table = etl_env["root"], etl_env["table"]
    urls = write_five_inputs(root, "odd")
    ndjson_ingest(file_urls=urls, merge_deployment="ndjson-merge/not-deployed")  # tracked, manifest left pending
    (key,) = manifests(table)
    name = keys.manifest_name_from_record_key(key)
    source, manifest_key = open_url(manifests(table)[key]["manifest_path"])
    document = json.loads(source.get_bytes(manifest_key))
    stray = (root / "elsewhere" / "notes.ndjson").as_uri()  # e.g. a hand-edited manifest
    document["fileLocations"][0]["URIPrefixes"].append(stray)
    source.put_bytes(manifest_key, json.dumps(document).encode())

    summary = ndjson_merge(date_prefix=DAY, manifest_name=name)
    assert (summary["manifest_status"], summary["files_completed"], summary["rows"]) == ("completed", 5, 15)
    assert stray not in [f["url"] for f in summary["files"]] and f"manifest lists {stray}" in caplog.text
    assert file_statuses(table) == {"completed": 5}
    assert_merged_exactly_once(root, urls)


def test_the_merge_metric_lands_with_its_manifest_once_and_a_retried_status_update_writes_nothing_again(etl_env):
    from tasks.core import state_store

    root, table = etl_env["root"], etl_env["table"]
    urls = write_five_inputs(root, "metric")
    ndjson_ingest(file_urls=urls, merge_deployment="ndjson-merge/not-deployed")  # tracked, manifest left pending
    (key,) = manifests(table)
    name = keys.manifest_name_from_record_key(key)
    summary = ndjson_merge(date_prefix=DAY, manifest_name=name)
    assert (summary["manifest_status"], summary["files_completed"]) == ("completed", 5)

    def merge_rows() -> list[dict]:
        rows = state_store.scan_all(etl_env["tables"]["etl_metrics"])
        return [state_store.to_plain(m) for m in rows if m["metric_type"] == "merge"]

    (row,) = merge_rows()
    assert (row["manifest"], row["date_prefix"], row["rows"], row["files"], row["files_failed"], row["skipped"]) == (
        name,
        DAY,
        15,
        5,
        0,
        False,
    )
    assert state_store.WRITE_TOKEN not in row  # an append-only row carries no write token
    # the status update again (a task retry after its response was lost): nothing moves, no second metric row
    path = manifests(table)[key]["manifest_path"]
    again = etl_merge.finish_manifest(
        DAY, name, summary, manifest_path=path, listed=summary["listed"], metric={"manifest": name}
    )
    assert again == {"manifest_status": "completed", "files_completed": 0, "files_failed": 0}
    assert len(merge_rows()) == 1
    assert file_statuses(table) == {"completed": 5}


@pytest.mark.parametrize("new_column_in", [None, 1, 2])
def test_a_part_is_written_while_its_files_are_read_and_a_late_new_column_rewrites_it_whole(
    tmp_path, monkeypatch, new_column_in
):
    """Rows stream into the part file as each file is parsed (row groups of ROW_GROUP_ROWS); a file that brings a
    column the first lacks makes the part be written again whole: same rows, columns in first-seen order."""
    monkeypatch.setattr(etl_merge, "ROW_GROUP_ROWS", 2)
    root = tmp_path / "objects"
    files = []
    for f in range(3):
        rows = [{"id": f"{f}-{k}", "v": k} | ({"late": f"x{k}"} if f == new_column_in else {}) for k in range(3)]
        if f == 1:
            rows = [{"v": r["v"], **{k: v for k, v in r.items() if k != "v"}} for r in rows]  # another key order
        files.append(write_input(root, DAY, f"s-{f}.ndjson", rows))
    out = etl_merge.merge_part(0, files, "pipeline/output/_staging/t/", root.as_uri(), "2026-02-01T00:00:00Z")
    part = pq.ParquetFile(root / out["staged"])
    assert out["rows"] == 9 and part.metadata.num_rows == 9
    expected = ["id", "v", "_processing_timestamp", "_source_file"] + (["late"] if new_column_in is not None else [])
    assert part.schema_arrow.names == expected  # first-seen order, streamed or written again whole
    if new_column_in is None:  # streamed: a row group every 2 rows or more, written while later files were read
        assert part.num_row_groups > 1
    rows = part.read().to_pylist()
    assert [(r["id"], r["v"], r.get("late"), r["_source_file"]) for r in rows] == [
        (f"{f}-{k}", str(k), f"x{k}" if f == new_column_in else None, files[f]) for f in range(3) for k in range(3)
    ]


ISSUE_23_LINES = ['{"a"}', '{"a" "b"}', '{"foo":"bar","a"}', '{"\\ud800x":2}', '{"id":2,"name"']  # the last: a cut file


def test_lines_the_reader_once_raised_on_are_rejects_and_every_file_of_the_manifest_completes(etl_env, monkeypatch):
    """Issue 23: ten files with one such line each ended failed#N and the manifest failed, at every re-run."""
    root, table = etl_env["root"], etl_env["table"]
    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", "10")
    urls = []
    for i in range(10):
        bad = ISSUE_23_LINES[i % len(ISSUE_23_LINES)]
        path = root / "pipeline" / "input" / DAY / f"b-{i}.ndjson"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f'{{"id":"b{i}-0"}}\n{bad}\n{{"id":"b{i}-1"}}\n'
            if i % 5 != 4
            else f'{{"id":"b{i}-0"}}\n{{"id":"b{i}-1"}}\n{bad}'
        )
        urls.append(path.as_uri())
    ndjson_ingest(file_urls=urls, merge_deployment=None)
    assert file_statuses(table) == {"completed": 10}
    ((_, manifest),) = manifests(table).items()
    assert (manifest["status"], manifest["rows"], manifest["rejected_lines"], manifest["files_failed"]) == (
        "completed",
        20,
        10,
        0,
    )
    assert_merged_exactly_once(root, urls, lines_per_file=2)
    rejects = [
        json.loads(line)
        for line in (root / keys.rejects_key(DAY, keys.manifest_name_from_record_key(next(iter(manifests(table))))))
        .read_text()
        .splitlines()
    ]
    assert sorted((r["source_file"], r["line_number"]) for r in rejects) == sorted(
        (url, 3 if i % 5 == 4 else 2) for i, url in enumerate(urls)
    )


def test_a_file_the_reader_cannot_read_fails_alone_and_the_other_nine_merge_exactly_once(etl_env, monkeypatch):
    root, table = etl_env["root"], etl_env["table"]
    monkeypatch.setenv("ETL_MAX_FILES_PER_MANIFEST", "10")
    urls = [write_input(root, DAY, f"t-{i}.ndjson", [{"id": f"t{i}-{k}", "v": k} for k in range(3)]) for i in range(10)]
    ndjson_ingest(file_urls=urls, merge_deployment=MISSING)  # tracked and in a manifest, not merged yet
    (key,) = manifests(table)
    unreadable = root / "pipeline" / "input" / DAY / "t-4.ndjson"
    unreadable.unlink()
    unreadable.mkdir()  # still listed and tracked, but reading it raises (IsADirectoryError)

    summary = ndjson_merge(date_prefix=DAY, manifest_name=keys.manifest_name_from_record_key(key))
    assert (summary["manifest_status"], summary["files_completed"], summary["files_failed"], summary["rows"]) == (
        "completed",
        9,
        1,
        27,
    )
    files = {k[1]: v for k, v in records(table).items() if k[0] == DAY and k[1].endswith(".ndjson")}
    failed = files.pop("t-4.ndjson")
    assert failed["status"].startswith("failed#")
    assert failed["error_message"] == f"could not be read: IsADirectoryError: [Errno 21] Is a directory: '{unreadable}'"
    assert {v["status"].split("#")[0] for v in files.values()} == {"completed"} and len(files) == 9
    assert manifests(table)[key]["status"] == "completed"
    nine = [u for u in urls if not u.endswith("/t-4.ndjson")]
    assert_merged_exactly_once(root, nine)
    assert {r["_source_file"] for r in merged_rows(root)} == set(nine)  # none of the failed file's lines
    # fixed, then reprocessed: its lines arrive once, and nothing of the nine twice
    unreadable.rmdir()
    write_input(root, DAY, "t-4.ndjson", [{"id": f"t4-{k}", "v": k} for k in range(3)])
    assert etl_ops.reprocess_failed(DAY)["moved"] == 1
    ndjson_flush_orphans(today=TODAY, merge_deployment=None)
    assert file_statuses(table) == {"completed": 10}
    assert_merged_exactly_once(root, urls)


def test_a_file_whose_every_line_brings_a_new_key_merges_to_parquet_with_each_value_in_its_row(tmp_path):
    """Such a file's columns are sparse in the reader (runs of values between slices of one null column)."""
    root = tmp_path / "objects"
    lines = [{"id": i, f"key_{i}": f"v{i}"} | ({"every_third": i} if i % 3 == 0 else {}) for i in range(300)]
    url = write_input(root, DAY, "wide.ndjson", lines)
    assert any(
        parse_ndjson(url, (root / "pipeline" / "input" / DAY / "wide.ndjson").read_bytes()).table[f"key_{i}"].num_chunks
        > 1
        for i in range(300)
    )  # the sparse layout is the one written here
    out = etl_merge.merge_part(0, [url], "pipeline/output/_staging/w/", root.as_uri(), "2026-02-01T00:00:00Z")
    rows = pq.read_table(root / out["staged"]).to_pylist()
    assert out["rows"] == 300 and len(rows[0]) == 1 + 300 + 1 + 2
    assert rows == [
        {
            "id": str(i),
            "every_third": str(i) if i % 3 == 0 else None,
            **{f"key_{k}": f"v{k}" if k == i else None for k in range(300)},
            "_processing_timestamp": "2026-02-01T00:00:00Z",
            "_source_file": url,
        }
        for i in range(300)
    ]


def test_a_failed_status_update_does_not_fail_the_merge_and_the_reconciler_completes_the_records(
    etl_env, monkeypatch, caplog
):
    """Seed 001's batch status updater is best-effort: a published merge whose status update fails (after its
    retries) completes, alarms, and `records-reconcile` then writes the statuses from the published output."""
    import logging

    from flows import etl as etl_flows
    from flows.records import records_reconcile
    from tasks import reconcile

    root, table = etl_env["root"], etl_env["table"]
    urls = write_five_inputs(root, "best")
    ndjson_ingest(file_urls=urls, merge_deployment=MISSING)  # tracked, manifest left pending
    (key,) = manifests(table)
    calls = []

    def unreachable(date_prefix, manifest_name, *args, **kwargs):  # the task run's name quotes manifest_name
        calls.append(args)
        raise ConnectionError("DynamoDB unreachable")

    with monkeypatch.context() as patch, caplog.at_level(logging.ERROR):
        patch.setattr(etl_flows, "finish_task", etl_flows.finish_task.with_options(retry_delay_seconds=0))
        patch.setattr(etl_flows.finish_task, "fn", unreachable)
        state = ndjson_merge(date_prefix=DAY, manifest_name=keys.manifest_name_from_record_key(key), return_state=True)
    assert state.is_completed(), state.message
    assert len(calls) == 1 + len(etl_flows.STATUS_UPDATE_RETRY_DELAYS_S)  # the seed's two retries, then given up
    assert (
        state.result()["manifest_status"] == "processing"
        and "status update failed" in state.result()["status_update_error"]
    )
    assert "STATUS UPDATE FAILED" in caplog.text  # the alarm (notification; the log when no block is set)
    assert manifests(table)[key]["status"] == "processing" and file_statuses(table) == {"manifested": 5}
    assert_merged_exactly_once(root, urls)  # the output is published

    records_reconcile()  # DynamoDB is back
    assert manifests(table)[key]["status"] == "completed" and manifests(table)[key]["rows"] == 15
    assert file_statuses(table) == {"completed": 5}
    assert_merged_exactly_once(root, urls)
    assert reconcile.disagreements() == []


@pytest.mark.parametrize("other_run", ["completed", "processing"])
@pytest.mark.timeout(300, method="thread")  # no SIGALRM handler of pytest's: the flow's timeout uses the alarm
def test_a_timed_out_merge_leaves_the_manifest_another_run_took_as_that_run_made_it(etl_env, other_run):
    """Issue 42 item 8: a merge run times out after another run took the manifest its parameters name; its timeout
    hook finishes only what it holds, so the other run's output, file and manifest statuses stay as they were."""
    from tasks.core import state_store
    from tasks.core.config import table_name
    from tasks.etl.ingest import TRACKING, tracking_key

    root, table = etl_env["root"], etl_env["table"]
    urls = write_five_inputs(root, "took")
    ndjson_ingest(file_urls=urls, merge_deployment=MISSING)  # tracked, manifest left pending
    (key,) = manifests(table)
    name = keys.manifest_name_from_record_key(key)
    assert ndjson_merge(date_prefix=DAY, manifest_name=name)["manifest_status"] == "completed"  # the other run
    if other_run == "processing":  # the other run's re-run is still merging it (as a `rerun` takes it)
        assert state_store.transition(
            table_name(TRACKING), tracking_key(DAY, key), "completed", "processing", set={"prefect_flow_run_id": "x"}
        )
    from tasks.etl.ndjson_text import parse_ndjson

    parse_ndjson("file:///warm.ndjson", b'{"a": 1}\n')  # Numba's kernels loaded here, not inside the 3 s run
    with faults.inject(at=1, mode="stall"):  # the first run's take hangs like a request that never answers
        state = ndjson_merge.with_options(timeout_seconds=3)(DAY, name, return_state=True)
    assert (state.type.value, state.name) == ("FAILED", "TimedOut")
    assert manifests(table)[key]["status"] == other_run
    assert file_statuses(table) == {"completed": 5}
    assert_merged_exactly_once(root, urls)  # the other run's output still published
    assert etl_merge.published(DAY, name) is not None


def test_a_part_on_a_one_thread_dask_worker_reads_its_files_one_at_a_time(tmp_path, monkeypatch):
    """Issue 40: a Dask worker of 1 thread read a part's files on every core of its machine, so n such workers ran
    n × cores readers and a merge could not scale by adding workers; it reads with the threads it was given."""
    from distributed import LocalCluster

    root = tmp_path / "objects"
    urls = [write_input(root, DAY, f"t-{f}.ndjson", [{"id": f"{f}-{k}"} for k in range(3)]) for f in range(4)]
    reading, most = [0], [0]
    lock, real = threading.Lock(), etl_merge.read_ndjson

    def counted(url, **options):
        with lock:
            reading[0] += 1
            most[0] = max(most[0], reading[0])
        time.sleep(0.1)  # long enough for a second reader thread, were there one, to start another file
        try:
            return real(url, **options)  # the part's width limits too
        finally:
            with lock:
                reading[0] -= 1

    monkeypatch.setattr(etl_merge, "read_ndjson", counted)
    monkeypatch.setattr(etl_merge.os, "cpu_count", lambda: 4)  # a machine of 4 cores, whatever runs the test
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        summary = etl_merge.merge_manifest(
            DAY, "batch-0001.json", urls, root.as_uri(), scheduler=cluster.scheduler_address
        )
    assert summary["rows"] == 12 and summary["files_failed"] == 0
    assert most[0] == 1
    assert etl_merge.reader_threads(8) == 4  # the local threaded scheduler keeps every core


@pytest.mark.parametrize("moved_since_read", [False, True])
def test_a_merged_manifest_finishes_in_one_request_and_a_file_moved_since_the_merge_read_it_falls_back(
    etl_env, moved_since_read
):
    """Issue 40 item 3: the MANIFEST, its metric row and its files move in ONE transaction when the records the merge
    read still stand (one DynamoDB request, not four); a file whose record changed since makes it write nothing, and
    the item-by-item path then finishes every file, the metric row still once."""
    from tasks.core import state_store
    from tasks.core.config import table_name
    from tasks.etl.ingest import TRACKING, tracking_key

    root, table = etl_env["root"], etl_env["table"]
    urls = write_five_inputs(root, "once")
    ndjson_ingest(file_urls=urls, merge_deployment=MISSING)  # tracked, manifest left pending
    (key,) = manifests(table)
    name = keys.manifest_name_from_record_key(key)
    path = etl_merge.start_processing(DAY, name)["manifest_path"]
    summary = etl_merge.merge_listed(DAY, name, path)
    assert sorted(r["file_path"] for r in summary["records"]) == sorted(urls)
    if moved_since_read:  # e.g. a reconciler's write between the merge's read and its status update
        first = summary["records"][0]
        moved = first["status"].replace("manifested", "failed")
        assert state_store.transition(
            table_name(TRACKING), tracking_key(DAY, first["file_key"]), first["status"], moved
        )
    calls: list[str] = []
    events = state_store.client().meta.events

    def count(model, **_):
        return calls.append(model.name)

    events.register("before-call.dynamodb", count, unique_id="count-finish")
    try:
        finished = etl_merge.finish_manifest(
            DAY,
            name,
            summary,
            manifest_path=path,
            listed=summary["listed"],
            metric={"manifest": name},
            records=summary["records"],
        )
    finally:
        events.unregister("before-call.dynamodb", unique_id="count-finish")
    assert finished == {"manifest_status": "completed", "files_completed": 5, "files_failed": 0}
    if moved_since_read:  # the one transaction refused, then the MANIFEST, the files read back, the files
        assert calls == ["TransactWriteItems", "TransactWriteItems", "BatchGetItem", "TransactWriteItems"]
    else:
        assert calls == ["TransactWriteItems"]
    assert manifests(table)[key]["status"] == "completed" and file_statuses(table) == {"completed": 5}
    merge_rows = [m for m in state_store.scan_all(etl_env["tables"]["etl_metrics"]) if m["metric_type"] == "merge"]
    assert len(merge_rows) == 1


def test_a_merge_that_loses_the_orchestrator_re_drives_its_manifest_rather_than_failing_it(etl_env, monkeypatch):
    """An upgrade's swap rotates the Prefect API's auth string under a run in flight (401) or the server goes away:
    the merge's manifest goes back to pending for the next run (nothing failed), which merges each line once."""
    import httpx

    from flows import etl as etl_flows

    root, table = etl_env["root"], etl_env["table"]
    urls = write_five_inputs(root, "swap")
    ndjson_ingest(file_urls=urls, merge_deployment=MISSING)  # tracked, manifest left pending
    (key,) = manifests(table)
    name = keys.manifest_name_from_record_key(key)

    def refused(date_prefix, manifest_name, *args, **kwargs):  # the task run's name quotes manifest_name
        request = httpx.Request("POST", "https://127.0.0.1:4200/api/task_runs/")
        raise httpx.HTTPStatusError("401 Unauthorized", request=request, response=httpx.Response(401, request=request))

    with monkeypatch.context() as patch:
        patch.setattr(etl_flows.merge_task, "fn", refused)
        state = ndjson_merge(date_prefix=DAY, manifest_name=name, return_state=True)
    assert not state.is_completed()
    manifest = manifests(table)[key]
    assert manifest["status"] == "pending" and manifest["redrives"] == 1 and "401" in manifest["redrive_reason"]
    assert file_statuses(table) == {"manifested": 5}  # nothing failed

    assert ndjson_merge(date_prefix=DAY, manifest_name=name)["manifest_status"] == "completed"  # the next run
    assert file_statuses(table) == {"completed": 5}
    assert_merged_exactly_once(root, urls)
