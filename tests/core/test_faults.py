"""The crash-point injector itself: it fails exactly at write N, before or after the write lands, in-process or by
SIGKILL in a child, in both stores; and it counts every write of a run."""

from __future__ import annotations

import pytest

from tasks.core import faults, state_store
from tasks.core.object_store import LocalStore
from tests.helpers.crashpoints import Write, count_writes, crash_points, killed, report_crashed_runs, run_child

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


def _create(table: str, n: int) -> state_store.WriteResult:
    return state_store.create_if_absent(table, {"job_id": f"job-{n}", "status": "created"}, ["job_id"])


def _items(table: str) -> set[str]:
    return {item["job_id"] for item in state_store.scan_all(table)}


@pytest.mark.parametrize("when, landed", [("before", {"job-1"}), ("after", {"job-1", "job-2"})])
def test_raise_at_write_n_before_or_after_it_lands(tables, when, landed):
    table = tables["video_jobs"]
    with faults.inject(at=2, mode="raise", when=when):
        _create(table, 1)
        with pytest.raises(faults.InjectedFault, match=f"write 2 \\({when} put {table}\\)"):
            _create(table, 2)
    assert _items(table) == landed
    assert not faults.armed
    _create(table, 3)  # off again: nothing raises
    assert _items(table) == landed | {"job-3"}


def test_object_writes_are_crash_points_too(tmp_path):
    store = LocalStore(tmp_path)
    with faults.inject(at=2, mode="raise", when="after"):
        store.put_bytes("a/one", b"1")
        with pytest.raises(faults.InjectedFault):
            store.copy("a/one", "a/two")
        assert faults.writes() == 2
    assert store.get_bytes("a/two") == b"1"  # after: the copy landed, then the process "died"


def test_a_child_is_killed_at_write_n_and_counting_lists_every_write(tables, tmp_path):
    call, kwargs = "tests.core.test_faults:write_three", {"table": tables["video_jobs"]}
    writes = count_writes(call, kwargs, tmp_path / "writes.log")
    assert [(w.number, w.store, w.operation, w.target) for w in writes] == [
        (1, "dynamodb", "put", tables["video_jobs"]),
        (2, "dynamodb", "update", tables["video_jobs"]),
        (3, "dynamodb", "put", tables["video_jobs"]),
    ]
    for table in (tables["video_jobs"],):
        for item in list(state_store.scan_all(table)):
            state_store.delete_if(table, {"job_id": item["job_id"]})
    result = run_child(call, kwargs, "2:kill:before")
    assert killed(result), result.stderr
    assert _items(tables["video_jobs"]) == {"job-1"}
    assert state_store.get_item(tables["video_jobs"], {"job_id": "job-1"})["status"] == "created"


def write_three(table: str) -> str:
    """The child's step: create, move, create (three writes)."""
    _create(table, 1)
    state_store.transition(table, {"job_id": "job-1"}, "created", "chunking")
    _create(table, 2)
    return "done"


def test_crash_points_are_exhaustive_when_few_else_a_sample_with_the_ends_of_each_kind():
    few = [Write(n, "dynamodb", "put", "t") for n in range(1, 11)]
    assert crash_points(few, limit=40) == list(range(1, 11))
    many = [Write(n, "dynamodb", "put" if n <= 50 else "update", "t") for n in range(1, 101)]
    chosen = crash_points(many, limit=10, seed=1)
    assert len(chosen) == 10 and {1, 50, 51, 100} <= set(chosen)
    assert chosen == crash_points(many, limit=10, seed=1)


def test_a_plan_of_one_kind_counts_only_that_kind_of_write(tables, tmp_path):
    table = tables["video_jobs"]
    store = LocalStore(tmp_path / "objects")
    kind = f"dynamodb:put:{table}"
    with faults.inject(at=2, mode="raise", when="after", kind=kind):
        store.put_bytes("videos/a", b"a")
        _create(table, 1)
        store.put_bytes("videos/b", b"b")
        store.put_bytes("videos/c", b"c")
        with pytest.raises(faults.InjectedFault, match=f"write 5 \\(after put {table}\\)"):
            _create(table, 2)  # the fifth write, the second put to the table
        store.put_bytes("videos/d", b"d")
        _create(table, 3)  # the third of the kind: nothing fires again
        assert faults.writes() == 7
    assert _items(table) == {"job-1", "job-2", "job-3"}
    assert faults.Plan.parse(f"2:kill:after:{kind}") == faults.Plan(2, "kill", "after", None, kind)
    assert faults.write_kind("objects", "put_bytes", "decompositions/run/0.json") == "objects:put_bytes:decompositions"


@pytest.mark.parametrize(
    "value", ["0:kill:before", "3:explode:before", "3:kill:during", "kill", "1:kill:after:decompositions"]
)
def test_a_malformed_plan_is_a_clear_error(value):
    with pytest.raises(ValueError, match="expected 'count' or 'N:kill|raise:before|after'"):
        faults.Plan.parse(value)


def test_a_killed_flow_run_is_reported_crashed_as_a_worker_would(tables):
    from prefect import get_client

    result = run_child("tests.core.test_faults:flow_writing_three", {"table": tables["video_jobs"]}, "2:kill:after")
    assert killed(result), result.stderr
    crashed = report_crashed_runs()  # an earlier test's run left Running is reported too: only ours is counted
    with get_client(sync_client=True) as client:
        ours = [
            run for run in map(client.read_flow_run, crashed) if client.read_flow(run.flow_id).name == "faults-test"
        ]
        assert len(ours) == 1
        assert client.read_flow_run(ours[0].id).state.type.value == "CRASHED"
    assert _items(tables["video_jobs"]) == {"job-1"}


def flow_writing_three(table: str) -> str:
    """``write_three`` as a Prefect flow run (the child dies inside it)."""
    from prefect import flow

    return flow(name="faults-test")(write_three)(table)
