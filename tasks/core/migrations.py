"""Data migrations: ordered, named functions a release ships to move data, each idempotent and resumable.

    MIGRATIONS (in name order) ──run()──▶ for each one not DONE: scan its table a page at a time, ``apply`` each
        item, then record the page's LastEvaluatedKey ──▶ DONE

The applied set lives in DynamoDB, one item per migration in the migrations table (key ``migration``), written
through the state store's conditional writes: created once (RUNNING), advanced page by page as a transition that
requires the page count it read (two runners never move it backwards), then RUNNING → DONE. A crash between
pages resumes after the last recorded page; the page it died in is applied again, so ``apply`` must be idempotent
(a conditional write that does nothing the second time). `make up` runs the pending ones; so does
``pipelines migrate`` (``--dry-run``: what would run). ``copy_table`` is the same machinery moving every item of a
table to a new one, the step a change DynamoDB cannot make in place needs (``tables.refusal``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tasks.core import state_store
from tasks.core.errors import PipelineError
from tasks.core.state_store import unchanged
from tasks.core.tables import TableSpec, ensure_table

RUNNING, DONE = "RUNNING", "DONE"
TABLE_SPEC = TableSpec("migration")
LOGICAL = "migrations"  # TABLE_MIGRATIONS names it otherwise
DEFAULT_NAME = "pipelines-migrations-{env}"
PAGE_ITEMS = 100  # items per page, so a crash repeats at most this many applies


@dataclass(frozen=True)
class Migration:
    """One release's data move: ``apply(item, names)`` for every item of the logical ``table``; ``names`` maps
    logical -> physical table names. Idempotent: an item applied twice ends as if applied once."""

    name: str  # sortable and unique: "0001-what-it-does"
    table: str
    apply: Callable[[dict[str, Any], Mapping[str, str]], None]
    description: str = ""


# The product's migrations, oldest first. None yet: every current schema change is additive (`tables` makes it).
MIGRATIONS: tuple[Migration, ...] = ()


def table_name() -> str:
    """The migrations table's physical name (env ``TABLE_MIGRATIONS``, else ``pipelines-migrations-<env>``)."""
    from blocks import DynamoTables, load_config

    config = load_config(DynamoTables)
    return config.name_of(LOGICAL, DEFAULT_NAME.format(env=config.env))


def _record(record_table: str, name: str) -> dict[str, Any] | None:
    return state_store.get_item(record_table, {"migration": name})


def plan(migrations: Sequence[Migration] = MIGRATIONS, record_table: str | None = None) -> dict[str, str]:
    """Migration name -> 'done', 'pending' or 'resumes after N items', without changing anything."""
    record_table = record_table or table_name()
    ensure_table(record_table, TABLE_SPEC)
    result = {}
    for migration in sorted(migrations, key=lambda m: m.name):
        record = _record(record_table, migration.name)
        if record is None:
            result[migration.name] = "pending"
        elif record["status"] == DONE:
            result[migration.name] = "done"
        else:
            result[migration.name] = f"resumes after {int(record.get('items', 0))} items"
    return result


def run(
    migrations: Sequence[Migration] = MIGRATIONS,
    names: Mapping[str, str] | None = None,
    record_table: str | None = None,
    dry_run: bool = False,
) -> dict[str, str]:
    """Apply every migration not DONE, in name order; migration name -> what happened ('done', 'applied to N
    items'), or with ``dry_run`` what would (``plan``)."""
    if dry_run:
        return plan(migrations, record_table)
    if names is None:
        from tasks.core.config import table_names

        names = table_names()
    record_table = record_table or table_name()
    ensure_table(record_table, TABLE_SPEC)
    result = {}
    for migration in sorted(migrations, key=lambda m: m.name):
        result[migration.name] = run_one(migration, names, record_table)
    return result


def run_one(migration: Migration, names: Mapping[str, str], record_table: str) -> str:
    """Apply one migration from where its record says it stopped; 'done' when it already was."""
    key = {"migration": migration.name}
    state_store.create_if_absent(
        record_table,
        {**key, "status": RUNNING, "table": names[migration.table], "pages": 0, "items": 0, "started_at": _now()},
        ["migration"],
    )
    if _record(record_table, migration.name)["status"] == DONE:
        return "done"
    while (record := _record(record_table, migration.name))["status"] != DONE:
        if record.get("pages") and not record.get("last_key"):  # the last page is recorded: only DONE is left
            state_store.transition(record_table, key, RUNNING, DONE, set={"finished_at": _now()})
            continue
        items, last_key = state_store.scan_page(names[migration.table], record.get("last_key"), PAGE_ITEMS)
        for item in items:
            migration.apply(item, names)
        pages = int(record["pages"])
        state_store.transition(  # STALE: another runner recorded this page first; read its record and go on
            record_table,
            key,
            RUNNING,
            None,
            set={"pages": pages + 1, "last_key": last_key},
            add={"items": len(items)},
            condition=unchanged({"pages": pages}, tag="p"),
        )
    return f"applied to {int(record['items'])} items"


def copy_table(logical: str, target: str, names: Mapping[str, str] | None = None) -> dict[str, str]:
    """Create ``target`` with ``logical``'s spec of this version and copy every item of its current table into it
    (resumable: run it again after a crash). The step a change DynamoDB cannot make in place needs."""
    from tasks.core import registry

    if names is None:
        from tasks.core.config import table_names

        names = table_names()
    specs = registry.table_specs()
    if logical not in specs:
        raise ValueError(f"unknown table {logical!r}: one of {', '.join(sorted(specs))}")
    source = names[logical]
    if source == target:
        raise ValueError(f"{target} is the table {logical} uses now: give the new table another name")
    created = ensure_table(target, specs[logical])

    def put_copy(item: dict[str, Any], _names: Mapping[str, str]) -> None:
        state_store.put(target, item)  # the same item again on a rerun: idempotent

    record_table = table_name()
    ensure_table(record_table, TABLE_SPEC)
    copied = run_one(Migration(f"copy-table {source} -> {target}", logical, put_copy), names, record_table)
    return {"table": target, "state": created, "copy": copied, "next": f"export TABLE_{logical.upper()}={target}"}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --------------------------------------------------------------------------- the object store's layout

LAYOUT_VERSION = 1  # the key layout of this version (prefixes per pipeline as the pipelines write them)
LAYOUT_MARKER = ".pipelines-layout.json"  # under the store's root


class LayoutMismatch(PipelineError, RuntimeError):
    """The object store's layout is one this version does not read (written by a newer version, or by an older one
    whose move has no migration here); nothing was changed."""


def check_layout(store) -> str:
    """Check the store's layout marker at `up`: absent, it is written (a store from before markers has this
    layout); equal, nothing to do; another version, refused with what to do. Returns what it found."""
    import json

    from tasks.core.object_store import ObjectNotFound

    try:
        found = json.loads(store.get_bytes(LAYOUT_MARKER))["layout"]
    except ObjectNotFound:
        store.put_bytes(LAYOUT_MARKER, json.dumps({"layout": LAYOUT_VERSION}).encode())
        return f"layout {LAYOUT_VERSION} (marker written)"
    if found == LAYOUT_VERSION:
        return f"layout {LAYOUT_VERSION}"
    newer = found > LAYOUT_VERSION
    raise LayoutMismatch(
        f"{store.url_for(LAYOUT_MARKER)} says layout {found}, this version reads layout {LAYOUT_VERSION} "
        + (
            "(written by a newer version: check out that version, or restore a backup taken before it)"
            if newer
            else "(an older layout this version cannot move: upgrade through the release that moves it first)"
        )
        + "; nothing was changed"
    )


def upgrade_data() -> list[str]:
    """`make up`'s data step, after the tables: the pending migrations, then the object store's layout check.
    One line per thing checked, for `up` to print."""
    from tasks.core.config import object_store

    # the registry as it is now (a default argument would hold the tuple of import time)
    lines = [f"migration        {state:8} {name}" for name, state in run(MIGRATIONS).items()]
    return [*lines, f"object store     {check_layout(object_store())}"]
