"""NDJSON to a table of strings that keeps every value as written: one compiled pass per file, no Python per row.

What "as written" means (docs/operations.md, "What the merged Parquet holds"):
- a top-level string is its decoded value, byte for byte (``"caf\\u00e9"`` → ``café``);
- a top-level number, ``true`` or ``false`` is its JSON text exactly as in the line (``1.50`` stays ``1.50``,
  ``9007199254740993`` stays ``9007199254740993``, ``1e3`` stays ``1e3``); ``null`` and a missing key are null;
- an object or array is its JSON text as written, with only the whitespace between tokens removed: numbers,
  string escapes and key order inside it stay exactly as in the line;
- keys are decoded (escapes, any script); two spellings of one key (``"é"``, ``"\\u00e9"``) are one column, and a key
  that appears twice in a line keeps its last value (as ``json.loads`` does).

How: one Numba-compiled pass over the bytes (``_members``; GIL released, so a part's files parse on all cores)
checks every line against ``json.loads``'s grammar, finds each top-level member's key and value spans and packs
nested values without their whitespace; a second (``_gather``) copies the spans into string columns, its memory
following the values, not rows × columns (a file whose every line brings new keys gets sparse columns: runs of
values between slices of one all-null column). A line that is not a JSON object (or holds ``NaN``/``Infinity``,
invalid UTF-8, values nested deeper than ``MAX_DEPTH``, or a top-level key or string value with a lone surrogate
escape such as ``"\\ud800"``: Arrow and Parquet need UTF-8, column names included) becomes a reject with its line
number and ``json.loads``'s reason (or the rule it breaks); the others still merge.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from tasks.core.errors import RefusedInput

STRING, NULL, NESTED, SCALAR = range(4)  # a member's value
KEY_ESCAPED, VALUE_ESCAPED = 1, 2  # a member's flags: its key or string value holds a backslash escape
NOT_JSON, MANY_VALUES, TOO_DEEP = 1, 2, 3  # a line's problem (its reason: ``_line_error``)
DENSE_CELLS_PER_MEMBER = 32  # past rows × columns of this many per value, the sparsest columns are sparse
MAX_DEPTH = 512  # nesting levels a value may have (json.loads itself stops near 1000, with a RecursionError)
# cache: a worker compiles once, not per process; boundscheck: an IndexError, never a stray read, costs ~3%
_COMPILED = {"nogil": True, "cache": True, "boundscheck": True}


KeyCheck = Callable[[list[str]], "tuple[str, int] | None"]  # a file's columns → (why refused, which key) or None


class KeysRefused(RefusedInput):
    """A file whose top-level keys cannot all be columns (too many, or a name a column cannot have): the whole file
    is refused with the reason; ``line`` is the index, in the scanned buffer, of the line to name (None: none)."""

    def __init__(self, reason: str, line: int | None = None) -> None:
        super().__init__(reason)
        self.line = line


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
def _skip_space(a: np.ndarray, i: int) -> int:
    """Past spaces, tabs and carriage returns (a newline ends the line: every scan stops at it)."""
    while a[i] == 32 or a[i] == 9 or a[i] == 13:
        i += 1
    return i


@njit(**_COMPILED)
def _string_end(a: np.ndarray, i: int) -> tuple[int, bool]:
    """The closing quote of a string whose contents start at ``i`` (-1 if invalid JSON), and whether it has escapes."""
    escaped = False
    while True:
        c = a[i]
        if c == 34:
            return i, escaped
        if c < 32:  # a control character, or the line's end: the string is not closed
            return -1, escaped
        if c == 92:
            escaped = True
            e = a[i + 1]
            if e == 117:  # \uXXXX
                for k in range(i + 2, i + 6):
                    h = a[k]
                    if not (48 <= h <= 57 or 65 <= h <= 70 or 97 <= h <= 102):
                        return -1, escaped
                i += 6
            elif e == 34 or e == 92 or e == 47 or e == 98 or e == 102 or e == 110 or e == 114 or e == 116:
                i += 2
            else:
                return -1, escaped
        else:
            i += 1


@njit(**_COMPILED)
def _digits_end(a: np.ndarray, i: int) -> int:
    while 48 <= a[i] <= 57:
        i += 1
    return i


@njit(**_COMPILED)
def _scalar_end(a: np.ndarray, i: int) -> int:
    """The end of the number, ``true``, ``false`` or ``null`` starting at ``i``; -1 if there is none."""
    c = a[i]
    if c == 116 or c == 102 or c == 110:  # t f n
        word = (
            (116, 114, 117, 101, 0) if c == 116 else (102, 97, 108, 115, 101) if c == 102 else (110, 117, 108, 108, 0)
        )
        for k in range(5):
            if word[k] == 0:
                return i + k
            if a[i + k] != word[k]:
                return -1
        return i + 5
    if c == 45:  # -
        i += 1
    if a[i] == 48:  # a leading 0 stands alone
        i += 1
    elif 49 <= a[i] <= 57:
        i = _digits_end(a, i)
    else:
        return -1
    if a[i] == 46:  # .
        if not 48 <= a[i + 1] <= 57:
            return -1
        i = _digits_end(a, i + 1)
    if a[i] == 101 or a[i] == 69:  # e E
        i += 1
        if a[i] == 43 or a[i] == 45:
            i += 1
        if not 48 <= a[i] <= 57:
            return -1
        i = _digits_end(a, i)
    return i


@njit(**_COMPILED)
def _nested_end(a: np.ndarray, i: int, packed: np.ndarray, p: int, stack: np.ndarray) -> tuple[int, int]:
    """Check the object or array starting at ``i`` and copy it to ``packed[p:]`` without whitespace between tokens.

    Returns its end and the new ``p``; the end is -1 when it is not valid JSON, -2 when nested deeper than
    ``len(stack)`` levels. The grammar is ``json.loads``'s, less ``NaN`` and ``Infinity``.
    """
    VALUE, VALUE_OR_CLOSE, KEY, KEY_OR_CLOSE, COLON, COMMA_OR_CLOSE = 0, 1, 2, 3, 4, 5
    depth, state = 0, VALUE
    while True:
        c = a[i]
        if c == 32 or c == 9 or c == 13:
            i += 1
            continue
        closing = (c == 125 and (state == KEY_OR_CLOSE or state == COMMA_OR_CLOSE)) or (
            c == 93 and (state == VALUE_OR_CLOSE or state == COMMA_OR_CLOSE)
        )
        if closing:
            if stack[depth - 1] != (123 if c == 125 else 91):
                return -1, p
            packed[p] = c
            p += 1
            i += 1
            depth -= 1
            if depth == 0:
                return i, p
            state = COMMA_OR_CLOSE
        elif state == VALUE or state == VALUE_OR_CLOSE:
            if c == 123 or c == 91:
                if depth == len(stack):
                    return -2, p
                stack[depth] = c
                depth += 1
                packed[p] = c
                p += 1
                i += 1
                state = KEY_OR_CLOSE if c == 123 else VALUE_OR_CLOSE
                continue
            if c == 34:
                j, _ = _string_end(a, i + 1)
                j += 1 if j >= 0 else 0
            else:
                j = _scalar_end(a, i)
            if j < 0:
                return -1, p
            for k in range(i, j):  # a string keeps its escapes and spaces as written
                packed[p] = a[k]
                p += 1
            i = j
            state = COMMA_OR_CLOSE
        elif state == KEY or state == KEY_OR_CLOSE:
            if c != 34:
                return -1, p
            j, _ = _string_end(a, i + 1)
            if j < 0:
                return -1, p
            for k in range(i, j + 1):
                packed[p] = a[k]
                p += 1
            i = j + 1
            state = COLON
        elif state == COLON:
            if c != 58:
                return -1, p
            packed[p] = c
            p += 1
            i += 1
            state = VALUE
        else:  # COMMA_OR_CLOSE, and not a matching close
            if c != 44:
                return -1, p
            packed[p] = c
            p += 1
            i += 1
            state = KEY if stack[depth - 1] == 123 else VALUE


@njit(**_COMPILED)
def _object_line(a, i, m, p, line, line_of, key, start, end, kind, flags, packed, stack):
    """Check one line holding one JSON object and record its top-level members (see ``_members``).

    Returns where the line's newline is, the new member count and ``packed`` length, and a problem code (0 none).
    """
    i = _skip_space(a, i)
    if a[i] != 123:
        return i, m, p, NOT_JSON
    i = _skip_space(a, i + 1)
    if a[i] == 125:
        i += 1
    else:
        while True:
            if a[i] != 34:
                return i, m, p, NOT_JSON
            j, escaped = _string_end(a, i + 1)
            if j < 0:
                return i, m, p, NOT_JSON
            colon = _skip_space(a, j + 1)
            if a[colon] != 58:  # checked before the member is recorded: the arrays hold one member per colon
                return colon, m, p, NOT_JSON
            line_of[m] = line
            key[2 * m + 1], key[2 * m + 2] = i + 1, j
            flags[m] = KEY_ESCAPED if escaped else 0
            i = _skip_space(a, colon + 1)
            c = a[i]
            if c == 34:  # a string: its contents, escapes decoded later
                j, escaped = _string_end(a, i + 1)
                if j < 0:
                    return i, m, p, NOT_JSON
                start[m], end[m], kind[m] = i + 1, j, STRING
                if escaped:
                    flags[m] |= VALUE_ESCAPED
                i = j + 1
            elif c == 123 or c == 91:  # an object or array: its packed text
                j, q = _nested_end(a, i, packed, p, stack)
                if j < 0:
                    return i, m, p, NOT_JSON if j == -1 else TOO_DEEP
                start[m], end[m], kind[m] = p, q, NESTED
                i, p = j, q
            else:
                j = _scalar_end(a, i)
                if j < 0:
                    return i, m, p, NOT_JSON
                start[m], end[m], kind[m] = i, j, NULL if c == 110 else SCALAR
                i = j
            m += 1
            i = _skip_space(a, i)
            if a[i] == 44:  # ,
                i = _skip_space(a, i + 1)
                continue
            if a[i] == 125:  # }
                i += 1
                break
            return i, m, p, NOT_JSON
    i = _skip_space(a, i)
    if a[i] == 10:
        return i, m, p, 0
    return i, m, p, MANY_VALUES if a[i] == 123 else NOT_JSON


@njit(**_COMPILED)
def _members(a: np.ndarray, most: int, lines: int):
    """Check every line of a buffer (each ending in a newline) and find each object's top-level members.

    Per member: its line; its key's span (inside the quotes), as bounds with gaps between keys (one zero-copy
    Arrow array); its value's span: in ``a`` (a string's inside the quotes), or in ``packed`` for a nested value
    (its text without whitespace between tokens); its kind and escape flags. Per line: a problem code (0 none);
    a line with a problem has no members.
    """
    line_of = np.empty(most, np.int64)
    key = np.empty(2 * most + 2, np.int64)  # gap, key, gap, key, ...: bounds of one zero-copy Arrow array
    start = np.empty(most, np.int64)
    end = np.empty(most, np.int64)
    kind = np.empty(most, np.uint8)
    flags = np.empty(most, np.uint8)
    packed = np.empty(len(a), np.uint8)
    problem = np.zeros(lines, np.uint8)
    stack = np.empty(MAX_DEPTH, np.uint8)
    key[0] = 0
    m, p, i = 0, 0, 0
    for line in range(lines):
        i, m2, p2, code = _object_line(a, i, m, p, line, line_of, key, start, end, kind, flags, packed, stack)
        if code:
            problem[line] = code
            while a[i] != 10:
                i += 1
        else:
            m, p = m2, p2
        i += 1
    key[2 * m + 1] = len(a)
    return line_of[:m], key[: 2 * m + 2], start[:m], end[:m], kind[:m], flags[:m], packed[:p], problem


@njit(**_COMPILED)
def _gather(
    rows: int,
    columns: int,
    column: np.ndarray,
    line_of: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    source: np.ndarray,
    null: np.ndarray,
    buf: np.ndarray,
    packed: np.ndarray,
    decoded: np.ndarray,
    cells_per_member: int,
):
    """Every column's values in one data buffer, in slots: a dense column has a slot per row, a sparse one a slot
    per value. Columns are dense unless rows × columns would pass ``cells_per_member`` per member (a file whose
    lines bring new keys): then the columns with the fewest values are sparse, so memory follows the members.

    Member ``j`` goes to row ``line_of[j]`` of column ``column[j]``, its bytes ``start[j]:end[j]`` of ``buf``,
    ``packed`` or ``decoded`` (``source[j]`` 0, 1, 2), null if ``null[j]``; a key repeated in a line: the last wins.
    Returns the slots' offsets (one more than slots) and validity, the data, each column's first slot (and one
    past the last), whether it is dense, and the rows of each sparse column's slots (``sparse_row`` from
    ``sparse_first[c]`` to ``sparse_first[c + 1]``).
    """
    first, order = _by_column(column, columns)
    dense = _dense_columns(first, rows, len(column), cells_per_member)
    slot_first, sparse_first = _slots(first, order, line_of, dense, rows)
    offsets, valid, sparse_row = _offsets(
        first, order, line_of, start, end, null, dense, slot_first, sparse_first, rows
    )
    data = _copy_values(
        first, order, line_of, start, end, null, dense, slot_first, offsets, source, buf, packed, decoded
    )
    return offsets, valid, data, slot_first, dense, sparse_first, sparse_row


@njit(**_COMPILED)
def _by_column(column: np.ndarray, columns: int):
    """Members sorted by column, stably (so by line within a column): each column's first position and the order."""
    m = len(column)
    first = np.zeros(columns + 1, np.int64)
    for j in range(m):
        first[column[j] + 1] += 1
    for c in range(columns):
        first[c + 1] += first[c]
    order = np.empty(m, np.int64)
    fill = first[:columns].copy()
    for j in range(m):
        order[fill[column[j]]] = j
        fill[column[j]] += 1
    return first, order


@njit(**_COMPILED)
def _dense_columns(first: np.ndarray, rows: int, members: int, cells_per_member: int):
    """Which columns get a slot per row: all, unless rows × columns passes ``cells_per_member`` per member; then the
    columns with the fewest values are sparse until it does not."""
    columns = len(first) - 1
    dense = np.ones(columns, np.bool_)
    cells = columns * rows
    if cells > cells_per_member * members:
        for c in np.argsort(first[1:] - first[:-1], kind="mergesort"):  # the sparsest first
            if cells <= cells_per_member * members:
                break
            dense[c] = False
            cells -= rows
    return dense


@njit(**_COMPILED)
def _slots(first: np.ndarray, order: np.ndarray, line_of: np.ndarray, dense: np.ndarray, rows: int):
    """Each column's first slot (a dense one: a slot per row; a sparse one: a slot per line that has the key) and
    each sparse column's first position in ``sparse_row``."""
    columns = len(dense)
    slot_first = np.zeros(columns + 1, np.int64)
    sparse_first = np.zeros(columns + 1, np.int64)
    for c in range(columns):
        values = 0
        if not dense[c]:  # a slot per line that has the key
            for k in range(first[c], first[c + 1]):
                values += k + 1 == first[c + 1] or line_of[order[k + 1]] != line_of[order[k]]
        slot_first[c + 1] = slot_first[c] + (rows if dense[c] else values)
        sparse_first[c + 1] = sparse_first[c] + values
    return slot_first, sparse_first


@njit(**_COMPILED)
def _replaced(k: int, column_end: int, order: np.ndarray, line_of: np.ndarray) -> bool:
    """Whether member ``order[k]`` is not the last value of its key in its line (a key repeated: the last wins)."""
    return k + 1 < column_end and line_of[order[k + 1]] == line_of[order[k]]


@njit(**_COMPILED)
def _offsets(
    first: np.ndarray,
    order: np.ndarray,
    line_of: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    null: np.ndarray,
    dense: np.ndarray,
    slot_first: np.ndarray,
    sparse_first: np.ndarray,
    rows: int,
):
    """Every slot's offset in the data (one more than slots, the last is the data's size), its validity, and the
    row of each sparse slot; a key repeated in a line: the last value wins."""
    columns = len(dense)
    slots = slot_first[columns]
    offsets = np.empty(slots + 1, np.int64)
    valid = np.zeros(slots, np.bool_)
    sparse_row = np.empty(sparse_first[columns], np.int64)
    size = np.zeros(rows, np.int64)
    total = 0
    for c in range(columns):
        s = slot_first[c]
        if dense[c]:  # members come in line order: the last of a key in a line writes last
            for k in range(first[c], first[c + 1]):
                j = order[k]
                valid[s + line_of[j]] = not null[j]
                size[line_of[j]] = 0 if null[j] else end[j] - start[j]
            for r in range(rows):
                offsets[s + r] = total
                total += size[r]
                size[r] = 0
            continue
        slot = 0
        for k in range(first[c], first[c + 1]):
            if _replaced(k, first[c + 1], order, line_of):
                continue
            j = order[k]
            valid[s + slot] = not null[j]
            offsets[s + slot] = total
            sparse_row[sparse_first[c] + slot] = line_of[j]
            total += 0 if null[j] else end[j] - start[j]
            slot += 1
    offsets[slots] = total
    return offsets, valid, sparse_row


@njit(**_COMPILED)
def _copy_values(
    first: np.ndarray,
    order: np.ndarray,
    line_of: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    null: np.ndarray,
    dense: np.ndarray,
    slot_first: np.ndarray,
    offsets: np.ndarray,
    source: np.ndarray,
    buf: np.ndarray,
    packed: np.ndarray,
    decoded: np.ndarray,
):
    """The data: each slot's value copied from ``buf``, ``packed`` or ``decoded`` (``source`` 0, 1, 2) to its
    offset; nulls and values a later one of the same key in the line replaces are skipped."""
    data = np.empty(offsets[len(offsets) - 1], np.uint8)
    for c in range(len(dense)):
        slot = slot_first[c] - 1
        for k in range(first[c], first[c + 1]):
            if _replaced(k, first[c + 1], order, line_of):
                continue
            j = order[k]
            slot = slot_first[c] + line_of[j] if dense[c] else slot + 1
            if null[j]:
                continue
            at = offsets[slot] - start[j]
            if source[j] == 0:  # values are short: a plain loop beats a slice copy
                for i in range(start[j], end[j]):
                    data[at + i] = buf[i]
            elif source[j] == 1:
                for i in range(start[j], end[j]):
                    data[at + i] = packed[i]
            else:
                for i in range(start[j], end[j]):
                    data[at + i] = decoded[i]
    return data


def _line_error(line: bytes, problem: int = NOT_JSON) -> str:
    """Why one line was refused, in ``json.loads``'s words where it has them."""
    if problem == MANY_VALUES:
        return "more than one JSON value on the line"
    if problem == TOO_DEEP:
        return f"values nested deeper than {MAX_DEPTH} levels"
    try:
        record = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return str(error)[:300]
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    return "not valid JSON"


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _not_utf8(data: bytes, starts: np.ndarray, ends: np.ndarray, candidates: np.ndarray) -> dict[int, str]:
    """Line index → reason for every candidate line that is not valid UTF-8."""
    bad: dict[int, str] = {}
    try:
        data.isascii() or data.decode("utf-8")  # ASCII is UTF-8, and far quicker to tell
    except UnicodeDecodeError:
        for i in candidates:  # rare: find the lines with invalid bytes
            try:
                data[starts[i] : ends[i]].decode("utf-8")
            except UnicodeDecodeError as error:
                bad[int(i)] = str(error)[:300]
    return bad


def _decode_strings(raw: list[bytes]) -> tuple[pa.Array, np.ndarray]:
    """Escaped string contents decoded (one ``json.loads`` of them all), and which hold a lone surrogate."""
    texts = json.loads(b'["' + b'","'.join(raw) + b'"]')
    broken = np.zeros(len(texts), bool)
    for i, text in enumerate(texts):
        if not _is_unicode(text):
            broken[i], texts[i] = True, None
    return pa.array(texts, pa.large_string()), broken


def _is_unicode(text: str) -> bool:
    """Whether ``text`` can be UTF-8 (a ``\\ud800`` escape decodes to a lone surrogate, which cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _key_names(raw_keys: pa.Array, rename: Callable[[str], str]) -> list[str | None]:
    """Decoded key names (escapes decoded, metadata-like names renamed); None for a key with a lone surrogate."""
    names: list[str | None] = []
    for raw in raw_keys.to_pylist():
        if b"\\" not in raw:
            names.append(rename(raw.decode("utf-8")))
            continue
        name = json.loads(b'"' + raw + b'"')
        names.append(rename(name) if _is_unicode(name) else None)
    return names


def _binary(bounds: np.ndarray, data: Any) -> pa.Array:
    """A zero-copy Arrow array over ``data`` whose element ``i`` is ``data[bounds[i]:bounds[i + 1]]``."""
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), pa.py_buffer(data)]
    )


def _spread(values: pa.Array, at_rows: np.ndarray, gaps: pa.Array) -> pa.ChunkedArray:
    """A sparse column: ``values[i]`` at row ``at_rows[i]`` (increasing), null elsewhere, as runs of ``values`` and
    slices of the all-null ``gaps`` (zero-copy, so it costs its values, not its rows)."""
    one_run = at_rows[-1] - at_rows[0] == len(at_rows) - 1  # the usual sparse column: quicker to tell than diff
    breaks = [] if one_run else (np.flatnonzero(np.diff(at_rows) != 1) + 1).tolist()
    chunks, row = [], 0
    for first, last in zip([0] + breaks, breaks + [len(at_rows)]):
        if at_rows[first] > row:
            chunks.append(gaps.slice(row, int(at_rows[first]) - row))
        chunks.append(values.slice(first, last - first))
        row = int(at_rows[last - 1]) + 1
    if row < len(gaps):
        chunks.append(gaps.slice(row))
    return pa.chunked_array(chunks, values.type)


def _scan(
    buf: bytes, rename: Callable[[str], str], check: KeyCheck | None = None
) -> tuple[pa.Table, int, dict[int, str]]:
    """Columns of a buffer of non-blank lines, each ending in a newline; or line index → reason for refused lines.
    KeysRefused when ``check`` refuses the columns (the file's distinct keys, renamed, first-seen order)."""
    a = np.frombuffer(buf, np.uint8)
    lines = buf.count(b"\n")
    # a member has a colon: counting them (a C loop) beats a generous bound, whose pages cost to map and unmap
    line_of, key_bounds, start, end, kind, flags, packed, problem = _members(a, buf.count(b":"), lines)
    if problem.any():
        starts = np.concatenate(([0], np.flatnonzero(a == 10)[:-1] + 1))
        return (
            pa.table({}),
            0,
            {
                int(i): _line_error(buf[starts[i] : buf.index(b"\n", starts[i])], int(problem[i]))
                for i in np.flatnonzero(problem)
            },
        )
    rows = lines
    source = (kind == NESTED).astype(np.uint8)
    decoded = np.zeros(0, np.uint8)
    escaped = np.flatnonzero((kind == STRING) & (flags & VALUE_ESCAPED).astype(bool))
    if len(escaped):
        texts, broken = _decode_strings([buf[start[j] : end[j]] for j in escaped.tolist()])
        if broken.any():
            return (
                pa.table({}),
                0,
                {
                    int(line_of[escaped[i]]): "a string holds a lone surrogate: not valid Unicode"
                    for i in np.flatnonzero(broken)
                },
            )
        bounds = np.frombuffer(texts.buffers()[1], np.int64)[: len(texts) + 1]
        decoded = np.frombuffer(texts.buffers()[2], np.uint8) if texts.buffers()[2] is not None else decoded
        source[escaped], start[escaped], end[escaped] = 2, bounds[:-1], bounds[1:]
    keys_raw = pc.dictionary_encode(
        _binary(key_bounds, buf).take(pa.array(2 * np.arange(len(kind), dtype=np.int64) + 1))
    )
    names = _key_names(keys_raw.dictionary, rename)
    key_index = keys_raw.indices.to_numpy(zero_copy_only=False)
    if None in names:  # a column name must be UTF-8 (Parquet, Arrow): the line is refused, as for such a value
        broken = np.flatnonzero(np.isin(key_index, [i for i, name in enumerate(names) if name is None]))
        return pa.table({}), 0, {int(line_of[j]): "a key holds a lone surrogate: not valid Unicode" for j in broken}
    column_of_name = {name: i for i, name in enumerate(dict.fromkeys(names))}
    refused = check(list(column_of_name)) if check is not None else None
    if refused:  # before any column is built: a file of 100,000 keys costs its one pass, not a table that wide
        reason, at = refused
        if at < 0:
            raise KeysRefused(reason)
        name = list(column_of_name)[at]
        spellings = [i for i, spelled in enumerate(names) if spelled == name]
        raise KeysRefused(reason, int(line_of[np.flatnonzero(np.isin(key_index, spellings))[0]]))
    if not column_of_name:  # only empty objects: rows without columns
        return pa.table({"rows": pa.nulls(rows, pa.string())}).drop_columns(["rows"]), rows, {}
    column = np.array([column_of_name[n] for n in names], np.int64)[key_index]
    offsets, valid, data, slot_first, dense, sparse_first, sparse_row = _gather(
        rows,
        len(column_of_name),
        column,
        line_of,
        start,
        end,
        source,
        kind == NULL,
        a,
        packed,
        decoded,
        DENSE_CELLS_PER_MEMBER,
    )
    wide = len(data) >= 2**31  # string offsets are int32: past that, large_string, then a cast that says which column
    text = pa.large_string() if wide else pa.string()
    offsets = offsets if wide else offsets.astype(np.int32)
    data_buffer = pa.py_buffer(data)
    gaps = pa.nulls(rows, text) if not dense.all() else None  # one all-null column: sparse ones are slices of it
    columns = {}
    for name, c in column_of_name.items():
        present = valid[slot_first[c] : slot_first[c + 1]]
        nulls = len(present) - int(np.count_nonzero(present))
        bitmap = pa.py_buffer(np.packbits(present, bitorder="little")) if nulls else None
        column_offsets = pa.py_buffer(offsets[slot_first[c] : slot_first[c + 1] + 1])
        array = pa.Array.from_buffers(text, len(present), [bitmap, column_offsets, data_buffer], nulls)
        if not dense[c]:
            array = _spread(array, sparse_row[sparse_first[c] : sparse_first[c + 1]], gaps)
        columns[name] = array.cast(pa.string()) if wide else array
    return pa.table(columns), rows, {}


def parse_ndjson(url: str, data: bytes, rename: Callable[[str], str] = str, check: KeyCheck | None = None) -> Parsed:
    """Every non-blank line of an NDJSON file as strings (see the module doc); bad lines become rejects.

    ``check``: given the file's columns (distinct top-level keys of its good lines, renamed, first-seen order), why
    the file is refused and which key's first line to name (-1: none), or None; a refusal raises KeysRefused (the
    whole file: no line of it merges)."""
    if data.startswith(codecs.BOM_UTF8):  # some Windows tools begin a file with one: it is not part of the data
        data = b" " * len(codecs.BOM_UTF8) + data[len(codecs.BOM_UTF8) :]
    starts, ends, filled = _lines(np.frombuffer(data, np.uint8))
    lines = np.flatnonzero(filled)  # blank lines are skipped, not rejected
    bad = _not_utf8(data, starts, ends, lines) if len(lines) else {}
    while True:
        good = lines[~np.isin(lines, np.fromiter(bad, np.int64, len(bad)))] if bad else lines
        if not len(good):
            table, rows = None, 0
            break
        if len(good) == len(starts) and (not len(data) or data[-1:] == b"\n"):
            buf = data
        else:
            buf = b"".join(data[starts[i] : ends[i]] + b"\n" for i in good.tolist())
        try:
            table, rows, found = _scan(buf, rename, check)
        except KeysRefused as refused:
            if refused.line is None:
                raise
            raise KeysRefused(f"{refused} (line {int(good[refused.line]) + 1})") from None
        if not found:
            break
        bad.update({int(good[i]): reason for i, reason in found.items()})
    rejects = [
        {
            "source_file": url,
            "line_number": int(i) + 1,
            "error": reason,
            "line": data[starts[i] : ends[i]].decode("utf-8", errors="replace")[:10000],
        }
        for i, reason in sorted(bad.items())
    ]
    return Parsed(table if rows else None, rows, rejects)
