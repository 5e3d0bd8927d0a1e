"""The ``pipeline-health`` dashboard: the last 24 hours of every pipeline, as one markdown artifact per health run.

Seed 001 keeps its figures in a metrics table and a CloudWatch dashboard reads them. Here each pipeline gives its
figures (``dashboard`` in its ``pipeline.py``): how many pieces of work ended and how many of those failed, a
headline and charts; this module lays them out (a headline, the charts, a table of failure rates).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tasks.core import registry
from tasks.core.release import VERSION

HOURS = 24
BAR_WIDTH = 40
EIGHTHS = " ▏▎▍▌▋▊▉█"


def hourly(rows: Iterable[Mapping[str, Any]], value: str, now_us: int, hours: int = HOURS) -> list[float]:
    """Sum of ``value`` per hour over the last ``hours`` hours, oldest hour first."""
    sums = [0.0] * hours
    for row in rows:
        age_hours = int((now_us - int(row["timestamp"])) // 3_600_000_000)
        if 0 <= age_hours < hours:
            sums[hours - 1 - age_hours] += float(row.get(value) or 0)
    return sums


def bar(value: float, most: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of ``value`` against ``most``, in eighths of a character."""
    if most <= 0 or value <= 0:
        return ""
    eighths = max(1, round(value / most * width * 8))
    return "█" * (eighths // 8) + (EIGHTHS[eighths % 8] if eighths % 8 else "")


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float]) -> str:
    """A markdown bar chart (a fenced block, so the bars line up in the UI)."""
    most = max(values, default=0)
    lines = [f"{label}  {bar(v, most):<{BAR_WIDTH + 1}} {v:,.0f}" for label, v in zip(labels, values)]
    return f"**{title}**\n\n```\n" + "\n".join(lines) + "\n```"


@dataclass(frozen=True)
class Outcomes:
    """Work of one pipeline that ended in the window: how much, how much failed, and what the unit is."""

    pipeline: str
    unit: str
    ended: int
    failed: int

    def row(self) -> dict[str, Any]:
        """The pipeline as a dashboard table row."""
        rate = f"{self.failed / self.ended:.1%}" if self.ended else "-"
        return {
            "pipeline": self.pipeline,
            "unit": self.unit,
            "ended": self.ended,
            "failed": self.failed,
            "failure rate": rate,
        }

    @classmethod
    def of(
        cls,
        pipeline: str,
        unit: str,
        items: Iterable[Mapping[str, Any]],
        status: str,
        ok: str,
        bad: str,
        since: Callable[[Mapping[str, Any]], bool],
    ) -> Outcomes:
        """The items whose ``status`` is ``ok`` or ``bad`` and that ended in the window (``since``)."""
        ended = [item for item in items if item.get(status) in (ok, bad) and since(item)]
        return cls(pipeline, unit, len(ended), sum(1 for item in ended if item.get(status) == bad))


@dataclass(frozen=True)
class Window:
    """The dashboard's 24 hours, and this health pass's alarm readings (name -> value)."""

    now_us: int
    since_us: int
    readings: Mapping[str, int | None]

    @property
    def since_iso(self) -> str:
        """The window's start as the records write times (ISO 8601, UTC, to the second)."""
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.since_us / 1e6))

    @property
    def since_epoch_ms(self) -> int:
        """The window's start in epoch milliseconds (seed 004's record times)."""
        return self.since_us // 1000

    def hour_labels(self, hours: int = HOURS) -> list[str]:
        """``HH:00`` of each of the last ``hours`` hours, oldest first."""
        return [time.strftime("%H:00", time.gmtime(self.now_us / 1e6 - (hours - 1 - h) * 3600)) for h in range(hours)]


@dataclass(frozen=True)
class Figures:
    """What one pipeline shows: its outcomes row, a headline figure and charts (markdown)."""

    outcomes: Outcomes
    summary: str = ""
    charts: tuple[str, ...] = ()


def ended_since(window: Window, *attrs: str) -> Callable[[Mapping[str, Any]], bool]:
    """Whether an item's latest of ``attrs`` (ISO 8601 times) falls in the window."""
    return lambda item: max((str(item.get(a) or "") for a in attrs), default="") >= window.since_iso


def dashboard(readings: Mapping[str, int | None], now_us: int | None = None) -> tuple[str, list[dict[str, Any]]]:
    """The dashboard's markdown and its per-pipeline rows, for the 24 hours before ``now_us``."""
    now_us = now_us or time.time_ns() // 1000
    window = Window(now_us, now_us - HOURS * 3_600_000_000, readings)
    figures: list[Figures] = [hook(window) for _, hook in registry.hooks("dashboard")]
    rows = [f.outcomes.row() for f in figures]
    table = "\n".join(
        ["| pipeline | ended (24 h) | failed | failure rate |", "|---|---:|---:|---:|"]
        + [f"| {r['pipeline']} | {r['ended']} {r['unit']} | {r['failed']} | {r['failure rate']} |" for r in rows]
    )
    headline = " · ".join(f.summary for f in figures if f.summary)
    charts = [chart for f in figures for chart in f.charts]
    footer = f"pipelines v{VERSION}"  # the release that drew it: after an upgrade, which code reads the records
    markdown = "\n\n".join(["# Pipelines, last 24 hours", *([headline] if headline else []), *charts, table, footer])
    return markdown, rows
