"""A phspectra chunk whose result meets a full disk waits for space (issue 53 item 5): its Parquet is not
published, the chunk goes back to PENDING with the reason (not FAILED, no counter moves) and the RUN stays RUNNING;
`phspectra-sweep-stuck` leaves it while the disk is full (no sweep counted, however many) and fits it once there is
room, and the run completes once with every spectrum fitted once.

The output store is a real tmpfs (as root; skipped cleanly otherwise).
"""

from __future__ import annotations

import pytest

from flows.phspectra_survey import phspectra_survey, phspectra_sweep_stuck
from tasks import reconcile
from tasks.core.state_store import to_plain
from tasks.phspectra import keys as phspectra_keys
from tasks.phspectra import survey as ph
from tests.helpers.disk import fill, hidden_parts, small_disk
from tests.helpers.phspectra_survey import direct_rows, fits_cube, output_rows

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

SURVEY, RUN_ID = "grs-full-disk", "full-disk-run"


def test_chunks_whose_results_meet_a_full_disk_wait_and_the_sweep_fits_them_once_there_is_room(
    tables, tmp_path, monkeypatch
):
    cube_url = fits_cube(tmp_path, ny=2, nx=6, n_channels=48, nan_channels=0)  # 12 spectra, 3 chunks of 4
    with small_disk(tmp_path / "disk", megabytes=8) as mount:
        root = mount / "objects"
        root.mkdir()
        monkeypatch.setenv("OBJECT_STORE_BASE_URL", root.as_uri())
        ph.split_cube(RUN_ID, SURVEY, cube_url, chunk_size=4)  # the chunks' inputs are on the disk ...
        filler = fill(root)  # ... then it fills: every chunk's Parquet meets ENOSPC

        with pytest.raises(RuntimeError, match="3 waiting for space"):  # the run is unfinished, not failed
            phspectra_survey(run_id=RUN_ID, workers=1)

        run = to_plain(ph.get_run(RUN_ID))
        assert (run["status"], run["jobs_completed"], run["jobs_failed"]) == ("RUNNING", 0, 0)
        chunks = [to_plain(c) for c in ph.list_chunks(RUN_ID)]
        assert [c["status"] for c in chunks] == ["PENDING"] * 3
        assert all("No space left" in c["waiting_for_space"] and c["waiting_for_space_since"] for c in chunks)
        assert not any("error" in c or "lease_expires_at" in c for c in chunks)
        assert list(root.rglob("*.parquet")) == [] and not hidden_parts(root)

        for _ in range(3):  # still full: left as it is, and never given up (max_sweeps is 1)
            assert phspectra_sweep_stuck(survey=SURVEY, max_sweeps=1) == {}
        run = to_plain(ph.get_run(RUN_ID))
        assert run["status"] == "RUNNING" and not run.get("sweep_attempts") and not run.get("space_sweeps")
        assert reconcile.disagreements(["phspectra"]) == []

        filler.unlink()
        swept = phspectra_sweep_stuck(survey=SURVEY, max_sweeps=1)
        assert swept[RUN_ID] == {"redriven": [0, 4, 8], "status": "COMPLETED"}

        run = to_plain(ph.get_run(RUN_ID))
        assert (run["status"], run["jobs_completed"], run["jobs_failed"], run["space_sweeps"]) == ("COMPLETED", 3, 0, 1)
        assert "error" not in run and not run.get("sweep_attempts")
        chunks = [to_plain(c) for c in ph.list_chunks(RUN_ID)]
        assert [c["status"] for c in chunks] == ["COMPLETED"] * 3
        assert not any("waiting_for_space" in c for c in chunks)
        assert output_rows(root, SURVEY, RUN_ID) == direct_rows(cube_url, {})  # every spectrum once, as fitted
        assert len(list((root / phspectra_keys.decomposition_prefix(SURVEY, RUN_ID)).rglob("*.parquet"))) == 3
        assert phspectra_sweep_stuck(survey=SURVEY) == {}


def test_a_slow_lane_whose_write_meets_a_full_disk_waits_and_the_sweep_refits_once_there_is_room(
    tables, tmp_path, monkeypatch
):
    cube_url = fits_cube(tmp_path, ny=1, nx=4, n_channels=48, nan_channels=0)  # 4 spectra, 1 chunk
    run_id = f"{RUN_ID}-slow"
    with small_disk(tmp_path / "disk", megabytes=8) as mount:
        root = mount / "objects"
        root.mkdir()
        monkeypatch.setenv("OBJECT_STORE_BASE_URL", root.as_uri())
        ph.split_cube(run_id, SURVEY, cube_url, chunk_size=4)
        fitted = ph.fit_chunk(run_id, 0, time_limit_s=1e-6)  # its spectra ran past the limit: the slow lane owes them
        assert fitted["outcome"] == "completed" and fitted["n_timed_out"] > 0
        published = (root / phspectra_keys.decomposition_key(SURVEY, run_id, 0)).read_bytes()
        filler = fill(root)

        with pytest.raises(RuntimeError, match="1 waiting for space"):  # its slow lane's Parquet met the full disk
            phspectra_survey(run_id=run_id, workers=1)

        (chunk,) = [to_plain(c) for c in ph.list_chunks(run_id)]
        assert chunk["status"] == "COMPLETED" and chunk["n_timed_out"] == fitted["n_timed_out"]
        assert "No space left" in chunk["waiting_for_space"]
        assert (root / chunk["output_key"]).read_bytes() == published and not hidden_parts(root)  # untouched
        assert to_plain(ph.get_run(run_id))["status"] == "RUNNING"
        for _ in range(2):
            assert phspectra_sweep_stuck(survey=SURVEY, max_sweeps=1) == {}

        filler.unlink()
        assert phspectra_sweep_stuck(survey=SURVEY, max_sweeps=1)[run_id]["status"] == "COMPLETED"
        (chunk,) = [to_plain(c) for c in ph.list_chunks(run_id)]
        assert chunk["n_timed_out"] == 0 and "waiting_for_space" not in chunk
        run = to_plain(ph.get_run(run_id))
        assert (run["status"], run["jobs_completed"], run["jobs_failed"]) == ("COMPLETED", 1, 0)
        assert output_rows(root, SURVEY, run_id) == direct_rows(cube_url, {})
