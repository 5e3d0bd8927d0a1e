"""The S3 path end to end: moto's S3 server on loopback (tests/helpers/s3.py) as the object store of every pipeline.

OBJECT_STORE_BASE_URL is s3://bucket/pipelines and AWS_ENDPOINT_URL_S3 points at the server, so the code
under test is the code that runs against AWS. Large objects go up in multipart and stream both ways; a
writer killed mid-upload leaves no half object.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
import tracemalloc
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest

from tasks.core import state_store
from tasks.core.keys import InvalidKey
from tasks.core.object_store import ObjectNotFound, ObjectStore, S3Store
from tasks.etl import keys as etl_keys
from tasks.phspectra import keys as phspectra_keys
from tasks.video import keys as video_keys
from tests.helpers.crashpoints import killed, run_child
from tests.helpers.prefect_runs import Worker, deploy_from_prefect_yaml, wait_for_runs
from tests.helpers.s3 import object_keys

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

MiB = 1024 * 1024
BIG = 13 * MiB  # two parts of the default 8 MiB
HUGE = 26 * MiB  # six parts of 5 MiB: memory bounded by the parts in flight, not by the object


def big_file(path: Path, size: int = BIG) -> Path:
    """A file of ``size`` bytes that differ part to part (so a misplaced part shows)."""
    with open(path, "wb") as handle:
        for n in range(size // MiB):
            handle.write(hashlib.sha256(str(n).encode()).digest() * (MiB // 32))
        handle.write(b"x" * (size % MiB))
    return path


def digest(stream) -> str:
    """SHA-256 of a stream, read a MiB at a time."""
    sha = hashlib.sha256()
    while piece := stream.read(MiB):
        sha.update(piece)
    return sha.hexdigest()


def parts_of(store: S3Store, key: str) -> int:
    """How many parts S3 says the object was uploaded in (1 for a single PUT)."""
    etag = store._client.head_object(Bucket=store.bucket, Key=store._key(key))["ETag"].strip('"')
    return int(etag.split("-")[1]) if "-" in etag else 1


def peak_memory(call) -> int:
    """Peak bytes Python allocated (every thread) while ``call()`` ran."""
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


class _Generated:
    """A read-only stream of ``size`` bytes made as they are read: no copy of the whole exists anywhere."""

    def __init__(self, size: int):
        self.left, self.sha = size, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = bytes([self.left % 251]) * n
        self.left -= n
        self.sha.update(data)
        return data


# --------------------------------------------------------------------------- the object store on S3


def test_large_objects_go_up_in_multipart_and_stream_both_ways(s3_base, tmp_path, monkeypatch):
    store = ObjectStore.from_url(s3_base)
    source = big_file(tmp_path / "big.bin")
    want = digest(open(source, "rb"))
    store.put_file("video/big.bin", source)
    assert parts_of(store, "video/big.bin") == 2 and store.size("video/big.bin") == BIG

    # with 5 MiB parts, a 26 MiB object goes up and comes down with far less than itself in memory
    monkeypatch.setenv("OBJECT_STORE_MULTIPART_MB", "5")
    huge, store5 = big_file(tmp_path / "huge.bin", HUGE), ObjectStore.from_url(s3_base)
    assert peak_memory(lambda: store5.put_file("video/huge.bin", huge)) < HUGE / 2
    assert parts_of(store5, "video/huge.bin") == 6 and store5.size("video/huge.bin") == HUGE
    assert peak_memory(lambda: store5.download("video/huge.bin", tmp_path / "back.bin")) < HUGE / 2
    assert digest(open(tmp_path / "back.bin", "rb")) == digest(open(huge, "rb"))
    with store5.open("video/huge.bin") as body:  # read from the network as it is consumed
        assert peak_memory(lambda: digest(body)) < 4 * MiB
    store5.delete("video/huge.bin")
    # a server-side multipart copy; a stream of unknown length goes up part by part
    store.copy("video/big.bin", "video/copy.bin")
    assert parts_of(store, "video/copy.bin") == 2 and digest(store.open("video/copy.bin")) == want
    generated = _Generated(BIG)
    store.put_stream("video/generated.bin", generated)
    assert (
        parts_of(store, "video/generated.bin") == 2
        and digest(store.open("video/generated.bin")) == generated.sha.hexdigest()
    )
    # small objects stay one PUT; everything lives under the prefix
    store.put_bytes("small.json", b"{}")
    assert parts_of(store, "small.json") == 1 and store.get_bytes("small.json") == b"{}"
    bucket = s3_base.split("/")[2]
    assert object_keys(os.environ["AWS_ENDPOINT_URL_S3"], bucket) == [
        "pipelines/small.json",
        "pipelines/video/big.bin",
        "pipelines/video/copy.bin",
        "pipelines/video/generated.bin",
    ]
    assert store.incomplete_uploads() == []


def test_odd_input_on_s3_gets_clear_errors(s3_base, tmp_path):
    store = ObjectStore.from_url(s3_base)
    for call in (
        store.get_bytes,
        store.open,
        store.size,
        lambda k: store.download(k, tmp_path / "x"),
        lambda k: store.copy(k, "elsewhere"),
    ):
        with pytest.raises(ObjectNotFound, match=f"{s3_base}/missing/key"):
            call("missing/key")
    for bad in ("../escape", "/abs", "a/../../b", ""):
        with pytest.raises(InvalidKey):
            store.put_bytes(bad, b"x")
    assert not store.exists("missing/key") and not store.delete("missing/key")
    store.put_stream("empty", _Generated(0))  # an empty stream is an empty object, not an error
    assert store.size("empty") == 0 and list(store.list("")) == ["empty"]
    with pytest.raises(ValueError, match="without a bucket"):
        ObjectStore.from_url("s3:///prefix")
    # a presigned PUT from a client that has no credentials lands where the pipeline reads it
    request = urllib.request.Request(
        store.presign_put("input/up.bin"),
        data=b"uploaded",
        method="PUT",
        headers={"Content-Type": "application/octet-stream"},  # urllib's default form type makes moto drop the body
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    assert store.get_bytes("input/up.bin") == b"uploaded"


def upload_dying_between_parts(base_url: str, key: str, path: str) -> None:
    """Child body: upload ``path`` and SIGKILL this process as soon as the first part has landed."""
    store = ObjectStore.from_url(base_url)
    store._client.meta.events.register("after-call.s3.UploadPart", lambda **_: os.kill(os.getpid(), signal.SIGKILL))
    store.put_file(key, path)


def upload(base_url: str, key: str, path: str) -> str:
    """Child body: one ``put_file`` (a crash point of the injector)."""
    return ObjectStore.from_url(base_url).put_file(key, path)


def test_a_writer_killed_mid_upload_leaves_no_half_object(s3_base, tmp_path):
    store = ObjectStore.from_url(s3_base)
    source = str(big_file(tmp_path / "big.bin"))
    args = {"base_url": s3_base, "key": "out/final.mp4", "path": source}
    result = run_child("tests.aws.test_aws_s3:upload_dying_between_parts", args)
    assert killed(result), result.stderr[-2000:]
    # S3 shows nothing at the key until the last part completes the upload
    assert not store.exists("out/final.mp4") and list(store.list("")) == []
    assert [u["Key"] for u in store.incomplete_uploads()] == ["pipelines/out/final.mp4"]
    # the crash points of the write itself: before it nothing, after it the whole object
    assert killed(run_child("tests.aws.test_aws_s3:upload", args, "1:kill:before"))
    assert not store.exists("out/final.mp4")
    assert killed(run_child("tests.aws.test_aws_s3:upload", args, "1:kill:after"))
    assert digest(store.open("out/final.mp4")) == digest(open(source, "rb"))
    # the dead writer's parts are cleaned up (as the bucket's AbortIncompleteMultipartUpload rule would)
    # (moto dates every upload 2010-11-10, so the age threshold itself cannot be tested here)
    assert store.abort_incomplete_uploads(older_than_s=0) == 1 and store.incomplete_uploads() == []
    assert store.exists("out/final.mp4")
    print("crash points exercised: kill between parts, 1:kill:before, 1:kill:after")


@pytest.mark.parametrize("when", ["before", "after"])
def test_the_new_writes_are_crash_points(s3_base, tmp_path, when):
    """put_stream, multipart put_bytes and aborting an upload: before the write nothing changed, after it all did."""
    from tasks.core import faults

    s3, local = ObjectStore.from_url(s3_base), ObjectStore.from_url(tmp_path.as_uri())
    landed = when == "after"
    for store in (s3, local):
        for write in (
            lambda store=store: store.put_stream("s", _Generated(BIG)),
            lambda store=store: store.put_bytes("b", b"7" * (8 * MiB)),
        ):
            with faults.inject(at=1, mode="raise", when=when), pytest.raises(faults.InjectedFault):
                write()
        assert (store.exists("s"), store.exists("b")) == (landed, landed)
        if landed:
            assert store.size("s") == BIG and digest(store.open("b")) == hashlib.sha256(b"7" * (8 * MiB)).hexdigest()
    assert list(local.root.rglob("*.part")) == []  # no temp file left behind by the local store either
    s3._client.create_multipart_upload(Bucket=s3.bucket, Key=s3._key("dead/upload"))
    with faults.inject(at=1, mode="raise", when=when), pytest.raises(faults.InjectedFault):
        s3.abort_incomplete_uploads(older_than_s=0)
    assert len(s3.incomplete_uploads()) == (0 if landed else 1)


# --------------------------------------------------------------------------- every pipeline through S3


def test_phspectra_survey_on_s3(tables, s3_base, tmp_path):
    from deployments.samples.phspectra import synthetic_cube, write_fits
    from flows.phspectra_survey import phspectra_survey
    from tasks.phspectra import survey as ph
    from tests.helpers.phspectra_survey import direct_rows

    store = ObjectStore.from_url(s3_base)
    store.put_file("cubes/grs.fits", write_fits(synthetic_cube(ny=3, nx=4, n_channels=64), tmp_path / "cube.fits"))
    cube_url = store.url_for("cubes/grs.fits")
    params = {"beta": 3.0, "max_refine_iter": 2}
    summary = phspectra_survey(cube_url=cube_url, survey="grs-s3", chunk_size=5, fit_params=params, workers=2)

    run_id = summary["run_id"]
    run = state_store.to_plain(ph.get_run(run_id))
    assert (run["status"], run["jobs_total"], run["jobs_completed"], run["jobs_failed"]) == ("COMPLETED", 3, 3, 0)
    parquet = sorted(store.list(phspectra_keys.decomposition_prefix("grs-s3", run_id)))
    assert parquet == [phspectra_keys.decomposition_key("grs-s3", run_id, s) for s in (0, 5, 10)]
    rows = [row for key in parquet for row in ph.read_parquet(store, key).to_pylist()]
    got = {
        (r["x"], r["y"]): list(zip(r["component_amplitudes"], r["component_means"], r["component_stddevs"]))
        for r in rows
    }
    assert len(rows) == len(got) == 12  # each spectrum exactly once
    assert got == direct_rows(cube_url, params)
    assert sorted(store.list(f"chunks/{run_id}/")) == [phspectra_keys.chunk_npz_key(run_id, s) for s in (0, 5, 10)]


def test_video_chunk_inference_reassembly_and_delete_cleanup_on_s3(tables, s3_base, tmp_path):
    from flows.video import video_delete_cleanup, video_process
    from tasks.video import jobs as v
    from tasks.video.ffmpeg import make_test_video, probe

    store = ObjectStore.from_url(s3_base)
    source = make_test_video(tmp_path / "source.mp4", 3.0, 10, keyframe_seconds=1.0)
    job = v.create_job(mode="grayscale", segment_seconds=1.0)
    job_id = job["job_id"]
    assert job["upload_target"].startswith(os.environ["AWS_ENDPOINT_URL_S3"])  # a presigned PUT, as in the seed
    request = urllib.request.Request(
        job["upload_target"], data=source.read_bytes(), method="PUT", headers={"Content-Type": "video/mp4"}
    )
    urllib.request.urlopen(request, timeout=30).close()

    done = video_process(job_id=job_id, segment_seconds=1.0, mode="grayscale", segment_retry_delays=[0, 0])
    assert (done["status"], done["total_segments"], done["final_key"]) == ("completed", 3, video_keys.final_key(job_id))
    store.download(done["final_key"], tmp_path / "final.mp4")
    final = probe(tmp_path / "final.mp4")
    assert final.frames == done["final_frames"] and abs(final.frames - 30) <= 2
    records = v.completions(job_id)
    assert set(store.list("")) == (
        {video_keys.source_key(job_id), video_keys.final_key(job_id)}
        | {r["segment_key"] for r in records}
        | {r["output_key"] for r in records}
    )

    assert v.request_delete(job_id)["status"] == "deleted"
    assert video_delete_cleanup() == {job_id: {"objects": 1 + 3 + 3 + 1, "completion_records": 3, "locks": 1}}
    assert list(store.list("")) == [] and v.completions(job_id) == []
    assert state_store.get_item(tables["video_jobs"], {"job_id": job_id})["status"] == "deleted"


def test_records_dead_letter_archive_and_replay_on_s3(tables, s3_base):
    from flows.records import records_ingest, records_replay_dla
    from tasks.core.runtime import today_iso
    from tasks.records import dead_letter
    from tasks.records import messages as records_messages
    from tasks.records.keys import dead_letter_prefix
    from tests.helpers.records import message

    store = ObjectStore.from_url(s3_base)
    good = message("completed", "exec-1", 1000, granule="G1")
    fixed = json.dumps(message("completed", "exec-2", 2000, granule="G2"))
    conflict = message("completed", "exec-3", 3000, granule="G1", collection=("OTHER", "002"))
    bodies = [json.dumps(good), fixed[:-5], json.dumps(conflict)]  # text bodies, as SQS delivers them
    summary = records_ingest(bodies)
    assert (summary["messages"], summary["ok"], summary["archived"]) == (3, 1, 2)
    day = today_iso()
    broken, clash = records_messages.message_id(fixed[:-5]), records_messages.message_id(bodies[2])
    assert sorted(store.list(dead_letter_prefix(day))) == sorted(
        f"{dead_letter_prefix(day)}{i}.json" for i in (broken, clash)
    )

    # an operator repairs the truncated body in the S3 archive; the collection conflict stays
    key = f"{dead_letter_prefix(day)}{broken}.json"
    store.put_bytes(key, json.dumps(dict(dead_letter.read(key), body=fixed)).encode())
    result = records_replay_dla(day)
    assert result["written"] == [broken]
    assert list(store.list("")) == [f"{dead_letter_prefix(day, failed=True)}{clash}.json"]
    assert dead_letter.read(result["failed"][clash])["message"] == conflict
    granules = {g["granuleId"]: g["status"] for g in state_store.scan_all(tables["granules"])}
    assert granules == {"G1": "completed", "G2": "completed"}


ETL_DAY, ETL_LATE_DAY, ETL_TODAY = "2026-02-01", "2026-02-02", "2026-02-10"


@pytest.fixture
def etl_s3(tables, s3_base, monkeypatch):
    """ETL settings for small files: 1 KiB ± 99%, 4 files per manifest."""
    for name, value in {
        "ETL_EXPECTED_FILE_SIZE_MB": "0.001",
        "ETL_SIZE_TOLERANCE_PERCENT": "99",
        "ETL_MAX_FILES_PER_MANIFEST": "4",
        "ETL_MIN_FILES_FOR_PARTIAL_BATCH": "1",
        "ETL_NUM_STATUS_SHARDS": "2",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ETL_NOTIFY_BLOCK", raising=False)
    return ObjectStore.from_url(s3_base)


@pytest.mark.sweep  # a process worker runs the merge: `make test-sweep`, which CI runs
def test_etl_ingest_merge_on_a_worker_and_flush_on_s3(etl_s3, tables, tmp_path):
    """Ingest starts each merge as its own flow run of the `ndjson-merge` deployment, which a process worker runs."""
    import uuid

    import pyarrow.parquet as pq

    from flows.etl import ndjson_flush_orphans, ndjson_ingest

    store, name = etl_s3, f"aws-{uuid.uuid4().hex[:6]}"
    deployments = deploy_from_prefect_yaml(tmp_path, {"ndjson-merge"}, f"pool-{name}", name)
    worker = Worker(f"pool-{name}", tmp_path / "worker.log")
    try:
        lines = {}
        urls = []
        for day, n in ((ETL_DAY, 4), (ETL_LATE_DAY, 2)):  # one full batch; two files the flush must pick up
            for i in range(n):
                rows = [{"id": f"{day}-{i}-{k}", "n": k, "nested": {"k": [k]}} for k in range(3)]
                key = etl_keys.input_key(day, f"part-{i}.ndjson")
                store.put_bytes(key, b"".join(json.dumps(r).encode() + b"\n" for r in rows) + b"{broken\n" * (i == 1))
                urls.append(store.url_for(key))
                lines.update({r["id"]: r for r in rows})
        bad = store.url_for(etl_keys.input_key(ETL_DAY, "empty.ndjson"))
        store.put_bytes(etl_keys.input_key(ETL_DAY, "empty.ndjson"), b"")

        summary = ndjson_ingest(file_urls=urls + [bad], merge_deployment=deployments["ndjson-merge"])
        assert (summary["tracked"], summary["quarantined"], len(summary["manifests"]), summary["launched"]) == (
            6,
            1,
            1,
            1,
        )
        flushed = ndjson_flush_orphans(today=ETL_TODAY, merge_deployment=deployments["ndjson-merge"])
        assert flushed["orphaned_dates"] == {ETL_LATE_DAY: 2} and flushed["launched"] == 1
        # one run or two: a run still queued when the flush's manifest is written takes it too (no second event)
        deadline = time.monotonic() + 240
        while (
            sum(
                i.get("status") == "completed" and i["file_key"].startswith(etl_keys.MANIFEST_PREFIX)
                for i in state_store.scan_all(tables["etl_file_tracking"])
            )
            < 2
        ):
            assert time.monotonic() < deadline, f"both manifests not merged in 240 s\n{worker.tail()}"
            time.sleep(1)
        runs = wait_for_runs(deployments["ndjson-merge"], 1, worker=worker)
        assert {r.state_name for r in runs} == {"Completed"} and len(runs) in (1, 2), worker.tail()
    finally:
        worker.stop()

    # every good line exactly once in the merged Parquet on S3; the bad lines in the rejects; every file completed
    merged = []
    for day in (ETL_DAY, ETL_LATE_DAY):
        for key in store.list(etl_keys.merged_output_prefix(day)):
            with store.open(key) as body:
                merged += pq.read_table(pa.BufferReader(body.read())).to_pylist()
    assert sorted(r["id"] for r in merged) == sorted(lines) and len(merged) == 18
    assert all(r["nested"] == json.dumps(lines[r["id"]]["nested"], separators=(",", ":")) for r in merged)
    rejects = [key for key in store.list("pipeline/output/rejects/")]
    assert len(rejects) == 2 and all(store.get_bytes(k).count(b"\n") == 1 for k in rejects)
    statuses = {
        (i["date_prefix"], i["file_key"]): i.get("status") for i in state_store.scan_all(tables["etl_file_tracking"])
    }
    files = {
        k: s.split("#")[0]
        for k, s in statuses.items()
        if not k[1].startswith((etl_keys.MANIFEST_PREFIX, etl_keys.LOCK_PREFIX))
    }
    assert len(files) == 7, statuses
    manifests = {k: s for k, s in statuses.items() if k[1].startswith(etl_keys.MANIFEST_PREFIX)}
    assert sorted(set(files.values())) == ["completed", "quarantined"] and list(files.values()).count("completed") == 6
    assert sorted(manifests.values()) == ["completed", "completed"]
    assert etl_keys.quarantine_key(ETL_DAY, "empty.ndjson") in set(store.list(""))
