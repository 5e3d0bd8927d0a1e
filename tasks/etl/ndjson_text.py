"""NDJSON to a table of strings that keeps every value as written: one vectorised pass per file, no Python per row.

What "as written" means (the README's "What the merged Parquet holds"):
- a top-level string is its decoded value, byte for byte (``"caf\\u00e9"`` → ``café``);
- a top-level number, ``true`` or ``false`` is its JSON text exactly as in the line (``1.50`` stays ``1.50``,
  ``9007199254740993`` stays ``9007199254740993``, ``1e3`` stays ``1e3``); ``null`` and a missing key are null;
- an object or array is its JSON text as written, with only the whitespace between tokens removed: numbers,
  string escapes and key order inside it stay exactly as in the line;
- keys are decoded (escapes, any script); two spellings of one key (``"é"``, ``"\\u00e9"``) are one column, and a key
  that appears twice in a line keeps its last value (as ``json.loads`` does).

How: pyarrow's C++ JSON parser validates the whole file (no columns built); numpy finds, on the byte buffer, the
unescaped quotes, the structural characters outside strings and their depth, hence each top-level member's key
and value spans; Arrow ``take`` gathers the spans into string columns. A line that is not a JSON object (or holds
``NaN``/``Infinity``, or invalid UTF-8) becomes a reject with its line number; the others still merge.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

QUOTE, BACKSLASH, OPEN_OBJ, CLOSE_OBJ, OPEN_ARR, CLOSE_ARR, COLON, COMMA, NEWLINE, NOT_JSON = range(1, 11)
_CLASS = np.zeros(256, np.uint8)
for _char, _kind in {'"': QUOTE, "\\": BACKSLASH, "{": OPEN_OBJ, "}": CLOSE_OBJ, "[": OPEN_ARR, "]": CLOSE_ARR,
                     ":": COLON, ",": COMMA, "\n": NEWLINE, "N": NOT_JSON, "I": NOT_JSON}.items():
    _CLASS[ord(_char)] = _kind
_SPACE = np.zeros(256, bool)
_SPACE[[ord(c) for c in " \t\r\n"]] = True
_CLASS_TABLE = _CLASS.tobytes()  # bytes.translate maps a whole buffer in one C loop (faster than numpy indexing)
_CLASS_OR_SPACE_TABLE = np.where(_SPACE, 255, _CLASS).astype(np.uint8).tobytes()
_VALIDATE = pajson.ParseOptions(explicit_schema=pa.schema([]), unexpected_field_behavior="ignore")
CHECK_LINES = 4096  # lines per group when a file fails validation: good groups stay in C++, bad ones go line by line


@dataclass
class Parsed:
    """One file: its string columns (first-seen order), how many good lines, and the rejected ones."""

    table: pa.Table | None
    rows: int
    rejects: list[dict[str, Any]] = field(default_factory=list)


def _line_bounds(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (excluding the newline) of every line."""
    ends = np.flatnonzero(a == 10)
    if len(a) and a[-1] != 10:
        ends = np.append(ends, len(a))
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    return starts, ends.astype(np.int64)


def _trim(a: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spans without leading and trailing JSON whitespace (a few vectorised steps: whitespace runs are short)."""
    start, end = start.copy(), end.copy()
    last = len(a) - 1
    while True:
        step = (start < end) & _SPACE[a[np.minimum(start, last)]]
        if not step.any():
            break
        start += step
    while True:
        step = (end > start) & _SPACE[a[np.maximum(end - 1, 0)]]
        if not step.any():
            break
        end -= step
    return start, end


def _line_error(line: bytes) -> str | None:
    """Why one line is not a JSON object (None when it is): the careful per-line check of a failing group."""
    try:
        record = json.loads(line, parse_constant=_no_constant)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return str(error)[:300]
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    for value in record.values():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return "a string holds a lone surrogate (\\ud800-\\udfff): not valid Unicode"
    return None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _valid(chunk: bytes, longest: int) -> bool:
    """Whether pyarrow's parser accepts every line (objects only); nothing is built."""
    try:
        pajson.read_json(io.BytesIO(chunk), read_options=pajson.ReadOptions(block_size=max(1 << 20, longest + 2)),
                         parse_options=_VALIDATE)
        return True
    except (pa.ArrowInvalid, ValueError):
        return False


def _bad_lines(data: bytes, starts: np.ndarray, ends: np.ndarray, candidates: np.ndarray) -> dict[int, str]:
    """Line index → reason for every non-blank line that is not a JSON object in valid UTF-8."""
    bad: dict[int, str] = {}
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        for i in candidates:  # rare: find the lines with invalid bytes
            try:
                data[starts[i]:ends[i]].decode("utf-8")
            except UnicodeDecodeError as error:
                bad[int(i)] = str(error)[:300]
    longest = int((ends - starts).max()) if len(starts) else 0
    if _valid(data, longest):
        return bad
    for g in range(0, len(candidates), CHECK_LINES):
        group = candidates[g:g + CHECK_LINES]
        if _valid(data[starts[group[0]]:ends[group[-1]]], longest):
            continue
        for i in group:
            if int(i) not in bad and (reason := _line_error(data[starts[i]:ends[i]])):
                bad[int(i)] = reason
    return bad


def _escaped(pos: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Which candidate characters are escaped (preceded by an odd run of backslashes right before them)."""
    escaped = np.zeros(len(pos), bool)
    slash = kind == BACKSLASH
    if not slash.any():
        return escaped
    idx = np.arange(len(pos))
    joined = np.zeros(len(pos), bool)  # this backslash continues the run of the one before it
    joined[1:] = slash[1:] & slash[:-1] & (pos[1:] == pos[:-1] + 1)
    run_start = np.maximum.accumulate(np.where(slash & ~joined, idx, 0))
    run_length = idx - run_start + 1
    after = np.zeros(len(pos), bool)  # the previous candidate is a backslash right before this one
    after[1:] = slash[:-1] & (pos[1:] == pos[:-1] + 1)
    escaped[1:] = after[1:] & (run_length[:-1] % 2 == 1)
    return escaped


def _outside_strings(a: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions and kinds of structural characters outside strings, and of backslashes (inside strings)."""
    cls = np.frombuffer(a.translate(_CLASS_TABLE), np.uint8)
    pos = np.flatnonzero(cls)
    kind = cls[pos]
    quote = (kind == QUOTE) & ~_escaped(pos, kind)
    inside = (np.cumsum(quote, dtype=np.uint8) & 1).astype(bool)  # uint8 wraps: the parity stays right
    keep = ~inside & ~quote & (kind != BACKSLASH)
    return pos[keep], kind[keep], pos[kind == BACKSLASH]


def _compact(values: pa.Array) -> pa.Array:
    """Nested JSON texts (a large_binary array without nulls) without the whitespace between tokens."""
    offsets = np.frombuffer(values.buffers()[1], np.int64)[values.offset:values.offset + len(values) + 1]
    data = np.frombuffer(values.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
    offsets = offsets - offsets[0]
    cls = np.frombuffer(data.tobytes().translate(_CLASS_OR_SPACE_TABLE), np.uint8)
    pos = np.flatnonzero(cls)
    kind = cls[pos]
    if not (kind == 255).any():
        return values
    kind = np.where(kind == 255, 0, kind)
    quote = (kind == QUOTE) & ~_escaped(pos, kind)
    inside = (np.cumsum(quote, dtype=np.uint8) & 1).astype(bool)
    drop = pos[(kind == 0) & ~inside]
    keep = np.ones(len(data), bool)
    keep[drop] = False
    new_offsets = offsets - np.searchsorted(drop, offsets)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(values), [None, pa.py_buffer(new_offsets), pa.py_buffer(data[keep])]
    )


def _decode_strings(raw: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Escaped string contents decoded (one ``json.loads`` of them all), and which hold a lone surrogate."""
    texts = json.loads(b'["' + b'","'.join(raw.to_pylist()) + b'"]')
    broken = np.zeros(len(texts), bool)
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            broken[i], texts[i] = True, None
    return pa.array(texts, pa.large_string()).view(pa.large_binary()), broken


def _key_names(raw_keys: pa.Array, rename: Callable[[str], str]) -> list[str]:
    """Decoded key names (escapes decoded, metadata-like names renamed)."""
    names = []
    for raw in raw_keys.to_pylist():
        name = json.loads(b'"' + raw + b'"') if b"\\" in raw else raw.decode("utf-8")
        names.append(rename(name))
    return names


def _scan(buf: bytes, rename: Callable[[str], str]) -> tuple[pa.Table, int, dict[int, str]]:
    """Columns of a buffer of valid object lines; also good-line index → reason for lines found bad here."""
    a = np.frombuffer(buf, np.uint8)
    pos, kind, slashes = _outside_strings(buf)
    newline = kind == NEWLINE
    line_of = np.cumsum(newline) - newline  # the line of each character
    if (kind == NOT_JSON).any():
        return pa.table({}), 0, {int(i): "NaN or Infinity is not JSON" for i in np.unique(line_of[kind == NOT_JSON])}
    lines = int(newline.sum())
    structural = ~newline
    line_of = line_of[structural]
    pos, kind = pos[structural], kind[structural]
    delta = np.zeros(len(kind), np.int32)
    delta[(kind == OPEN_OBJ) | (kind == OPEN_ARR)] = 1
    delta[(kind == CLOSE_OBJ) | (kind == CLOSE_ARR)] = -1
    depth = np.cumsum(delta)  # after each character
    opens = (kind == OPEN_OBJ) & (depth == 1)
    per_line = np.bincount(line_of[opens], minlength=lines)
    if (per_line != 1).any():  # pyarrow reads `{..}{..}` on one line as two rows; json.loads calls it extra data
        return pa.table({}), 0, {int(i): "more than one JSON value on the line" for i in np.flatnonzero(per_line != 1)}
    top = opens | ((kind == CLOSE_OBJ) & (depth == 0)) | (((kind == COLON) | (kind == COMMA)) & (depth == 1))
    d_pos, d_kind, d_open = pos[top], kind[top], opens[top]
    rows = int(d_open.sum())
    line = np.cumsum(d_open) - 1
    colon = np.flatnonzero(d_kind == COLON)
    member_line = line[colon]
    key_start, key_end = _trim(a, d_pos[colon - 1] + 1, d_pos[colon])
    value_start, value_end = _trim(a, d_pos[colon] + 1, d_pos[colon + 1])
    first = a[np.minimum(value_start, len(a) - 1)]
    is_string = first == ord('"')
    is_null = first == ord("n")
    is_nested = (first == ord("{")) | (first == ord("["))
    key_start, key_end = key_start + 1, key_end - 1
    value_start, value_end = value_start + is_string, value_end - is_string
    # every key and value span as one zero-copy array over the buffer: gap, key, gap, value, gap, key, ...
    bounds = np.empty(4 * len(colon) + 2, np.int64)
    bounds[0], bounds[-1] = 0, len(a)
    bounds[1:-1:4], bounds[2:-1:4], bounds[3:-1:4], bounds[4:-1:4] = key_start, key_end, value_start, value_end
    spans = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), pa.py_buffer(buf)])
    member = np.arange(len(colon), dtype=np.int64)
    element = 4 * member + 3
    extra: list[pa.Array] = []
    escapes = np.zeros(len(colon), bool)
    if len(slashes):
        escapes = np.searchsorted(slashes, value_end) > np.searchsorted(slashes, value_start)
    replace = np.flatnonzero(is_string & escapes)
    base = len(spans)
    if len(replace):
        decoded, broken = _decode_strings(spans.take(pa.array(element[replace])))
        if broken.any():
            return pa.table({}), 0, {int(member_line[replace[i]]): "a string holds a lone surrogate: not valid Unicode"
                                     for i in np.flatnonzero(broken)}
        element[replace] = base + np.arange(len(replace))
        base += len(replace)
        extra.append(decoded)
    nested = np.flatnonzero(is_nested)
    if len(nested):
        compact = _compact(spans.take(pa.array(element[nested])))
        element[nested] = base + np.arange(len(nested))
        extra.append(compact)
    source = pa.concat_arrays([spans, *extra]) if extra else spans
    keys_raw = pc.dictionary_encode(spans.take(pa.array(4 * member + 1)))
    names = _key_names(keys_raw.dictionary, rename)
    column_of_name = {name: i for i, name in enumerate(dict.fromkeys(names))}
    column = np.array([column_of_name[n] for n in names], np.int64)[keys_raw.indices.to_numpy(zero_copy_only=False)] \
        if len(names) else np.zeros(0, np.int64)
    order = np.argsort(column, kind="stable")
    edges = np.searchsorted(column[order], np.arange(len(column_of_name) + 1))
    columns = {}
    for name, c in column_of_name.items():
        chosen = order[edges[c]:edges[c + 1]]
        index = np.full(rows, -1, np.int64)
        index[member_line[chosen]] = np.where(is_null[chosen], -1, element[chosen])  # a repeated key: the last wins
        taken = source.take(pa.array(index, mask=index < 0))
        columns[name] = taken.view(pa.large_string()).cast(pa.string())
    if not columns:  # only empty objects: rows without columns
        return pa.table({"rows": pa.nulls(rows, pa.string())}).drop_columns(["rows"]), rows, {}
    return pa.table(columns), rows, {}


def parse_ndjson(url: str, data: bytes, rename: Callable[[str], str] = str) -> Parsed:
    """Every non-blank line of an NDJSON file as strings (see the module doc); bad lines become rejects."""
    a = np.frombuffer(data, np.uint8)
    starts, ends = _line_bounds(a)
    s, e = _trim(a, starts, ends)
    lines = np.flatnonzero(e > s)  # blank lines are skipped, not rejected
    bad = _bad_lines(data, starts, ends, lines) if len(lines) else {}
    while True:
        good = lines[~np.isin(lines, np.fromiter(bad, np.int64, len(bad)))] if bad else lines
        if not len(good):
            table, rows = None, 0
            break
        if len(good) == len(starts) and (not len(data) or data[-1:] == b"\n"):
            buf = data
        else:
            buf = b"".join(data[starts[i]:ends[i]] + b"\n" for i in good.tolist())
        table, rows, found = _scan(buf, rename)
        if not found:
            break
        bad.update({int(good[i]): reason for i, reason in found.items()})
    rejects = [
        {"source_file": url, "line_number": int(i) + 1, "error": reason,
         "line": data[starts[i]:ends[i]].decode("utf-8", errors="replace")[:10000]}
        for i, reason in sorted(bad.items())
    ]
    return Parsed(table if rows else None, rows, rejects)
