"""Crash-point sweeps of the media listeners' writes: a listener's handler dies at each chosen write of one batch,
then only what the product does afterwards: the worker reports the dead run, and the restarted listener is offered
the arrivals again (the local watch's catch-up listing offers every file still where it landed; an SQS message
not deleted comes back after its visibility timeout). Invariants (docs/design.md, "Fault model"):
- video: the upload started exactly one `video-process` run, recorded on its job (claim, then run id);
- phspectra: a manifest started exactly one `phspectra-survey` run per cube, its landing item STARTED with their
  ids; a bad manifest started none and its landing item is REJECTED with its reason;
- records: every message of the dropped files is written (the records equal a run that never crashed) or kept in
  the dead-letter archive, every file is set aside once, nothing is left in ``records/incoming/``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tasks.core import state_store
from tasks.core.object_store import LocalStore
from tasks.core.runtime import today_iso
from tasks.landing.sources import Arrival
from tasks.records import keys as records_keys
from tasks.video import keys as video_keys
from tests.helpers.crashpoints import count_writes, crash_points, killed, report, report_crashed_runs, run_child
from tests.helpers.landing import arrive, runs_of

pytestmark = pytest.mark.crashpoints  # `make test-sweep` takes every write; by hand 3 sampled points


def plans_for(writes) -> list[str]:
    """Dying before write N is dying after write N-1 has been answered: "before" each point, and after the last."""
    return [f"{n}:kill:before" for n in crash_points(writes)] + [f"{writes[-1].number}:kill:after"]


def _crash(call: str, kwargs: dict, plan: str) -> None:
    result = run_child(call, kwargs, plan)
    assert killed(result), f"{plan}: the child was not killed\n{result.stdout[-1000:]}\n{result.stderr[-2000:]}"
    report_crashed_runs()  # the process worker: the listener's dead run is Crashed


# --------------------------------------------------------------------------- video


def video_upload(arrival: dict, deployment: str) -> list[str]:
    """The child's step: the video listener's handler on one upload."""
    from tasks.video import landing

    return [a.key for a in landing.handle_uploads([Arrival(**arrival)], deployment).done]


def _upload(store_root: Path) -> Arrival:
    from tasks.video import jobs

    job_id = jobs.create_job()["job_id"]
    return arrive(store_root, video_keys.source_key(job_id), b"an upload the listener does not decode")


def _one_run_recorded_on_the_job(deployment: str, upload: Arrival, where: str) -> None:
    from tasks.video import jobs, landing

    job_id = video_keys.parse_source_key(upload.key)
    runs = [r for r in runs_of(deployment) if r.parameters["job_id"] == job_id]
    assert len(runs) == 1, where
    job = jobs.get_job(job_id)
    assert (job["status"], job[jobs.PROCESS_RUN], job["upload_event_id"]) == (
        jobs.CREATED,
        str(runs[0].id),
        upload.event_id,
    ), where
    assert landing.upload_arrived(upload, deployment) == ("duplicate", [str(runs[0].id)]), where  # once more: nothing


def test_video_listener_survives_a_crash_at_every_write(tables, store_root, deployed, tmp_path):
    from tasks.video import landing

    deployment = f"video-process/{deployed}"
    counted = _upload(store_root)
    writes = count_writes(
        "tests.landing.test_crashpoints_landing:video_upload",
        {"arrival": dataclasses.asdict(counted), "deployment": deployment},
        tmp_path / "w.log",
    )
    assert [w.operation for w in writes] == ["update", "update"]  # the claim, then the run id
    _one_run_recorded_on_the_job(deployment, counted, "counted run")
    plans = plans_for(writes)
    for plan in plans:
        upload = _upload(store_root)
        _crash(
            "tests.landing.test_crashpoints_landing:video_upload",
            {"arrival": dataclasses.asdict(upload), "deployment": deployment},
            plan,
        )
        assert landing.handle_uploads([upload], deployment).done == [upload], plan  # the restarted listener
        _one_run_recorded_on_the_job(deployment, upload, plan)
    report(f"video listener: {len(plans)} crash points exercised of {len(writes)} writes")


# --------------------------------------------------------------------------- phspectra


def survey_landing(arrival: dict, deployment: str) -> list[str]:
    """The child's step: the phspectra listener's handler on one landing."""
    from tasks.phspectra import landing

    return [a.key for a in landing.handle_landings([Arrival(**arrival)], deployment).done]


def _manifest(store_root: Path, n: int, good: bool, write: bool = True) -> Arrival:
    """Manifest ``n`` of two cubes (a bad one names an unknown field), landed (``write``) or as landed before."""
    key = f"surveys/incoming/grs-15/night-{n}{'' if good else '-bad'}.json"
    if not write:
        stat = (store_root / key).stat()
        return Arrival(
            url=LocalStore(store_root).url_for(key),
            key=key,
            size=stat.st_size,
            event_time="2026-01-01T00:00:00+00:00",
            event_id=f"{key}:{stat.st_size}:{stat.st_mtime_ns}",
        )
    body = {"survey": "grs-15", "cubes": [f"cubes/{n}-a.fits", f"cubes/{n}-b.fits"], **({} if good else {"owner": "x"})}
    return arrive(store_root, key, json.dumps(body).encode())


def _landing_settled(deployment: str, store_root: Path, n: int, good: bool, where: str) -> None:
    from tasks.phspectra import landing
    from tasks.phspectra import survey as ph

    manifest = _manifest(store_root, n, good, write=False)
    cubes = [(store_root / f"cubes/{n}-{c}.fits").as_uri() for c in "ab"]
    runs = sorted(
        (r for r in runs_of(deployment) if r.parameters["cube_url"] in cubes), key=lambda r: r.parameters["cube_url"]
    )
    item = state_store.get_item(ph.runs_table(), landing.landing_key(manifest))
    if good:
        assert [r.parameters["cube_url"] for r in runs] == cubes, where  # one run per cube
        assert item["status"] == landing.STARTED, where
        assert sorted(item["flow_run_ids"]) == sorted(str(r.id) for r in runs), where
        assert sorted(item["run_ids"]) == sorted(r.parameters["run_id"] for r in runs), where
        assert landing.object_arrived(manifest, deployment)[0] == "duplicate", where
    else:
        assert runs == [], where
        assert item["status"] == landing.REJECTED and item["error"].startswith("unknown manifest field(s) ['owner']"), (
            where
        )
        assert landing.object_arrived(manifest, deployment) == ("rejected", []), where


@pytest.mark.parametrize("good", [True, False], ids=["manifest", "bad-manifest"])
def test_phspectra_listener_survives_a_crash_at_every_write(tables, store_root, deployed, tmp_path, good):
    from tasks.phspectra import landing

    deployment = f"phspectra-survey/{deployed}"
    counted = _manifest(store_root, 0, good)
    call = "tests.landing.test_crashpoints_landing:survey_landing"
    writes = count_writes(call, {"arrival": dataclasses.asdict(counted), "deployment": deployment}, tmp_path / "w.log")
    assert [w.operation for w in writes] == ["put", "update"]  # STARTING, then STARTED / REJECTED
    _landing_settled(deployment, store_root, 0, good, "counted run")
    plans = plans_for(writes)
    for n, plan in enumerate(plans, start=1):
        manifest = _manifest(store_root, n, good)
        _crash(call, {"arrival": dataclasses.asdict(manifest), "deployment": deployment}, plan)
        assert landing.handle_landings([manifest], deployment).done == [manifest], plan  # the restarted listener
        _landing_settled(deployment, store_root, n, good, plan)
    report(
        f"phspectra listener ({'good' if good else 'bad'} manifest): "
        f"{len(plans)} crash points exercised of {len(writes)} writes"
    )


# --------------------------------------------------------------------------- records


FILES = {"a.ndjson": 12, "b.json": 1}  # 13 messages: a batch of 10 and one of 3, across both files


def message_files(arrivals: list[dict]) -> list[str]:
    """The child's step: the records listener's handler (records-ingest as a flow run, as the listener runs it)."""
    from flows.records import ingest_batch
    from tasks.records import landing

    return [a.key for a in landing.handle_messages([Arrival(**a) for a in arrivals], ingest_batch).done]


def _drop(store_root: Path) -> list[Arrival]:
    from tests.helpers.landing import record_messages

    invalid = {"meta": {"collection": {"name": "MOD09GQ", "version": "006"}}}  # no cumulus_meta: archived
    lines = [json.dumps(m) for m in record_messages(0, FILES["a.ndjson"] - 1)] + [json.dumps(invalid)]
    return [
        arrive(store_root, "records/incoming/a.ndjson", "\n".join(lines).encode()),
        arrive(store_root, "records/incoming/b.json", json.dumps(record_messages(20, 1)[0]).encode()),
        arrive(store_root, "records/incoming/c.json", b"42"),  # JSON but no batch: archived whole
    ]


def _records_state(tables, store_root: Path) -> dict:
    """The records (clock-set fields aside), the dead-letter archive's entries and where the files are."""
    records = {}
    for logical, key in (("granules", "granuleId"), ("executions", "arn")):
        for item in state_store.scan_all(tables[logical]):
            records[item[key]] = {
                k: v for k, v in state_store.to_plain(item).items() if k not in ("timestamp", "updatedAt", "duration")
            }
    store = LocalStore(store_root)
    archive = {k: json.loads(store.get_bytes(k))["error"]["type"] for k in store.list(records_keys.DEAD_LETTER_PREFIX)}
    files = sorted(store.list("records/"))
    return {"records": records, "archive": archive, "files": files}


def _clear(tables, store_root: Path) -> None:
    for logical, key in (("granules", "granuleId"), ("executions", "arn"), ("pdrs", "pdrName")):
        state_store.batch_delete(tables[logical], [{key: i[key]} for i in state_store.scan_all(tables[logical])])
    for path in sorted(store_root.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()


def test_records_listener_survives_a_crash_at_every_write(tables, store_root, tmp_path):
    from flows.records import ingest_batch
    from tasks import reconcile
    from tasks.landing.listing import listed_arrivals
    from tasks.records import landing

    call = "tests.landing.test_crashpoints_landing:message_files"
    dropped = _drop(store_root)
    writes = count_writes(call, {"arrivals": [dataclasses.asdict(a) for a in dropped]}, tmp_path / "w.log")
    assert [w.operation for w in writes if w.store == "objects"][-3:] == ["rename"] * 3  # each file set aside last
    expected = _records_state(tables, store_root)
    day = today_iso()
    assert expected["files"] == sorted([f"records/processed/{day}/{name}" for name in ("a.ndjson", "b.json", "c.json")])
    assert (
        len([r for r in expected["records"] if not r.startswith("arn:")]) == 12
    )  # 11 + 1 granules (the bad message names none)
    assert sorted(expected["archive"].values()) == ["SchemaValidationError", "UnreadableBatch"]

    plans = plans_for(writes)
    for plan in plans:
        _clear(tables, store_root)
        dropped = _drop(store_root)
        _crash(call, {"arrivals": [dataclasses.asdict(a) for a in dropped]}, plan)
        # the restarted listener's catch-up listing: every file still in records/incoming/, offered again
        again = listed_arrivals(None, records_keys.RECORDS_INCOMING_PREFIX)
        assert landing.handle_messages(again, ingest_batch).done == again, plan
        assert landing.handle_messages(dropped, ingest_batch).done == dropped, plan  # SQS-like redelivery: "gone"
        assert _records_state(tables, store_root) == expected, plan
        assert reconcile.disagreements() == [], plan
    report(
        f"records listener: {len(plans)} crash points exercised of {len(writes)} writes "
        f"({', '.join(sorted({w.kind for w in writes}))})"
    )
