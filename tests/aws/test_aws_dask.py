"""An existing Dask cluster: `dask scheduler` and two `dask worker` processes on loopback, used by
`phspectra-survey` (``dask_address``) and `ndjson-merge` (``dask_scheduler``) started with
`prefect deployment run` and run by a process worker, objects on S3 (moto). One Dask worker is SIGKILLed in
the middle of each run: the run still completes, the records are exact and no output is written twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deployments.dynamodb_local import free_port, port_open
from tasks.core import state_store
from tasks.core.object_store import ObjectStore
from tasks.etl import keys as etl_keys
from tasks.phspectra import keys as phspectra_keys
from tests.helpers.crashpoints import REPO_ROOT, child_env
from tests.helpers.prefect_runs import Worker, deploy_from_prefect_yaml, wait_for_runs

DASK = str(Path(sys.executable).with_name("dask"))
KILL_ON_TASK = "DASK_TEST_KILL_ON_TASK"


def dask_setup(worker) -> None:
    """Dask preload (``--preload tests/aws/test_aws_dask.py``): SIGKILL this worker when a task named
    ``$DASK_TEST_KILL_ON_TASK-…`` starts executing on it, i.e. in the middle of a run."""
    prefix = os.environ.get(KILL_ON_TASK)
    if not prefix:
        return
    from distributed.diagnostics.plugin import WorkerPlugin

    class KillOnStart(WorkerPlugin):
        def transition(self, key, start, finish, **kwargs):
            name = key[0] if isinstance(key, tuple) else key
            if finish == "executing" and str(name).startswith(prefix):
                os.kill(os.getpid(), signal.SIGKILL)

    worker.plugins["kill-on-start"] = KillOnStart()


class DaskCluster:
    """A `dask scheduler` and `dask worker` processes (no nanny: a killed worker stays dead, like a lost machine)."""

    def __init__(self, folder: Path, env: dict[str, str]):
        self.folder, self.env, self.processes = folder, env, {}
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self._start("scheduler", [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(self.port), "--no-dashboard"])
        deadline = time.monotonic() + 60
        while not port_open("127.0.0.1", self.port):
            assert time.monotonic() < deadline and self.processes["scheduler"].poll() is None, self.log("scheduler")
            time.sleep(0.2)

    def _start(self, name: str, args: list[str], extra: dict[str, str] | None = None) -> None:
        with open(self.folder / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                args,
                cwd=REPO_ROOT,
                env={**self.env, **(extra or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def add_worker(self, name: str, extra: dict[str, str] | None = None, preload: bool = False) -> None:
        """One single-threaded worker process with a small memory limit."""
        args = [
            DASK,
            "worker",
            self.address,
            "--name",
            name,
            "--nthreads",
            "1",
            "--no-nanny",
            "--memory-limit",
            "1GiB",
            "--no-dashboard",
            "--local-directory",
            str(self.folder / name),
        ]
        if preload:
            args += ["--preload", str(Path(__file__).resolve())]
        self._start(name, args, extra)

    def wait_workers(self, names: set[str], timeout: float = 90) -> None:
        """Wait until exactly the workers ``names`` are connected."""
        from distributed import Client

        with Client(self.address, timeout=30) as client:
            deadline = time.monotonic() + timeout
            while {w["name"] for w in client.scheduler_info(n_workers=-1)["workers"].values()} != names:
                assert time.monotonic() < deadline, {n: self.log(n) for n in names}
                time.sleep(0.3)

    def log(self, name: str) -> str:
        """The end of one process's log."""
        return (self.folder / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """Kill every process of the cluster."""
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=30)


def deployment_run(deployment: str, parameters: dict) -> str:
    """`prefect deployment run NAME --params JSON`, as an operator starts a run; returns its output."""
    from prefect.settings import PREFECT_API_URL

    result = subprocess.run(
        [sys.executable, "-m", "prefect", "deployment", "run", deployment, "--params", json.dumps(parameters)],
        cwd=REPO_ROOT,
        env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


@pytest.mark.sweep  # a Dask cluster and a worker of processes: in `make test-sweep`, which CI runs
@pytest.mark.timeout(600)  # two flow-run processes and two Dask workers that import the project: slow on a busy machine
def test_survey_and_merge_on_an_existing_dask_cluster_survive_a_killed_worker(
    tables, s3_base, s3_endpoint, tmp_path, monkeypatch
):
    from deployments.samples.phspectra import synthetic_cube, write_fits
    from flows.etl import ndjson_ingest
    from tasks.phspectra import survey as ph
    from tests.helpers.phspectra_survey import direct_rows

    for name, value in {
        "ETL_EXPECTED_FILE_SIZE_MB": "0.001",
        "ETL_SIZE_TOLERANCE_PERCENT": "99",
        "ETL_MAX_FILES_PER_MANIFEST": "4",
        "ETL_NUM_STATUS_SHARDS": "2",
    }.items():
        monkeypatch.setenv(name, value)
    # objects on moto's S3, so the catalog on moto's Glue (a database of this test's own: the server is shared)
    database = f"db_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_GLUE", s3_endpoint)
    monkeypatch.setenv("ETL_CATALOG_DATABASE", database)
    store, name = ObjectStore.from_url(s3_base), f"dask-{uuid.uuid4().hex[:6]}"
    deployments = deploy_from_prefect_yaml(tmp_path, {"phspectra-survey", "ndjson-merge"}, f"pool-{name}", name)
    cluster = DaskCluster(tmp_path, child_env())
    worker = Worker(f"pool-{name}", tmp_path / "worker.log")
    try:
        # worker "doomed" dies right after its first DynamoDB write lands: the claim of a chunk it was given
        cluster.add_worker("doomed", {"PIPELINES_FAULT": "1:kill:after"})
        cluster.add_worker("steady")
        cluster.wait_workers({"doomed", "steady"})
        store.put_file("cubes/cube.fits", write_fits(synthetic_cube(ny=3, nx=4, n_channels=64), tmp_path / "cube.fits"))
        cube_url, params = store.url_for("cubes/cube.fits"), {"beta": 3.0, "max_refine_iter": 2}
        run_id = str(uuid.uuid4())
        deployment_run(
            deployments["phspectra-survey"],
            {
                "cube_url": cube_url,
                "survey": "dask-s3",
                "chunk_size": 3,
                "fit_params": params,
                "run_id": run_id,
                "dask_address": cluster.address,
            },
        )
        [survey_run] = wait_for_runs(deployments["phspectra-survey"], 1, worker=worker)
        assert cluster.processes["doomed"].wait(timeout=30) == -signal.SIGKILL, cluster.log("doomed")
        assert survey_run.state_name == "Completed", worker.tail() + cluster.log("steady")

        # the merge: a manifest left pending (its launch failed), started by an operator on the cluster
        urls, ids = [], []
        for i in range(4):
            rows = [{"id": f"r{i}-{k}", "k": k} for k in range(5)]
            key = etl_keys.input_key("2026-03-01", f"f{i}.ndjson")
            store.put_bytes(key, b"".join(json.dumps(r).encode() + b"\n" for r in rows))
            urls.append(store.url_for(key))
            ids += [r["id"] for r in rows]
        [manifest] = ndjson_ingest(file_urls=urls, merge_deployment="ndjson-merge/not-deployed")["manifests"]
        cluster.add_worker("doomed-too", {KILL_ON_TASK: "merge_part"}, preload=True)
        cluster.wait_workers({"doomed-too", "steady"})
        deployment_run(
            deployments["ndjson-merge"],
            {
                "date_prefix": "2026-03-01",
                "manifest_name": manifest,
                "dask_scheduler": cluster.address,
                "target_file_mb": 0.00001,  # one part per file: both Dask workers get parts
            },
        )
        [merge_run] = wait_for_runs(deployments["ndjson-merge"], 1, worker=worker)
        assert cluster.processes["doomed-too"].wait(timeout=30) == -signal.SIGKILL, cluster.log("doomed-too")
        assert merge_run.state_name == "Completed", worker.tail() + cluster.log("steady")
    finally:
        worker.stop()
        cluster.stop()

    # the survey: counters exact, each spectrum exactly once and equal to a direct fit, one chunk fitted twice
    run = state_store.to_plain(ph.get_run(run_id))
    assert (run["status"], run["jobs_total"], run["jobs_completed"], run["jobs_failed"]) == ("COMPLETED", 4, 4, 0)
    chunks = state_store.to_plain(ph.list_chunks(run_id))
    assert {c["status"] for c in chunks} == {"COMPLETED"} and sorted(c["attempts"] for c in chunks) == [1, 1, 1, 2]
    parquet = sorted(store.list(phspectra_keys.decomposition_prefix("dask-s3", run_id)))
    assert parquet == [phspectra_keys.decomposition_key("dask-s3", run_id, s) for s in (0, 3, 6, 9)]
    rows = [row for key in parquet for row in ph.read_parquet(store, key).to_pylist()]
    got = {
        (r["x"], r["y"]): list(zip(r["component_amplitudes"], r["component_means"], r["component_stddevs"]))
        for r in rows
    }
    assert len(rows) == len(got) == 12 and got == direct_rows(cube_url, params)
    # the merge: four parts, every line exactly once, every file completed
    parts = sorted(store.list(etl_keys.merged_output_prefix("2026-03-01")))
    assert parts == [etl_keys.merged_part_key("2026-03-01", manifest, p) for p in range(4)]
    merged = []
    for key in parts:
        with store.open(key) as body:
            merged += pq.read_table(pa.BufferReader(body.read())).column("id").to_pylist()
    assert sorted(merged) == sorted(ids)
    statuses = [i.get("status", "") for i in state_store.scan_all(tables["etl_file_tracking"])]
    assert sorted(s.split("#")[0] for s in statuses if s) == ["completed"] * 5  # four files and the MANIFEST
    # and the date registered in the catalog (no CATALOG# record above: the registration did not fail)
    glue = boto3.client("glue", endpoint_url=s3_endpoint)
    (partition,) = glue.get_partitions(DatabaseName=database, TableName="merged_parquet")["Partitions"]
    assert partition["Values"] == ["2026-03-01"]
    assert partition["StorageDescriptor"]["Location"] == store.url_for(etl_keys.merged_output_prefix("2026-03-01"))
    columns = [c["Name"] for c in partition["StorageDescriptor"]["Columns"]]
    assert columns == ["id", "k", "_processing_timestamp", "_source_file"]
