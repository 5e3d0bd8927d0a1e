"""How wide merged output may grow: columns (distinct top-level keys) per file and per merged part, and which keys can
be column names at all (the Glue Data Catalog's rules), so one hostile file cannot stall its batch or keep its date
out of the catalog.

Every top-level key becomes a Parquet column, and writing a Parquet file costs more than linearly in its columns
(24,000 columns: 2.2 s for a 440 KB file). A file is checked as its keys are read (``ndjson_text``: after the one pass
that finds the keys, before any table is built); a part checks each file's columns against those of the files before
it. A refused file fails alone with the reason (its FAILED record), its input kept; its neighbours merge.

Glue's ``Column.Name`` is 1 to 255 characters of ``[\\u0020-\\uD7FF\\uE000-\\uFFFD\\t]`` and surrogate pairs. Keys
with any control character (tab included) are refused too, and two keys that differ only by case are refused in one
file or part: Athena and Glue lower-case column names, so they would be one column there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

GLUE_NAME_MAX = 255  # characters (UTF-16 code units, as Glue counts them) of a Glue column name
# what Glue's pattern refuses, plus every control character (C0, DEL, C1): tab is legal in Glue, never in a key here
_REFUSED_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f\ufffe\uffff]")
SHOWN_CHARS = 40  # of a refused key, in a reason


@dataclass(frozen=True)
class WidthLimits:
    """The ETL settings' width limits (``max_columns_per_file``, ``max_columns_per_manifest``, ``max_key_bytes``)."""

    columns_per_file: int
    columns_per_part: int
    key_bytes: int

    @classmethod
    def of(cls, config: Any) -> WidthLimits:
        """The limits an ``EtlSettings`` sets."""
        return cls(config.max_columns_per_file, config.max_columns_per_manifest, config.max_key_bytes)


def shown(name: str) -> str:
    """A key as a reason names it: its start, escaped, cut at ``SHOWN_CHARS``."""
    cut = name[:SHOWN_CHARS]
    return repr(cut) + ("…" if cut != name else "")


def name_problem(name: str, key_bytes: int) -> str | None:
    """Why ``name`` cannot be a column (None: it can)."""
    if not name:
        return "an empty key (Glue refuses empty column names)"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > key_bytes:
        return f"key {shown(name)} is {size} bytes, longer than max_key_bytes ({key_bytes})"
    if len(name.encode("utf-16-le", "surrogatepass")) // 2 > GLUE_NAME_MAX:
        return f"key {shown(name)} is longer than Glue's {GLUE_NAME_MAX} characters for a column name"
    bad = _REFUSED_CHARACTER.search(name)
    if bad:
        what = "a noncharacter" if bad.group() in "\ufffe\uffff" else "a control character"
        return f"key {shown(name)} holds U+{ord(bad.group()):04X}, {what} (refused as a column name)"
    return None


def _case_twins(names: Iterable[str], known: dict[str, str]) -> tuple[str, int] | None:
    """The first of ``names`` that differs only by case from another column (``known``: folded → name, grown here)."""
    for i, name in enumerate(names):
        twin = known.setdefault(name.lower(), name)
        if twin != name:
            return f"keys {shown(twin)} and {shown(name)} differ only by case (Glue and Athena lower-case names)", i
    return None


def file_problem(names: Sequence[str], limits: WidthLimits) -> tuple[str, int] | None:
    """Why a file with these columns (distinct keys, first-seen order) is refused, and the offending key's index
    (-1: the file as a whole); None when it may merge. The count first: a wide file costs no per-key look."""
    if len(names) > limits.columns_per_file:
        return f"{len(names)} distinct top-level keys, more than max_columns_per_file ({limits.columns_per_file})", -1
    for i, name in enumerate(names):
        problem = name_problem(name, limits.key_bytes)
        if problem:
            return problem, i
    return _case_twins(names, {})


class PartColumns:
    """The columns of one merged part so far, in case-folded form: each file is admitted (its new columns added) or
    refused (it alone fails) in file order, so a part never passes ``columns_per_part`` user columns."""

    def __init__(self, limit: int, reserved: Iterable[str] = ()) -> None:
        self.limit = limit
        self.reserved = {name.lower(): name for name in reserved}  # the merge's own columns: never counted
        self.columns: dict[str, str] = dict(self.reserved)

    def admit(self, names: Sequence[str]) -> str | None:
        """Add a file's columns; the reason it is refused instead (None: admitted)."""
        known = dict(self.columns)
        twins = _case_twins(names, known)
        if twins:
            return f"{twins[0]}, with a column of this batch"
        width = len(known) - len(self.reserved)
        if width > self.limit:
            brings = width - (len(self.columns) - len(self.reserved))
            return (
                f"its {brings} new column(s) would widen its merged part to {width} columns, more than "
                f"max_columns_per_manifest ({self.limit}); `etl reprocess` merges it in another batch"
            )
        self.columns = known
        return None
