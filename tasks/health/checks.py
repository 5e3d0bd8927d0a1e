"""What an alarm of ``pipeline-health`` is: a reading, its threshold and severity, and how checks are evaluated.

Seed 001 alarms on DLQ messages, queue depth, message age and workflow failures; the same questions are asked of
every pipeline (each declares its checks, ``health_checks`` in its ``pipeline.py``). A check reads only (Query where
an index exists, a maintenance Scan of small tables otherwise) and returns an ``Alarm``: its value, its threshold
and the first offending records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from blocks.health import HealthThresholds
from tasks.core import registry

SHOWN = 5  # offending records named in an alarm's detail
CRITICAL, WARNING = "CRITICAL", "WARNING"
# seed 001's severities: failures, timeouts, throttled runs and dead letters are CRITICAL; backlog, age, duration,
# concurrency and DynamoDB throttling are WARNING. The other seeds' alarms follow the same split (failed: CRITICAL,
# stuck or slow: WARNING); an alarm whose check could not read its records is CRITICAL (seed SystemErrors).
SEVERITY = {  # the shared alarms'; each pipeline declares its own (``severities``)
    "flow-runs-failed": CRITICAL,
    "flow-runs-timed-out": CRITICAL,
    "flow-runs-waiting-for-a-slot": CRITICAL,
    "landing-dead-letter-queue": CRITICAL,
    "landing-listener-not-running": CRITICAL,
    "disk-full": CRITICAL,
    "disk-space-low": WARNING,
    "flow-runs-active": WARNING,
    "flow-runs-near-timeout": WARNING,
    "landing-listener-behind": WARNING,
}


def severities() -> dict[str, str]:
    """Alarm name -> severity, the shared alarms' and every pipeline's."""
    merged = dict(SEVERITY)
    for pipeline in registry.pipelines():
        merged.update(pipeline.severities)
    return merged


def severity_of(name: str, value: int | None = 0) -> str:
    """An alarm's severity by its name (or the name it is one of, e.g. ``landing-dead-letter-queue-etl``); an
    unreadable check is CRITICAL, an alarm without a listed severity WARNING."""
    if value is None:
        return CRITICAL
    known_severities = severities()
    for known in sorted(known_severities, key=len, reverse=True):
        if name == known or name.startswith(known + "-"):
            return known_severities[known]
    return WARNING


@dataclass(frozen=True)
class Alarm:
    """One alarm's reading: firing when ``value`` exceeds ``threshold`` (or when the check itself failed)."""

    name: str
    pipeline: str
    value: int | None
    threshold: int
    detail: str

    @property
    def firing(self) -> bool:
        """Whether the alarm is in ALARM: over its threshold, or its check could not read the records."""
        return self.value is None or self.value > self.threshold

    @property
    def severity(self) -> str:
        """CRITICAL or WARNING, as the seed grades the alarm (``severity_of``)."""
        return severity_of(self.name, self.value)

    def row(self) -> dict[str, Any]:
        """The alarm as a table-artifact row."""
        return {
            **asdict(self),
            "severity": self.severity,
            "state": "ERROR" if self.value is None else ("ALARM" if self.firing else "OK"),
        }


def count_alarm(name: str, pipeline: str, offenders: Iterable[str], threshold: int, what: str) -> Alarm:
    """An alarm whose value is how many offenders were found, naming the first ``SHOWN`` of them."""
    found = sorted(offenders)
    shown = ", ".join(found[:SHOWN]) + (f" and {len(found) - SHOWN} more" if len(found) > SHOWN else "")
    return Alarm(name, pipeline, len(found), threshold, f"{len(found)} {what}" + (f": {shown}" if found else ""))


def last_change(item: Mapping[str, Any], attrs: Iterable[str]) -> str:
    """The latest of ``attrs`` the item carries (ISO 8601 strings compare in time order); "" when none."""
    return max((str(item[a]) for a in attrs if item.get(a)), default="")


Check = Callable[[HealthThresholds], "Alarm | list[Alarm]"]


def evaluate(limits: HealthThresholds, checks: Mapping[Check, tuple[str, ...]]) -> list[Alarm]:
    """Every alarm's reading; a check that raises reports its alarms as ERROR (firing) with the error."""
    alarms: list[Alarm] = []
    for check, names in checks.items():
        try:
            result = check(limits)
        except Exception as error:  # noqa: BLE001 - an unreadable pipeline is itself worth an alarm
            pipeline = names[0].split("-")[0]
            alarms += [Alarm(n, pipeline, None, 0, f"check failed: {type(error).__name__}: {error}") for n in names]
            continue
        alarms += result if isinstance(result, list) else [result]
    return alarms
