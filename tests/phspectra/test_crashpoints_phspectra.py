"""Crash-point sweep of phspectra-survey: the flow dies (SIGKILL) at a write, the product recovers, nothing is
lost, duplicated or left RUNNING (docs/design.md, "Fault model").

Recovery is only what the product itself runs: a process worker reports the dead flow run Crashed
(``report_crashed_runs``), and once the dead fitters' leases expired (every claim holds one, renewed while it
fits: the renewals are writes too) the scheduled ``records-reconcile`` repairs the records the dead run held,
then either the scheduled ``phspectra-sweep-stuck`` (even points) or the documented re-run with ``run_id`` (odd points).
"""

from __future__ import annotations

import time

import pytest

from tasks import reconcile
from tasks.core.state_store import to_plain
from tasks.phspectra import survey as ph
from tests.helpers.crashpoints import count_writes, crash_points, killed, report, report_crashed_runs, run_child
from tests.helpers.phspectra_survey import direct_rows, fits_cube, output_rows, wait_until_leases_expire

pytestmark = pytest.mark.crashpoints  # `make test-sweep` takes every write; by hand 3 sampled points

SURVEY = "grs-crash"
CALL = "flows.phspectra_survey:phspectra_survey"
LEASE_S = 8.0  # short, so recovery waits little; long enough that no background renewal fires in a run this small


def _recover(run_id: str, cube_url: str, by_resume: bool) -> str:
    """What the product runs after the crash; returns which path finished the run."""
    from flows.phspectra_survey import phspectra_survey, phspectra_sweep_stuck

    report_crashed_runs()
    wait_until_leases_expire(run_id)  # a live lease is never taken: the maintenance flows act once it expired
    reconcile.reconcile_rows(["phspectra"], dry_run=False)  # the records-reconcile flow's task body
    if not by_resume:
        phspectra_sweep_stuck(survey=SURVEY)
        if ph.get_run(run_id) is not None:
            return "sweeper"
    # the documented re-run: the same parameters with the run's id (a run never recorded starts afresh)
    try:
        phspectra_survey(cube_url=cube_url, survey=SURVEY, run_id=run_id, chunk_size=6, workers=2)
    except RuntimeError:  # a run ending FAILED fails its flow; the invariants below still hold
        pass
    return "resume"


@pytest.mark.timeout(900)
def test_phspectra_survives_a_crash_at_every_write(tables, store_root, tmp_path):
    cube_url = fits_cube(tmp_path, ny=3, nx=6, n_channels=48, nan_channels=2)  # 18 spectra, 3 chunks of 6
    expected = direct_rows(cube_url, {})
    kwargs = {"cube_url": cube_url, "survey": SURVEY, "chunk_size": 6, "workers": 2, "lease_seconds": LEASE_S}
    writes = count_writes(CALL, {**kwargs, "run_id": "counted"}, tmp_path / "writes.log")
    assert {w.kind for w in writes} >= {"dynamodb:put:" + tables["phspectra_runs"], "objects:put_bytes:chunks"}
    points = crash_points(writes)
    paths: dict[str, int] = {}
    for index, number in enumerate(points):
        run_id, when = f"crash-{number}-{index % 2}", ("after", "before")[index % 3 == 2]
        began = time.perf_counter()
        result = run_child(CALL, {**kwargs, "run_id": run_id}, f"{number}:kill:{when}")
        child_s = time.perf_counter() - began
        assert killed(result), f"point {number} ({writes[number - 1]}) did not kill the child:\n{result.stderr[-2000:]}"
        path = _recover(run_id, cube_url, by_resume=index % 2 == 1)
        print(
            f"point {number} {when}: child {child_s:.1f}s, "
            f"recovery by {path} {time.perf_counter() - began - child_s:.1f}s"
        )
        paths[path] = paths.get(path, 0) + 1

        where = f"crash at write {number} {when} ({writes[number - 1]}), recovered by {path}"
        run = to_plain(ph.get_run(run_id))
        chunks = to_plain(ph.list_chunks(run_id))
        statuses = [c["status"] for c in chunks]
        assert run["status"] in ("COMPLETED", "FAILED"), f"{where}: run left {run['status']}"
        assert (run["jobs_completed"], run["jobs_failed"]) == (statuses.count("COMPLETED"), statuses.count("FAILED")), (
            where
        )
        assert len(chunks) == run["jobs_total"] == 3, where
        rows = output_rows(store_root, SURVEY, run_id)  # asserts no spectrum twice
        if run["status"] == "COMPLETED":
            assert rows == expected and statuses == ["COMPLETED"] * 3, where
        else:
            assert run.get("error"), f"{where}: FAILED without a reason"
        assert reconcile.disagreements(["phspectra"]) == [], where
    report(f"phspectra: {len(points)} crash points exercised of {len(writes)} writes; recovered by {paths}")
