"""NDJSON to a table of strings that keeps every value as written: one compiled pass per file, no Python per row.

What "as written" means (the README's "What the merged Parquet holds"):
- a top-level string is its decoded value, byte for byte (``"caf\\u00e9"`` → ``café``);
- a top-level number, ``true`` or ``false`` is its JSON text exactly as in the line (``1.50`` stays ``1.50``,
  ``9007199254740993`` stays ``9007199254740993``, ``1e3`` stays ``1e3``); ``null`` and a missing key are null;
- an object or array is its JSON text as written, with only the whitespace between tokens removed: numbers,
  string escapes and key order inside it stay exactly as in the line;
- keys are decoded (escapes, any script); two spellings of one key (``"é"``, ``"\\u00e9"``) are one column, and a key
  that appears twice in a line keeps its last value (as ``json.loads`` does).

How: pyarrow's C++ JSON parser validates the whole file (no columns built); a Numba-compiled pass over the bytes
(``_members``, GIL released, so a part's files parse on all cores) finds each top-level member's key and value
spans and packs nested values without their whitespace; Arrow ``take`` gathers the spans into string columns. A
line that is not a JSON object (or holds ``NaN``/``Infinity``, or invalid UTF-8) becomes a reject with its line
number; the others still merge.
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
from numba import njit

STRING, NULL, NESTED, SCALAR = range(4)  # a member's value
KEY_ESCAPED, VALUE_ESCAPED = 1, 2  # a member's flags: its key or string value holds a backslash escape
PROBLEMS = {1: "NaN or Infinity is not JSON", 2: "more than one JSON value on the line", 3: "no JSON object on the line"}
_VALIDATE = pajson.ParseOptions(explicit_schema=pa.schema([]), unexpected_field_behavior="ignore")
CHECK_LINES = 4096  # lines per group when a file fails validation: good groups stay in C++, bad ones go line by line
# cache: a worker compiles once, not per process; boundscheck: an IndexError, never a stray read, costs ~3%
_COMPILED = {"nogil": True, "cache": True, "boundscheck": True}


@dataclass
class Parsed:
    """One file: its string columns (first-seen order), how many good lines, and the rejects."""

    table: pa.Table | None
    rows: int
    rejects: list[dict[str, Any]] = field(default_factory=list)


@njit(**_COMPILED)
def _is_space(b: int) -> bool:
    return b == 32 or b == 9 or b == 13 or b == 10


def _lines(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start and end (without the newline) of every line, and whether it holds more than whitespace."""
    ends = np.flatnonzero(a == 10)
    if len(a) and a[-1] != 10:
        ends = np.append(ends, len(a))
    starts = np.concatenate((np.zeros(1, np.int64), ends[:-1] + 1)) if len(ends) else ends
    return starts, ends, _filled(a, starts, ends)


@njit(**_COMPILED)
def _filled(a: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each line holds more than whitespace (a look at its first bytes, mostly)."""
    filled = np.empty(len(starts), np.bool_)
    for line in range(len(starts)):
        i = starts[line]
        while i < ends[line] and _is_space(a[i]):
            i += 1
        filled[line] = i < ends[line]
    return filled


@njit(**_COMPILED)
def _string_end(a: np.ndarray, i: int) -> tuple[int, bool]:
    """The closing quote of the string whose contents start at ``i``, and whether an escape lies between."""
    escaped = False
    while a[i] != 34:
        if a[i] == 92:
            escaped = True
            i += 2
        else:
            i += 1
    return i, escaped


@njit(**_COMPILED)
def _members(a: np.ndarray, most: int, lines: int):
    """Every top-level member of a buffer of validated object lines, each line ending in a newline.

    Per member: its line; its key's span (inside the quotes), as bounds with gaps between keys (one zero-copy
    Arrow array); its value's span: in ``a`` (a string's inside the quotes), or in ``packed`` for a nested value
    (its text without whitespace between tokens); its kind and escape flags. Per line: how many objects begin on
    it and a problem code (``PROBLEMS``), 0 if none.
    """
    n = len(a)
    line_of = np.empty(most, np.int64)
    key = np.empty(2 * most + 2, np.int64)  # gap, key, gap, key, ...: bounds of one zero-copy Arrow array
    start = np.empty(most, np.int64)
    end = np.empty(most, np.int64)
    kind = np.empty(most, np.uint8)
    flags = np.empty(most, np.uint8)
    packed = np.empty(n, np.uint8)
    objects = np.zeros(lines + 1, np.int64)
    problem = np.zeros(lines + 1, np.uint8)
    key[0] = 0
    m, p, line, i = 0, 0, 0, 0
    while i < n:
        b = a[i]
        if b == 10:
            line += 1
        if b != 123:  # whitespace or a newline outside objects
            i += 1
            continue
        objects[line] += 1
        if objects[line] > 1:  # pyarrow reads `{..}{..}` as two rows; json.loads calls it extra data
            problem[line] = 2
        i += 1
        while True:
            while _is_space(a[i]):
                i += 1
            if a[i] == 125:  # }
                i += 1
                break
            if a[i] == 44:  # ,
                i += 1
                while _is_space(a[i]):
                    i += 1
            line_of[m] = line
            key[2 * m + 1] = i + 1
            i, escaped = _string_end(a, i + 1)
            key[2 * m + 2] = i
            flags[m] = KEY_ESCAPED if escaped else 0
            i += 1
            while a[i] != 58:  # :
                i += 1
            i += 1
            while _is_space(a[i]):
                i += 1
            b = a[i]
            if b == 34:  # "
                start[m] = i + 1
                i, escaped = _string_end(a, i + 1)
                end[m] = i
                kind[m] = STRING
                if escaped:
                    flags[m] |= VALUE_ESCAPED
                i += 1
            elif b == 123 or b == 91:  # { [
                start[m] = p
                depth = 0
                while True:
                    c = a[i]
                    if c == 34:  # a string inside: copied as written, escapes and spaces included
                        j, escaped = _string_end(a, i + 1)
                        for k in range(i, j + 1):
                            packed[p] = a[k]
                            p += 1
                        i = j + 1
                        continue
                    i += 1
                    if _is_space(c):
                        continue
                    packed[p] = c
                    p += 1
                    if c == 123 or c == 91:
                        depth += 1
                    elif c == 125 or c == 93:
                        depth -= 1
                        if depth == 0:
                            break
                    elif c == 78 or c == 73:  # N(aN), I(nfinity): pyarrow reads them, JSON has none
                        problem[line] = 1
                end[m] = p
                kind[m] = NESTED
            else:
                start[m] = i
                while not (a[i] == 44 or a[i] == 125 or _is_space(a[i])):
                    if a[i] == 78 or a[i] == 73:
                        problem[line] = 1
                    i += 1
                end[m] = i
                kind[m] = NULL if b == 110 else SCALAR
            m += 1
    key[2 * m + 1] = n
    return line_of[:m], key[:2 * m + 2], start[:m], end[:m], kind[:m], flags[:m], packed[:p], objects[:line], problem[:line]


@njit(**_COMPILED)
def _gather(rows: int, columns: int, column: np.ndarray, line_of: np.ndarray, start: np.ndarray, end: np.ndarray,
            source: np.ndarray, null: np.ndarray, buf: np.ndarray, packed: np.ndarray, decoded: np.ndarray):
    """Every column's values in one data buffer: offsets (``columns`` runs of ``rows + 1``) and validity.

    Member ``j`` goes to row ``line_of[j]`` of column ``column[j]``, its bytes ``start[j]:end[j]`` of ``buf``,
    ``packed`` or ``decoded`` (``source[j]`` 0, 1, 2), null if ``null[j]``; a key repeated in a line: the last wins.
    """
    m = len(column)
    first = np.zeros(columns + 1, np.int64)  # members sorted by column, stably (so by line within a column)
    for j in range(m):
        first[column[j] + 1] += 1
    for c in range(columns):
        first[c + 1] += first[c]
    order = np.empty(m, np.int64)
    fill = first[:columns].copy()
    for j in range(m):
        order[fill[column[j]]] = j
        fill[column[j]] += 1
    offsets = np.zeros(columns * (rows + 1), np.int64)
    valid = np.zeros(columns * rows, np.bool_)
    size = np.zeros(rows, np.int64)
    total = 0
    for c in range(columns):
        for k in range(first[c], first[c + 1]):
            j = order[k]
            valid[c * rows + line_of[j]] = not null[j]
            size[line_of[j]] = 0 if null[j] else end[j] - start[j]
        base = c * (rows + 1)
        offsets[base] = total
        for r in range(rows):
            total += size[r]
            offsets[base + r + 1] = total
            size[r] = 0
    data = np.empty(total, np.uint8)
    for c in range(columns):
        base = c * (rows + 1)
        for k in range(first[c], first[c + 1]):
            j = order[k]
            if null[j] or (k + 1 < first[c + 1] and line_of[order[k + 1]] == line_of[j]):
                continue  # null, or not the last value of its key in the line
            at = offsets[base + line_of[j]] - start[j]
            if source[j] == 0:  # values are short: a plain loop beats a slice copy
                for i in range(start[j], end[j]):
                    data[at + i] = buf[i]
            elif source[j] == 1:
                for i in range(start[j], end[j]):
                    data[at + i] = packed[i]
            else:
                for i in range(start[j], end[j]):
                    data[at + i] = decoded[i]
    return offsets, valid, data


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
        data.isascii() or data.decode("utf-8")  # ASCII is UTF-8, and far quicker to tell
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


def _decode_strings(raw: list[bytes]) -> tuple[pa.Array, np.ndarray]:
    """Escaped string contents decoded (one ``json.loads`` of them all), and which hold a lone surrogate."""
    texts = json.loads(b'["' + b'","'.join(raw) + b'"]')
    broken = np.zeros(len(texts), bool)
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            broken[i], texts[i] = True, None
    return pa.array(texts, pa.large_string()), broken


def _key_names(raw_keys: pa.Array, rename: Callable[[str], str]) -> list[str]:
    """Decoded key names (escapes decoded, metadata-like names renamed)."""
    names = []
    for raw in raw_keys.to_pylist():
        name = json.loads(b'"' + raw + b'"') if b"\\" in raw else raw.decode("utf-8")
        names.append(rename(name))
    return names


def _binary(bounds: np.ndarray, data: Any) -> pa.Array:
    """A zero-copy Arrow array over ``data`` whose element ``i`` is ``data[bounds[i]:bounds[i + 1]]``."""
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), pa.py_buffer(data)])


def _scan(buf: bytes, rename: Callable[[str], str]) -> tuple[pa.Table, int, dict[int, str]]:
    """Columns of a buffer of valid object lines; also good-line index → reason for lines found bad here."""
    a = np.frombuffer(buf, np.uint8)
    # a member has a colon: counting them (a C loop) beats a generous bound, whose pages cost to map and unmap
    line_of, key_bounds, start, end, kind, flags, packed, objects, problem = _members(a, buf.count(b":"), buf.count(b"\n"))
    problem = np.where(objects == 0, np.uint8(3), problem)
    if problem.any():
        return pa.table({}), 0, {int(i): PROBLEMS[int(problem[i])] for i in np.flatnonzero(problem)}
    rows = len(objects)
    source = (kind == NESTED).astype(np.uint8)
    decoded = np.zeros(0, np.uint8)
    escaped = np.flatnonzero((kind == STRING) & (flags & VALUE_ESCAPED).astype(bool))
    if len(escaped):
        texts, broken = _decode_strings([buf[start[j]:end[j]] for j in escaped.tolist()])
        if broken.any():
            return pa.table({}), 0, {int(line_of[escaped[i]]): "a string holds a lone surrogate: not valid Unicode"
                                     for i in np.flatnonzero(broken)}
        bounds = np.frombuffer(texts.buffers()[1], np.int64)[: len(texts) + 1]
        decoded = np.frombuffer(texts.buffers()[2], np.uint8) if texts.buffers()[2] is not None else decoded
        source[escaped], start[escaped], end[escaped] = 2, bounds[:-1], bounds[1:]
    keys_raw = pc.dictionary_encode(_binary(key_bounds, buf).take(pa.array(2 * np.arange(len(kind), dtype=np.int64) + 1)))
    names = _key_names(keys_raw.dictionary, rename)
    column_of_name = {name: i for i, name in enumerate(dict.fromkeys(names))}
    if not column_of_name:  # only empty objects: rows without columns
        return pa.table({"rows": pa.nulls(rows, pa.string())}).drop_columns(["rows"]), rows, {}
    column = np.array([column_of_name[n] for n in names], np.int64)[keys_raw.indices.to_numpy(zero_copy_only=False)]
    offsets, valid, data = _gather(rows, len(column_of_name), column, line_of, start, end, source, kind == NULL, a,
                                   packed, decoded)
    wide = len(data) >= 2**31  # string offsets are int32: past that, large_string, then a cast that says which column
    offsets = offsets if wide else offsets.astype(np.int32)
    data_buffer = pa.py_buffer(data)
    columns = {}
    for name, c in column_of_name.items():
        present = valid[c * rows:(c + 1) * rows]
        nulls = rows - int(np.count_nonzero(present))
        bitmap = pa.py_buffer(np.packbits(present, bitorder="little")) if nulls else None
        column_offsets = pa.py_buffer(offsets[c * (rows + 1):(c + 1) * (rows + 1)])
        array = pa.Array.from_buffers(pa.large_string() if wide else pa.string(), rows, [bitmap, column_offsets, data_buffer], nulls)
        columns[name] = array.cast(pa.string()) if wide else array
    return pa.table(columns), rows, {}


def parse_ndjson(url: str, data: bytes, rename: Callable[[str], str] = str) -> Parsed:
    """Every non-blank line of an NDJSON file as strings (see the module doc); bad lines become rejects."""
    starts, ends, filled = _lines(np.frombuffer(data, np.uint8))
    lines = np.flatnonzero(filled)  # blank lines are skipped, not rejected
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
