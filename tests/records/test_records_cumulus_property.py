"""Property: for any order, duplication and interleaving (any batch split) of a set of workflow messages for one
granule, one PDR and their executions, records-ingest leaves the records a small reference model leaves.

The model is written from Cumulus's code (nasa/cumulus), not from this project's: ``ExecutionPgModel.upsert``,
``PdrPgModel.upsert``, ``GranulePgModel.upsert`` with writeConstraints (insert, else the guarded update; running and
queued update only status/createdAt/timestamps; the ``_buildExclusionClause`` execution check), and
``writeGranulesFromMessage`` (files and productVolume only when the granule gives files; no files for a running or
queued granule; a null removes what the granule gives). Where seed 004's text decides otherwise the model follows
the seed, as the implementation does: createdAt is workflow_start_time; null files are []; a light write keeps the
granule's execution link. A queued message writes no execution (Cumulus's queued granules come from its API, with
their execution not started yet).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.records_cumulus import NOW, arn, execution, granule, ingest, message, pdr

pytestmark = pytest.mark.usefixtures("module_tables")

STARTS = {"A": 1000, "B": 2000, "C": 2000}  # C: another execution with B's createdAt
FILES = {
    "one": [{"fileName": "a.hdf", "size": 7}],
    "two": [{"fileName": "b.hdf", "size": 5}, {"fileName": "c.xml", "size": 6}],
}


@dataclass(frozen=True)
class Event:
    execution: str  # A, B or C
    status: str
    files: str  # "one", "two", "omitted" or "null"
    cmr_link: str  # "given", "omitted" or "null"
    done: int  # the PDR's executions no longer running, of 4


events = st.builds(
    Event,
    execution=st.sampled_from(sorted(STARTS)),
    status=st.sampled_from(["queued", "running", "completed", "failed"]),
    files=st.sampled_from(["one", "two", "omitted", "null"]),
    cmr_link=st.sampled_from(["given", "omitted", "null"]),
    done=st.integers(0, 4),
)


def to_message(event: Event, names: dict[str, str], granule_id: str, pdr_name: str) -> dict:
    """The workflow message of ``event``."""
    given: dict[str, Any] = {"granuleId": granule_id}
    if event.files != "omitted":
        given["files"] = None if event.files == "null" else FILES[event.files]
    if event.cmr_link != "omitted":
        given["cmrLink"] = None if event.cmr_link == "null" else f"https://cmr/{event.execution}"
    return message(
        event.status,
        names[event.execution],
        STARTS[event.execution],
        given,
        pdr=pdr_name,
        payload={"running": ["r"] * (4 - event.done), "completed": ["c"] * event.done},
    )


class Reference:
    """Cumulus's record writes, one message at a time."""

    def __init__(self) -> None:
        self.granule: dict[str, Any] | None = None
        self.pdr: dict[str, Any] | None = None
        self.executions: dict[str, dict[str, Any]] = {}

    def apply(self, msg: dict) -> None:
        """writeRecords: the execution, then the PDR, then the granules."""
        status, start = msg["meta"]["status"], msg["cumulus_meta"]["workflow_start_time"]
        ex_arn = arn(msg["cumulus_meta"]["execution_name"])
        if status != "queued":
            self._execution(ex_arn, status, start, msg["payload"])
            self._pdr(ex_arn, status, start, msg["payload"])
        for given_granule in msg["payload"]["granules"]:
            self._granule(ex_arn, status, start, given_granule)

    def _execution(self, ex_arn: str, status: str, start: int, payload: dict) -> None:
        """ExecutionPgModel.upsert: insert; else running updates created_at and the original payload only."""
        current = self.executions.get(ex_arn)
        if current is None:
            self.executions[ex_arn] = {
                "status": status,
                "createdAt": start,
                ("originalPayload" if status == "running" else "finalPayload"): payload,
            }
        elif status == "running":
            current.update(createdAt=start, originalPayload=payload)
        else:
            current.update(status=status, createdAt=start, finalPayload=payload)

    def _pdr(self, ex_arn: str, status: str, start: int, payload: dict) -> None:
        """PdrPgModel.upsert: merge when created_at is not older and, for running, the execution differs or the
        progress grows."""
        total = len(payload["running"]) + len(payload["completed"])
        record = {
            "status": status,
            "execution": ex_arn,
            "createdAt": start,
            "progress": 100 * len(payload["completed"]) / total,
        }
        current = self.pdr
        if current is None:
            self.pdr = record
        elif current["createdAt"] <= start and (
            status != "running" or current["execution"] != ex_arn or current["progress"] < record["progress"]
        ):
            current.update(record)

    def _granule(self, ex_arn: str, status: str, start: int, given: dict) -> None:
        """writeGranulesFromMessage and GranulePgModel.upsert with writeConstraints."""
        record: dict[str, Any] = {"status": status, "createdAt": start, "execution": ex_arn, "published": False}
        if "files" in given:
            files = given["files"] or []
            record["productVolume"] = str(sum(f["size"] for f in files))
            if status in ("completed", "failed"):
                record["files"] = files
        if "cmrLink" in given:
            record["cmrLink"] = given["cmrLink"]
        current = self.granule
        if current is None:
            self.granule = {k: v for k, v in record.items() if v is not None}
            return
        if current["createdAt"] > start:
            return
        if status in ("completed", "failed"):
            for key, value in record.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            return
        ex = self.executions.get(ex_arn)
        excluded = ex is not None and (status == "queued" or ex["status"] in ("completed", "failed"))
        if not excluded:
            current.update(status=status, createdAt=start)


GRANULE_FIELDS = ("status", "createdAt", "execution", "files", "productVolume", "cmrLink", "published")
PDR_FIELDS = ("status", "execution", "createdAt", "progress")
EXECUTION_FIELDS = ("status", "createdAt", "originalPayload", "finalPayload")


def pick(record: dict | None, fields: tuple[str, ...]) -> dict | None:
    return None if record is None else {k: record[k] for k in fields if k in record}


def check(chosen: list[Event], cuts: list[int]) -> None:
    """Ingest the messages of ``chosen`` in batches cut at ``cuts``; compare with the reference model."""
    tag = uuid.uuid4().hex[:10]
    names = {name: f"{name}-{tag}" for name in STARTS}
    granule_id, pdr_name = f"G-{tag}", f"P-{tag}"
    msgs = [to_message(event, names, granule_id, pdr_name) for event in chosen]
    model = Reference()
    for msg in msgs:
        model.apply(msg)
    bounds = sorted({0, len(msgs), *(c for c in cuts if 0 < c < len(msgs))})
    for first, last in zip(bounds, bounds[1:]):
        report = ingest(*msgs[first:last], now=NOW)
        assert report.errors() == {}
    assert pick(granule(granule_id), GRANULE_FIELDS) == pick(model.granule, GRANULE_FIELDS)
    assert pick(pdr(pdr_name), PDR_FIELDS) == pick(model.pdr, PDR_FIELDS)
    for name, full in names.items():
        assert pick(execution(full), EXECUTION_FIELDS) == pick(model.executions.get(arn(full)), EXECUTION_FIELDS), name


SCENARIOS = dict(chosen=st.lists(events, min_size=1, max_size=8), cuts=st.lists(st.integers(1, 7), max_size=3))


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(**SCENARIOS)
def test_any_order_duplication_and_interleaving_ends_as_cumulus_reference_model(chosen, cuts):
    check(chosen, cuts)


@pytest.mark.sweep  # many more examples: `make test-sweep`
@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(**SCENARIOS)
def test_any_order_duplication_and_interleaving_ends_as_cumulus_reference_model_sweep(chosen, cuts):
    check(chosen, cuts)


def test_the_reference_model_follows_cumulus_tests():
    """The model itself against the Cumulus tests it restates (no DynamoDB): a running write with the same
    createdAt from another execution replaces a completed granule; the same execution's does not."""
    model = Reference()
    names = {"A": "A", "B": "B", "C": "C"}
    model.apply(to_message(Event("B", "completed", "one", "given", 4), names, "g", "p"))
    model.apply(to_message(Event("B", "running", "two", "omitted", 0), names, "g", "p"))
    assert model.granule["status"] == "completed" and model.pdr["status"] == "completed"
    model.apply(to_message(Event("C", "running", "two", "omitted", 0), names, "g", "p"))
    assert (model.granule["status"], model.granule["files"], model.granule["execution"]) == (
        "running",
        FILES["one"],
        arn("B"),
    )
    assert (model.pdr["status"], model.pdr["execution"]) == ("running", arn("C"))
