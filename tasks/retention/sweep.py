"""Retention: finished records get a DynamoDB TTL, staging left by dead runs and old dead letters age out.

    every table with a TTL attribute ──> terminal record without ``ttl`` ──stamp (guarded: still terminal)──▶ ttl =
    ended + N days
                                     └─> live record with ``ttl`` (reopened) ──remove (guarded: still live)──▶ kept for
                                     ever
                                     └─> live record whose child items carry a ``ttl`` (a resume took only the
                                         parent's off) ──remove from those items──▶ kept for ever
    each pipeline's object areas (``object_retention``: the ETL's merge staging older than the merge timeout,
    the dead-letter archive's ``failed/`` older than ``dead_letter_days``, off by default) ──────▶ deleted

DynamoDB deletes an item some time after its ``ttl`` (epoch seconds) passes, so a record is stamped once it is
terminal and the stamp is guarded by the terminal status: live work is never given a ttl, and a record that
went live again (a failed video job reopened, a run resumed) loses its stamp on the next pass. The ETL tables
stamp their own ttl at write (seed 001: 30 days). Granules and executions (seed 004) have none: Cumulus keeps
them until an operator deletes them. Each pipeline declares its rules (``retention_rules`` and
``object_retention`` in its ``pipeline.py``); a pass visits every one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tasks.core import registry, state_store
from tasks.core.config import table_name
from tasks.core.object_store import ObjectStore

DAY_S = 86400
# on a parent whose ttl was just set or taken off, until its child items carry the same (one pass's unfinished work)
ITEMS_PENDING = "ttl_items_pending"


@dataclass(frozen=True)
class Rule:
    """One table's retention: which records are finished, since when, and which items go with them."""

    table: str  # logical name
    key: tuple[str, ...]
    status_attr: str
    terminal: tuple[str, ...]
    ended_attrs: tuple[str, ...]  # the first present is when it finished
    keep: Callable[[Mapping[str, Any]], bool] = lambda item: True  # only these items are parents here
    # a parent's child items, given a dict the pass keeps for the rule (what one pass reads once)
    children: Callable[[Mapping[str, Any], dict[str, Any]], list[Child]] | None = None


Child = tuple[str, dict[str, Any], bool]  # (table, key, whether the item carries a ttl)


def _epoch(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())


@dataclass
class Report:
    """What one retention pass did, per table and per object area."""

    stamped: dict[str, int] = field(default_factory=dict)
    unstamped: dict[str, int] = field(default_factory=dict)
    deleted_objects: dict[str, int] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The pass as one flat dict (the flow's summary and artifact)."""
        return {"stamped": self.stamped, "unstamped": self.unstamped, "deleted_objects": self.deleted_objects}


@dataclass(frozen=True)
class Ageing:
    """What a pass ages object areas by: its time, and how long replayed-and-failed dead letters stay (None: kept)."""

    now: datetime
    dead_letter_days: float | None


def _pending(rule: Rule) -> dict[str, bool]:
    """The mark a parent's ttl change carries while its child items do not match it yet (none without children)."""
    return {ITEMS_PENDING: True} if rule.children else {}


def _set_items_ttl(children: list[Child], ttl: int | None) -> None:
    """Give these child items ``ttl`` (None: take it off), 100 to a transaction (a run's thousands of chunks)."""
    by_table: dict[str, list[dict[str, Any]]] = {}
    for child_table, child_key, _ in children:
        by_table.setdefault(table_name(child_table), []).append(child_key)
    for child_table, child_keys in by_table.items():
        sets, remove = ({}, ["ttl"]) if ttl is None else ({"ttl": ttl}, [])
        state_store.transition_many(
            child_table, [(child_key, None, None, sets) for child_key in child_keys], remove=remove
        )


def _mark_items(
    rule: Rule, item: Mapping[str, Any], key: dict[str, Any], ttl: int | None, cache: dict[str, Any]
) -> None:
    """Give ``item``'s child items ``ttl`` (None: take it off), then clear the parent's ``ITEMS_PENDING`` mark."""
    if rule.children is None:
        return
    _set_items_ttl(rule.children(item, cache), ttl)
    state_store.transition(table_name(rule.table), key, None, None, remove=[ITEMS_PENDING])


def _unstamp_live_items(rule: Rule, item: Mapping[str, Any], cache: dict[str, Any]) -> int:
    """Take the ttl off the child items of a live parent that carries none (a resume reopened the parent alone);
    how many. DynamoDB would otherwise delete a live run's chunks once their old ttl passed."""
    if rule.children is None:
        return 0
    stamped = [child for child in rule.children(item, cache) if child[2]]
    _set_items_ttl(stamped, None)
    return len(stamped)


def stamp_finished_records(days: float, report: Report) -> None:
    """Give every terminal record (and its child items) a ttl ``days`` after it ended; take it off live ones.

    The parent's change carries ``ITEMS_PENDING`` until its items match it, so a pass that died in between
    leaves a mark the next pass finishes from (a stamped parent is otherwise skipped, its items never stamped)."""
    for rule in rules():
        table, cache = table_name(rule.table), {}
        stamped = unstamped = 0
        for item in state_store.scan_all(table, keep=rule.keep):
            key = {k: item[k] for k in rule.key}
            if item.get(rule.status_attr) in rule.terminal:
                if "ttl" in item:
                    if ITEMS_PENDING in item:  # stamped by a pass that died before its items
                        _mark_items(rule, item, key, int(item["ttl"]), cache)
                    continue
                ended = next((str(item[a]) for a in rule.ended_attrs if item.get(a)), None)
                if ended is None:
                    continue  # no time to count from: kept (a record the pipelines always stamp would not be here)
                ttl = _epoch(ended) + int(days * DAY_S)
                result = state_store.transition(
                    table, key, rule.terminal, None, status_attr=rule.status_attr, set={"ttl": ttl, **_pending(rule)}
                )
                if result.applied:
                    stamped += 1
                    _mark_items(rule, item, key, ttl, cache)
            elif "ttl" in item:  # live again (reopened, resumed): keep it and its items for good
                live = tuple({item[rule.status_attr]})
                result = state_store.transition(
                    table, key, live, None, status_attr=rule.status_attr, remove=["ttl"], set=_pending(rule)
                )
                if result.applied:
                    unstamped += 1
                    _mark_items(rule, item, key, None, cache)
            elif ITEMS_PENDING in item:  # unstamped by a pass that died before its items
                _mark_items(rule, item, key, None, cache)
            else:  # live and unstamped: its items may still carry the ttl of when it had ended
                unstamped += _unstamp_live_items(rule, item, cache)
        report.stamped[rule.table], report.unstamped[rule.table] = stamped, unstamped


def older_than(store: ObjectStore, prefix: str, cutoff: datetime) -> list[str]:
    """Keys under ``prefix`` last modified before ``cutoff``."""
    return [o.key for o in store.list_objects(prefix) if datetime.fromisoformat(o.last_modified) < cutoff]


def rules() -> list[Rule]:
    """Every pipeline's retention rules, in seed order."""
    return [rule for _, declared in registry.hooks("retention_rules") for rule in declared]


def age_out_objects(dead_letter_days: float | None, now: datetime, report: Report) -> None:
    """Each pipeline's object areas aged out (``object_retention``): what only a dead run could still own."""
    ageing = Ageing(now, dead_letter_days)
    for _, age_out in registry.hooks("object_retention"):
        report.deleted_objects.update(age_out(ageing))


def apply_retention(
    record_days: float = 30, dead_letter_days: float | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """One retention pass over every table and object area; what it did."""
    report = Report()
    stamp_finished_records(record_days, report)
    age_out_objects(dead_letter_days, now or datetime.now(UTC), report)
    return report.row()
