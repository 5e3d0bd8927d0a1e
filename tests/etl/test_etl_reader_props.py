"""The compiled NDJSON reader (tasks/etl/ndjson_text.py) against ``json.loads`` (issue 23, item 1).

Property-based: generated records (nested values, odd keys: escapes, any script, lone surrogates, empty,
repeated, two spellings of one key), serialized with random whitespace and escapes, then byte-level mutations
(deleted, inserted, replaced bytes, truncation, structure broken inside objects). For every line the reader
either keeps it with exactly ``json.loads``'s values, read through the module doc's mapping, or rejects it exactly
when ``json.loads`` does or the documented policy says so; it never raises. ``make test-sweep`` runs more examples.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import re
import tracemalloc

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.etl import ndjson_text
from tasks.etl.ndjson_text import MAX_DEPTH, parse_ndjson
from tests.helpers.etl import lone_surrogate

QUICK = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SWEEP = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- the reference: json.loads + the policy


class Number:
    """A number's text as written (``json.loads``'s ``parse_int``/``parse_float`` hooks); never equal to a string."""

    __hash__ = None

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other) -> bool:
        return isinstance(other, Number) and other.text == self.text

    def __repr__(self) -> str:
        return f"Number({self.text})"


class Pairs(dict):
    """An object as ``json.loads`` builds it (last value of a key wins), with every pair it saw."""

    def __init__(self, pairs: list[tuple[str, object]]):
        super().__init__(pairs)
        self.pairs = pairs


def _loads(text: str):
    def no_constant(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_int=Number, parse_float=Number, parse_constant=no_constant, object_pairs_hook=Pairs)


def _depth(value) -> int:
    if isinstance(value, (list, dict)):
        return 1 + max((_depth(v) for v in (value.values() if isinstance(value, dict) else value)), default=0)
    return 0


REJECT = object()


def expected_line(line: bytes):
    """What the reader must make of one line: None (blank, skipped), REJECT, or json.loads's object."""
    if not line.strip(b" \t\r"):
        return None
    try:
        value = _loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return REJECT
    if not isinstance(value, Pairs):
        return REJECT
    for key, member in value.pairs:  # the policy: UTF-8 column names and top-level strings, bounded nesting
        if lone_surrogate(key) or (isinstance(member, str) and lone_surrogate(member)):
            return REJECT
        if _depth(member) > MAX_DEPTH:
            return REJECT
    return value


_TOKEN_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def check_cell(cell: str | None, value, line: str) -> None:
    """One value through the module doc's mapping: strings decoded, numbers and nested JSON as written."""
    if value is None:
        assert cell is None
    elif isinstance(value, Number):
        assert cell == value.text  # as written
    elif isinstance(value, str):
        assert cell == value
    elif isinstance(value, bool):
        assert cell == ("true" if value else "false")
    else:  # nested: its text with only the whitespace between tokens removed
        assert _loads(cell) == value
        outside_strings = _TOKEN_STRING.sub("", cell)
        assert not re.search(r"[ \t\r\n]", outside_strings), cell
        for token in _TOKEN_STRING.findall(cell):  # strings (keys too) keep their escapes as written
            assert token in line, token


def check_file(data: bytes) -> None:
    """The reader's table and rejects for ``data`` are the reference's, line by line."""
    parsed = parse_ndjson("file:///p.ndjson", data)
    body = b" " * 3 + data[3:] if data.startswith(codecs.BOM_UTF8) else data  # a leading BOM is not data
    lines = body.split(b"\n")
    expected = {n: expected_line(line) for n, line in enumerate(lines, 1)}
    rejected = [n for n, e in expected.items() if e is REJECT]
    assert [r["line_number"] for r in parsed.rejects] == rejected
    assert all(r["error"] and r["source_file"] == "file:///p.ndjson" for r in parsed.rejects)
    good = [(n, e) for n, e in expected.items() if e is not None and e is not REJECT]
    assert parsed.rows == len(good)
    columns = list(dict.fromkeys(key for _, e in good for key in e))
    assert (parsed.table.column_names if parsed.table is not None else []) == columns
    rows = parsed.table.to_pylist() if parsed.table is not None else []
    for row, (n, e) in zip(rows, good):
        text = lines[n - 1].decode("utf-8")
        for name in columns:
            if name in e:
                check_cell(row[name], e[name], text)
            else:
                assert row[name] is None


# --------------------------------------------------------------------------- generated lines


ODD_KEYS = ["a", "b", "", "é", "日本", "🔑", "_source_file", 'q"', "k:1", "{", "}", "\\", "\t", "\x00", "/", " "]
NUMBER = st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,6})?([eE][+-]?[0-9]{1,3})?", fullmatch=True)
LONE_SURROGATE = st.tuples(st.text(max_size=2), st.characters(categories=["Cs"]), st.text(max_size=2)).map("".join)
TEXT = st.sampled_from([st.text(max_size=6)] * 3 + [LONE_SURROGATE]).flatmap(lambda strategy: strategy)  # 1 in 4
KEY = st.sampled_from(ODD_KEYS) | st.sampled_from(ODD_KEYS) | TEXT
GAP = st.sampled_from(["", "", "", " ", "\t", " \r ", "  "])
LEAF = st.none() | st.booleans() | NUMBER.map(Number) | TEXT | st.sampled_from(ODD_KEYS)
VALUE = st.recursive(
    LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.lists(st.tuples(KEY, inner), max_size=3).map(tuple),
    max_leaves=10,
)
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "/": "\\/"}


@st.composite
def json_string(draw, text: str) -> str:
    """``text`` as a JSON string, each character raw or escaped in one of JSON's ways (a raw lone surrogate stays
    raw: the line is then not UTF-8)."""
    out = ['"']
    for ch in text:
        code, style = ord(ch), draw(st.sampled_from(["raw", "raw", "u", "U", "short"]))
        if style == "short" and ch in _SHORT:
            out.append(_SHORT[ch])
        elif style in ("u", "U") or ch in '"\\' or code < 32:
            units = (
                [code] if code <= 0xFFFF else [0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)]
            )
            out.extend(f"\\u{u:04X}" if style == "U" else f"\\u{u:04x}" for u in units)
        else:
            out.append(ch)
    return "".join(out) + '"'


@st.composite
def json_text(draw, value) -> str:
    """``value`` serialized with random whitespace between tokens and random string escapes."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, Number):
        return value.text
    if isinstance(value, str):
        return draw(json_string(value))
    if isinstance(value, list):
        return "[" + draw(GAP) + ",".join(draw(json_text(v)) + draw(GAP) for v in value) + "]"
    members = [draw(json_string(k)) + draw(GAP) + ":" + draw(GAP) + draw(json_text(v)) + draw(GAP) for k, v in value]
    return "{" + draw(GAP) + ("," + draw(GAP)).join(members) + "}"


@st.composite
def ndjson_line(draw) -> str:
    if draw(st.integers(0, 19)) == 0:  # now and then a line that is valid JSON but no object, or blank
        return draw(st.sampled_from(["[1,2]", '"s"', "3", "null", "", "   ", "\t\r"]))
    pairs = tuple(draw(st.lists(st.tuples(KEY, VALUE), max_size=6)))
    if pairs and draw(st.booleans()):  # a repeated key, maybe spelled another way
        pairs += ((draw(st.sampled_from([k for k, _ in pairs])), draw(VALUE)),)
    return draw(GAP) + draw(json_text(pairs)) + draw(GAP)


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a raw lone surrogate: bytes that are not UTF-8


FILE = st.builds(
    lambda lines, end: encode("\n".join(lines) + end),
    st.lists(ndjson_line(), min_size=1, max_size=8),
    st.sampled_from(["", "\n"]),
)
MUTATION_BYTES = st.binary(max_size=3) | st.sampled_from(
    [
        b"{",
        b"}",
        b"[",
        b"]",
        b":",
        b",",
        b'"',
        b"\\",
        b" ",
        b"\n",
        b"\\u",
        b"\\ud800",
        b'"a"',
        b'"a":',
        b"tru",
        b"-",
        b"1e",
        b".",
        b"\xff",
        b"\xc3",
        b"\xed\xa0\x80",
        codecs.BOM_UTF8,
        b"NaN",
        b"[" * 3,
        b"}}",
    ]
)


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """``data`` after a few byte edits: delete, insert, replace, truncate (often inside an object)."""
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["delete", "insert", "replace", "truncate"]))
        if edit == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 4)) :]
        elif edit == "insert":
            data = data[:at] + draw(MUTATION_BYTES) + data[at:]
        elif edit == "replace":
            data = data[:at] + draw(MUTATION_BYTES) + data[at + 1 :]
        else:
            data = data[:at]
    return data


@contextlib.contextmanager
def sparse_columns(sparse: bool):
    """Every column sparse (the layout a file of ever-new keys gets) when ``sparse``; the usual layout otherwise."""
    usual = ndjson_text.DENSE_CELLS_PER_MEMBER
    ndjson_text.DENSE_CELLS_PER_MEMBER = 0 if sparse else usual
    try:
        yield
    finally:
        ndjson_text.DENSE_CELLS_PER_MEMBER = usual


def check(data: bytes, sparse: bool) -> None:
    with sparse_columns(sparse):
        check_file(data)


@QUICK
@given(FILE, st.booleans())
def test_generated_files_read_as_json_loads_reads_them(data, sparse):
    check(data, sparse)


@QUICK
@given(FILE.flatmap(mutated), st.booleans())
def test_mutated_files_keep_or_reject_each_line_as_json_loads_does_and_never_raise(data, sparse):
    check(data, sparse)


@pytest.mark.sweep
@SWEEP
@given(FILE, st.booleans())
def test_generated_files_sweep(data, sparse):
    check(data, sparse)


@pytest.mark.sweep
@SWEEP
@given(FILE.flatmap(mutated), st.booleans())
def test_mutated_files_sweep(data, sparse):
    check(data, sparse)


# --------------------------------------------------------------------------- the cases issue 23 found


@pytest.mark.parametrize("bad", [b'{"a"}', b'{"a" "b"}', b'{"foo":"bar","a"}', b'{"a":1,"b" }'])
def test_a_key_without_its_colon_is_a_rejected_line_and_the_rest_merges(bad):
    parsed = parse_ndjson("file:///k.ndjson", b'{"id":1,"name":"x"}\n' + bad + b'\n{"id":3}\n')
    with pytest.raises(json.JSONDecodeError) as error:
        json.loads(bad)
    assert [(r["line_number"], r["error"]) for r in parsed.rejects] == [(2, str(error.value))]  # as for any bad line
    assert parsed.table.to_pylist() == [{"id": "1", "name": "x"}, {"id": "3", "name": None}]


def test_a_file_cut_right_after_a_key_rejects_its_last_line():
    parsed = parse_ndjson("file:///cut.ndjson", b'{"id":1,"name":"x"}\n{"id":2,"name"')
    assert [(r["line_number"], r["error"]) for r in parsed.rejects] == [
        (2, "Expecting ':' delimiter: line 1 column 15 (char 14)")
    ]
    assert parsed.table.to_pylist() == [{"id": "1", "name": "x"}]


def test_a_key_with_a_lone_surrogate_is_a_rejected_line_its_twin_spelled_validly_is_a_column():
    data = b'{"\\ud800x":2}\n{"a":1,"\\ud83d\\udd11":"k"}\n{"b":{"\\ud800":"\\udc00"}}\n{"a":2,"\\udc00":null}\n'
    parsed = parse_ndjson("file:///s.ndjson", data)
    assert [(r["line_number"], r["error"]) for r in parsed.rejects] == [
        (1, "a key holds a lone surrogate: not valid Unicode"),
        (4, "a key holds a lone surrogate: not valid Unicode"),
    ]
    # nested keys and strings are JSON text kept as written, escapes and all: valid UTF-8 as they stand
    assert parsed.table.to_pylist() == [
        {"a": "1", "🔑": "k", "b": None},
        {"a": None, "🔑": None, "b": '{"\\ud800":"\\udc00"}'},
    ]
    json.loads(data.splitlines()[0])  # json.loads takes it: refusing it is the policy, in the module doc


# --------------------------------------------------------------------------- memory: files of ever-new keys


@pytest.mark.parametrize("lines", [5000, pytest.param(20000, marks=pytest.mark.sweep)])
def test_a_file_whose_every_line_brings_a_new_key_costs_memory_per_value_not_rows_times_columns(lines):
    """Before: offsets and validity for every row of every column, 9 bytes × lines² (326 MB traced for 5000 lines,
    against this bound of 20 MB; now about 1.2 KB a line)."""
    data = b"".join(b'{"id":%d,"key_%d":"v%d"}\n' % (i, i, i) for i in range(lines))
    parse_ndjson("file:///w.ndjson", data[:100])  # compiled and loaded outside the measure (the cut line: a reject)
    bound = 4096 * lines  # bytes: in proportion to the values, whatever the number of columns
    arrow_before = pa.total_allocated_bytes()
    tracemalloc.start()
    try:
        parsed = parse_ndjson("file:///w.ndjson", data)
        peak = tracemalloc.get_traced_memory()[1]  # numpy and Numba arrays, Python objects
    finally:
        tracemalloc.stop()
    assert peak < bound, peak
    assert pa.total_allocated_bytes() - arrow_before < bound
    assert parsed.table.get_total_buffer_size() < bound  # the table too: sparse columns are slices of one null column
    assert parsed.table.num_columns == lines + 1 and parsed.rows == lines
    assert parsed.table.slice(lines - 2).to_pylist()[-1] == {
        "id": str(lines - 1),
        **{f"key_{i}": None for i in range(lines - 1)},
        f"key_{lines - 1}": f"v{lines - 1}",
    }
