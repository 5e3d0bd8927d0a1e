"""A row is data, not an order: a row a neighbour writes straight into a table (through an open door to DynamoDB)
never chooses what the stack runs or opens.

The rows here are written with the stack's own client, as such a neighbour would; the stack's own code paths then
meet them: ``gpu-sweep``'s resume, the restart path, a resumed start.
"""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from deployments import local_stack
from flows import gpu as gpu_flow
from tasks.core import seal, state_store
from tasks.core.config import table_name
from tasks.core.runtime import iso_ago
from tasks.gpu import jobs as gpu
from tests.helpers.gpu import HANG, PY, running_job

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local


def _marker_command(marker) -> str:
    """A command that leaves ``marker`` behind if it ever runs."""
    return f"{PY} -c 'import pathlib; pathlib.Path({json.dumps(str(marker))}).write_text(\"ran\")'"


def _forge_job(job_id: str, status: str, command: str, **extra) -> dict:
    """A job row written straight into ``ecs_job``, abandoned (an old ``updated_at``, no live owner), on local-0,
    which is held for it (the neighbour writes the node row too)."""
    stale = iso_ago(3600)
    row = {
        "job_id": job_id,
        "job_timestamp": stale,
        "cluster_name": "local",
        "num_nodes": "1",
        "assigned_nodes": ["local-0"],
        "submitted_container_inst_ids": [],
        "submitted_ecs_task_ids": [],
        "created_at": stale,
        "updated_at": stale,
        "retry": "0",
        "job_status": status,
        "command": command,
        "env": {},
        "backend": "local",
        **extra,
    }
    state_store.put(table_name("ecs_job"), row)
    node = gpu.get_node("local-0")
    state_store.put(table_name("ecs_node"), {**node, "node_status": gpu.NODE_ASSIGNED, "job_id": job_id})
    return row


def _nothing_ran(runner, marker) -> None:
    """The command never ran: no task process was started, and (after the time it would take) no marker."""
    pids = runner.backend.state_dir / "pids"
    assert not pids.is_dir() or not list(pids.iterdir())
    time.sleep(1.0)
    assert not marker.exists()


def _refused(job_id: str, why: str) -> None:
    job = gpu.get_job(job_id)
    assert job["job_status"] == gpu.JOB_FAILED, job
    assert why in job["failure_reason"]
    assert all(n["node_status"] == gpu.NODE_AVAILABLE for n in gpu.list_nodes())


@pytest.mark.parametrize("status", [gpu.JOB_RESTARTING, gpu.JOB_IN_PROGRESS, gpu.JOB_PENDING_RESTART])
def test_a_forged_job_row_is_failed_by_the_sweep_and_runs_nothing(gpu_env, tmp_path, status):
    marker = tmp_path / "forged-ran"
    _forge_job("job-forged", status, _marker_command(marker), bad_nodes=[], pending_restart_at=iso_ago(3600))
    result = gpu_flow.sweep(gpu_env, gpu_flow.PLAIN)
    assert result["jobs"] == {"job-forged": gpu.JOB_FAILED}
    _refused("job-forged", "carries no launch seal")
    _nothing_ran(gpu_env, marker)


def test_a_forged_row_on_the_restart_path_is_refused_before_it_claims_a_node(gpu_env, tmp_path):
    marker = tmp_path / "forged-ran"
    row = _forge_job(
        "job-forged", gpu.JOB_PENDING_RESTART, _marker_command(marker), bad_nodes=["local-0"], owner_token=gpu_env.token
    )
    outcome = gpu.restart_job(gpu_env, row, wait=False)
    assert outcome["action"] == "restart_refused" and "carries no launch seal" in outcome["reason"]
    _refused("job-forged", "carries no launch seal")
    _nothing_ran(gpu_env, marker)


def test_a_forged_row_resumed_directly_starts_no_task(gpu_env, tmp_path):
    marker = tmp_path / "forged-ran"
    row = _forge_job("job-forged", gpu.JOB_RESTARTING, _marker_command(marker))
    outcome = gpu.resume_start(gpu_env, row)
    assert outcome["action"] == "restart_failed" and "carries no launch seal" in outcome["reason"]
    _refused("job-forged", "carries no launch seal")
    _nothing_ran(gpu_env, marker)


@pytest.mark.parametrize(
    "change",
    [
        {"command": "MARKER"},
        {"env": {"PYTHONSTARTUP": "/tmp/evil.py"}},
        {"num_nodes": "3"},
        {"backend": "ecs"},
        {"launch_seal": "0" * 64},
    ],
    ids=["command", "env", "num_nodes", "backend", "seal"],
)
def test_a_sealed_row_changed_after_its_launch_is_refused(gpu_env, tmp_path, change):
    marker = tmp_path / "changed-ran"
    gpu.launch_job(gpu_env, "job-sealed", 1, HANG, nodes=["local-0"])
    job = running_job("job-sealed")
    assert job["launch_seal"] and job["launch_key_id"]
    changed = {k: _marker_command(marker) if v == "MARKER" else v for k, v in change.items()}
    stale = iso_ago(3600)
    # the neighbour also makes the job look abandoned mid-restart, so the sweep resumes its start
    state_store.put(
        table_name("ecs_job"),
        {**job, **changed, "job_status": gpu.JOB_RESTARTING, "retry": "1", "updated_at": stale, "owner_token": "x"},
    )
    first_task = job["submitted_ecs_task_ids"][0]
    gpu_flow.sweep(gpu_env, gpu_flow.PLAIN)
    job = gpu.get_job("job-sealed")
    assert job["job_status"] == gpu.JOB_FAILED
    assert "launch" in job["failure_reason"] or "backend" in job["failure_reason"]
    assert gpu.get_task(first_task)["task_status"] == gpu.TASK_TERMINATED  # what its launch started is stopped
    assert all(n["node_status"] == gpu.NODE_AVAILABLE for n in gpu.list_nodes())
    time.sleep(1.0)
    assert not marker.exists()
    assert sorted(os.listdir(gpu_env.backend.state_dir / "pids")) == [first_task]  # no second task started


def test_a_launch_without_a_key_refuses_and_writes_nothing(gpu_env, monkeypatch):
    monkeypatch.delenv(seal.KEY_ENV)
    with pytest.raises(seal.LaunchKeyMissing, match="no launch key"):
        gpu.launch_job(gpu_env, "job-unkeyed", 1, HANG)
    assert gpu.get_job("job-unkeyed") is None
    assert all(n["node_status"] == gpu.NODE_AVAILABLE for n in gpu.list_nodes())


def test_a_properly_launched_job_completes_through_the_sweep(gpu_env, tmp_path):
    marker = tmp_path / "launched-ran"
    gpu.launch_job(gpu_env, "job-good", 2, _marker_command(marker))
    deadline = time.monotonic() + 20
    while gpu.get_job("job-good")["job_status"] != gpu.JOB_COMPLETE and time.monotonic() < deadline:
        gpu_flow.sweep(gpu_env, gpu_flow.PLAIN)
        time.sleep(0.2)
    assert gpu.get_job("job-good")["job_status"] == gpu.JOB_COMPLETE
    assert marker.read_text() == "ran"


def test_seals_survive_a_key_rotation_by_key_id(monkeypatch):
    fields = {"command": "train", "env": {"A": "1"}}
    sealed = seal.seal("test", "row-1", fields)
    old_key = os.environ[seal.KEY_ENV]
    monkeypatch.setenv(seal.KEY_ENV, "ab" * 32)
    with pytest.raises(seal.SealBroken, match="does not know"):
        seal.verify("test", "row-1", fields, sealed)
    monkeypatch.setenv(seal.PREVIOUS_KEYS_ENV, old_key)
    seal.verify("test", "row-1", fields, sealed)
    with pytest.raises(seal.SealBroken, match="differs"):
        seal.verify("test", "row-2", fields, sealed)  # bound to its row: not movable to another id
    with pytest.raises(seal.SealBroken, match="differs"):
        seal.verify("other", "row-1", fields, sealed)  # bound to what it is for


def test_make_up_makes_the_launch_key_once_private_and_passes_it_on(tmp_path, monkeypatch):
    monkeypatch.setattr(local_stack, "DATA", tmp_path / ".data")
    monkeypatch.delenv(seal.KEY_ENV)
    assert local_stack.launch_key() is None
    made = local_stack.launch_key(create=True)
    path = tmp_path / ".data" / "secrets" / "launch-key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert local_stack.launch_key(create=True) == made  # kept: rows in flight carry seals made with it
    assert local_stack.local_env()[seal.KEY_ENV] == made
    monkeypatch.setenv(seal.KEY_ENV, made)
    assert len(seal.launch_key()[1]) == 32


# --------------------------------------------------------------------------- PHSpectra runs: what they open and write


def _phspectra_rows(tmp_path):
    """A run split properly, then: a RUN item forged beside it (its copy, unsealed, writing elsewhere) and the real
    one changed to write elsewhere too. Returns the folder both now name."""
    from tasks.phspectra import survey as ph
    from tests.helpers.phspectra_survey import fits_cube

    cube_url = fits_cube(tmp_path, ny=1, nx=4, n_channels=32, nan_channels=0)
    ph.split_cube("real", "grs-n", cube_url, chunk_size=2)
    real = ph.get_run("real")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    unsealed = {k: v for k, v in real.items() if k not in (seal.SEAL_ATTR, seal.KEY_ID_ATTR)}
    state_store.put(ph.runs_table(), {**unsealed, "PK": "forged", "output_url": elsewhere.as_uri()})
    state_store.put(ph.runs_table(), {**real, "output_url": elsewhere.as_uri()})
    return elsewhere


def test_forged_or_changed_phspectra_runs_are_closed_by_the_sweeper_and_write_nothing(tables, store_root, tmp_path):
    from flows.phspectra_survey import phspectra_sweep_stuck
    from tasks.phspectra import survey as ph

    elsewhere = _phspectra_rows(tmp_path)
    swept = phspectra_sweep_stuck(survey="grs-n", quiet_minutes=0)
    assert {run_id: entry["status"] for run_id, entry in swept.items()} == {"forged": "FAILED", "real": "FAILED"}
    assert "carries no launch seal" in ph.get_run("forged")["error"]
    assert "differs from what its launch sealed" in ph.get_run("real")["error"]
    assert not list(elsewhere.rglob("*"))


def test_a_changed_phspectra_run_is_not_resumed(tables, store_root, tmp_path):
    from tasks.phspectra import survey as ph

    elsewhere = _phspectra_rows(tmp_path)
    with pytest.raises(seal.SealBroken, match="differs"):
        ph.reopen_run("real")
    with pytest.raises(seal.SealBroken, match="no launch seal"):
        ph.complete_split("forged")
    assert ph.get_run("real")["status"] == "FAILED"
    assert not list(elsewhere.rglob("*"))


# --------------------------------------------------------------------------- re-validated where they are used


@pytest.mark.parametrize("mode", ["../../etc", "a/b", "x;rm"])
def test_a_video_jobs_mode_is_checked_where_it_names_a_key(mode):
    from tasks.core.keys import InvalidKey
    from tasks.video import keys as video_keys

    with pytest.raises(InvalidKey):
        video_keys.segment_key("job-1", 0, 2, mode)


def test_a_granule_file_outside_the_object_store_is_never_read(store_root, tmp_path):
    from tasks.records import cmr

    secret = tmp_path / "secret.cmr.json"
    secret.write_text("{}")
    with pytest.raises(cmr.CmrFileError, match="outside the object store"):
        cmr.read_limited(secret.as_uri())
    with pytest.raises(cmr.CmrFileError, match="outside the object store"):
        cmr.read_limited(cmr.file_url({"filename": f"{store_root.as_uri()}/../secret.cmr.json"}))


@pytest.mark.parametrize("change", [{"ip": "evil.example:80"}, {"ibdev": "mlx5_0 $(id)"}], ids=["ip", "ibdev"])
def test_a_node_row_that_names_no_address_or_device_starts_no_task(gpu_env, change):
    from tasks.gpu.backends import BackendError

    node = gpu.get_node("local-1")
    state_store.put(table_name("ecs_node"), {**node, **change})
    with pytest.raises(BackendError, match="not one"):
        gpu.launch_job(gpu_env, "job-odd-node", 2, HANG, nodes=["local-0", "local-1"])
    assert gpu.get_job("job-odd-node")["job_status"] == gpu.JOB_FAILED
    pids = gpu_env.backend.state_dir / "pids"
    assert not pids.is_dir() or not list(pids.iterdir())
