"""A survey, not one cube (issue 24 item 2): a manifest's tiles (one phspectra-survey run each) summarised as one
survey in the Prefect UI and the CLI, and one catalog of every component, partitioned by tile."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from deployments.samples.phspectra import synthetic_cube, write_fits
from tasks.core.object_store import LocalStore
from tasks.phspectra import catalog, keys
from tasks.phspectra import survey as ph
from tasks.phspectra.survey_status import survey_status
from tests.helpers.landing import arrive, runs_of

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

TILES = ("l15-a", "l16-b", "l17-c")


def tile_cubes(store_root: Path, tmp_path: Path, tiles=TILES) -> list[str]:
    """One small cube per tile in the object store (2x3 spectra, different noise each): their keys."""
    cube_keys = []
    for seed, tile in enumerate(tiles):
        key = f"cubes/{tile}.fits"
        LocalStore(store_root).put_file(
            key, write_fits(synthetic_cube(ny=2, nx=3, n_channels=48, seed=seed), tmp_path / f"{tile}.fits")
        )
        cube_keys.append(key)
    return cube_keys


def run_components(store, run_id: str) -> list[tuple]:
    """Every component of one run, from its per-chunk Parquet: (run_id, x, y, index, amplitude, mean, stddev)."""
    rows = [row for chunk in ph.list_chunks(run_id) for row in ph.read_parquet(store, chunk["output_key"]).to_pylist()]
    return sorted(
        (run_id, r["x"], r["y"], i, a, m, s)
        for r in rows
        for i, (a, m, s) in enumerate(zip(r["component_amplitudes"], r["component_means"], r["component_stddevs"]))
    )


def catalog_components(store_root: Path, survey: str) -> dict[str, list[tuple]]:
    """Tile -> its components in the catalog (read as a hive-partitioned dataset), with the run each came from."""
    table = ds.dataset(
        store_root / keys.survey_catalog_prefix(survey), format="parquet", partitioning="hive"
    ).to_table()
    by_tile: dict[str, list[tuple]] = {}
    for r in table.to_pylist():
        by_tile.setdefault(r["tile"], []).append(
            (r["run_id"], r["x"], r["y"], r["component"], r["amplitude"], r["mean"], r["stddev"])
        )
    return {tile: sorted(rows) for tile, rows in sorted(by_tile.items())}


def cli(capsys, *args: str):
    from deployments.cli import main

    code = main(["phspectra", *args])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else captured.err.strip()


@pytest.fixture(scope="module")
def deployed() -> str:
    """phspectra-survey as a deployment without a work pool: a landing starts its runs, which stay Scheduled."""
    from flows.phspectra_survey import phspectra_survey

    name = f"survey-{uuid.uuid4().hex[:6]}"
    phspectra_survey.to_deployment(name=name, enforce_parameter_schema=True).apply()
    return f"phspectra-survey/{name}"


def test_a_manifest_of_three_tiles_ends_as_one_survey_in_the_ui_the_cli_and_one_catalog(
    tables, store_root, tmp_path, deployed, capsys
):
    from prefect.artifacts import Artifact

    from flows.phspectra_survey import phspectra_survey
    from tasks.phspectra import landing

    survey = "grs-tiles"
    manifest = {
        "survey": survey,
        "cubes": tile_cubes(store_root, tmp_path),
        "chunk_size": 4,
        "fit_params": {"beta": 3.0},
    }
    arrival = arrive(store_root, f"surveys/incoming/{survey}/night-1.json", json.dumps(manifest).encode())
    assert landing.object_arrived(arrival, deployed)[0] == "started"
    started = sorted(
        (r for r in runs_of(deployed) if r.parameters["survey"] == survey), key=lambda r: r.parameters["run_id"]
    )
    assert [keys.tile_name(r.parameters["cube_url"]) for r in started] == list(TILES)

    # the first tile's run is not split yet: the survey still counts it (from its landing), as pending
    first = phspectra_survey(**started[0].parameters, workers=2)
    status = survey_status(survey)
    assert [(t["tile"], t["status"]) for t in status["tiles"]] == [
        ("l15-a", "COMPLETED"),
        ("l16-b", "PENDING"),
        ("l17-c", "PENDING"),
    ]
    assert (status["tiles_total"], status["tiles_completed"], status["finished"]) == (3, 1, False)
    assert Artifact.get(f"phspectra-survey-progress-{survey}").data == pytest.approx(100 / 3)
    assert not (store_root / keys.survey_catalog_prefix(survey)).exists()  # not every tile has finished

    summaries = [first] + [phspectra_survey(**run.parameters, workers=2) for run in started[1:]]
    assert [s["status"] for s in summaries] == ["COMPLETED"] * 3

    # survey progress 3/3, the same in the UI's artifacts and through the CLI (DynamoDB)
    code, status = cli(capsys, "survey-status", "--survey", survey)
    assert code == 0
    assert {
        k: status[k]
        for k in (
            "tiles_total",
            "tiles_completed",
            "tiles_failed",
            "tiles_running",
            "tiles_pending",
            "spectra_fitted",
            "n_spectra",
            "n_components",
            "finished",
        )
    } == {
        "tiles_total": 3,
        "tiles_completed": 3,
        "tiles_failed": 0,
        "tiles_running": 0,
        "tiles_pending": 0,
        "spectra_fitted": 18,
        "n_spectra": 18,
        "n_components": sum(s["n_components"] for s in summaries),
        "finished": True,
    }
    assert [(t["tile"], t["run_id"]) for t in status["tiles"]] == [(t, s["run_id"]) for t, s in zip(TILES, summaries)]
    assert Artifact.get(f"phspectra-survey-progress-{survey}").data == 100.0
    markdown = Artifact.get(f"phspectra-survey-{survey}").data
    assert f"# PHSpectra survey `{survey}`: 3 / 3 tiles finished" in markdown
    assert f"| 3 | 0 | 0 | 0 | 18 / 18 | {status['n_components']} |" in markdown
    assert [row["tile"] for row in json.loads(Artifact.get(f"phspectra-survey-tiles-{survey}").data)] == list(TILES)

    # the catalog, built when the last tile finished: exactly the union of the runs' components, by tile
    expected = {tile: run_components(LocalStore(store_root), s["run_id"]) for tile, s in zip(TILES, summaries)}
    assert catalog_components(store_root, survey) == expected
    assert sum(map(len, expected.values())) == status["n_components"] > 0
    assert sorted(p.relative_to(store_root).as_posix() for p in store_root.glob("catalogs/**/*.parquet")) == [
        keys.survey_catalog_key(survey, tile) for tile in TILES
    ]

    # the CLI's query: one tile, bright components, a limit
    code, rows = cli(capsys, "catalog", "--survey", survey, "--tile", "l16-b", "--min-amplitude", "1.5")
    assert code == 0
    assert sorted(
        (r["run_id"], r["x"], r["y"], r["component"], r["amplitude"], r["mean"], r["stddev"]) for r in rows
    ) == [row for row in expected["l16-b"] if row[4] >= 1.5]
    assert {r["tile"] for r in rows} == {"l16-b"} and 0 < len(rows) < len(expected["l16-b"])
    code, rows = cli(capsys, "catalog", "--survey", survey, "--limit", "4")
    assert code == 0 and len(rows) == 4
    code, rows = cli(capsys, "catalog", "--survey", survey, "--limit", "0")  # every row (the default is 100)
    assert code == 0 and len(rows) == status["n_components"]
    code, built = cli(capsys, "build-catalog", "--survey", survey)  # built already: nothing rewritten
    assert code == 0 and (built["written"], built["unchanged"], built["missing"]) == ({}, list(TILES), [])


def _tile_run(run_id: str, survey: str, cube_url: str, fit: bool = True) -> dict:
    """One tile's run through the task bodies: split, every chunk fitted, finalized (or only split)."""
    split = ph.split_cube(run_id, survey, cube_url, chunk_size=3)
    if fit:
        for start in split["starts"]:
            ph.fit_chunk(run_id, start)
        ph.finalize_run(run_id)
    return ph.get_run(run_id)


def test_a_rerun_of_one_tile_replaces_only_its_partition_and_a_rebuild_changes_nothing(tables, store_root, tmp_path):
    survey = "grs-rerun"
    a, b = (LocalStore(store_root).url_for(key) for key in tile_cubes(store_root, tmp_path, ("t-a", "t-b")))
    _tile_run("run-a1", survey, a)
    _tile_run("run-b1", survey, b)
    assert catalog.build_catalog(survey)["written"].keys() == {"t-a", "t-b"}
    before = catalog_components(store_root, survey)
    files = {tile: store_root / keys.survey_catalog_key(survey, tile) for tile in ("t-a", "t-b")}
    stamps = {tile: (path.stat().st_ino, path.stat().st_mtime_ns) for tile, path in files.items()}

    rebuilt = catalog.build_catalog(survey)  # the same runs: the same dataset, no file touched
    assert (rebuilt["written"], rebuilt["unchanged"]) == ({}, ["t-a", "t-b"])
    assert catalog_components(store_root, survey) == before
    assert {tile: (p.stat().st_ino, p.stat().st_mtime_ns) for tile, p in files.items()} == stamps

    _tile_run("run-a2", survey, a)  # tile t-a again: a newer run replaces its partition, t-b's file is untouched
    rerun = catalog.build_catalog(survey)
    assert (list(rerun["written"]), rerun["unchanged"]) == (["t-a"], ["t-b"])
    after = catalog_components(store_root, survey)
    assert (
        after["t-b"] == before["t-b"] and (files["t-b"].stat().st_ino, files["t-b"].stat().st_mtime_ns) == stamps["t-b"]
    )
    assert after["t-a"] == run_components(LocalStore(store_root), "run-a2")
    assert [row[1:] for row in after["t-a"]] == [row[1:] for row in before["t-a"]]  # the same cube fits the same
    assert sorted(p.name for p in files["t-a"].parent.iterdir()) == [keys.CATALOG_PART]  # no temp file left

    _tile_run("run-a3", survey, a, fit=False)  # a third run of t-a, still running: the survey is not finished,
    status = survey_status(survey)  # and the catalog keeps t-a's newest completed run
    assert [(t["tile"], t["run_id"], t["status"]) for t in status["tiles"]] == [
        ("t-a", "run-a3", "RUNNING"),
        ("t-b", "run-b1", "COMPLETED"),
    ]
    assert (status["finished"], status["spectra_fitted"], status["n_spectra"]) == (False, 6, 12)
    assert catalog.build_catalog(survey)["unchanged"] == ["t-a", "t-b"]
    assert {r["run_id"] for r in catalog.query_catalog(survey, tile="t-a")} == {"run-a2"}


@pytest.mark.parametrize(
    "args, error",
    [
        (["survey-status", "--survey", "grs-nobody"], "error: no run for survey grs-nobody"),
        (["survey-status", "--survey", "../grs"], "error: invalid survey '../grs'"),
        (["catalog", "--survey", "grs-nobody"], "error: no catalog for survey grs-nobody"),
        (["catalog", "--survey", "grs-bad", "--tile", "a/b"], "error: invalid tile 'a/b'"),
        (["catalog", "--survey", "grs-bad", "--tile", ".."], "error: invalid tile '..'"),
        (["catalog", "--survey", "grs-bad", "--tile", "a=b"], "error: invalid tile 'a=b': no '='"),
        (["build-catalog", "--survey", "grs-nobody"], "error: no run for survey grs-nobody"),
    ],
)
def test_bad_survey_or_tile_names_fail_clearly(tables, store_root, capsys, args, error):
    code, message = cli(capsys, *args)
    assert code == 2 and message.startswith(error), message
    assert not list(store_root.rglob("*"))  # nothing written


def test_an_unknown_tile_and_manifests_without_usable_tile_names_are_refused(tables, store_root, tmp_path):
    from tasks.phspectra import landing

    survey = "grs-names"
    (cube,) = (LocalStore(store_root).url_for(key) for key in tile_cubes(store_root, tmp_path, ("only",)))
    _tile_run("run-only", survey, cube)
    catalog.build_catalog(survey)
    with pytest.raises(LookupError, match="no tile other in the catalog of survey grs-names"):
        catalog.query_catalog(survey, tile="other")
    for cubes, reason in (
        (["x/a.fits", "y/a.fits"], "two cubes share a tile name"),
        (["cubes/a=b.fits"], "no usable tile name: invalid tile .a=b.: no .=."),
        (["s3://bucket/cubes/..fits"], "cube 's3://bucket/cubes/..fits' has no usable tile name"),
    ):
        with pytest.raises(landing.InvalidManifest, match=reason):
            landing.parse_manifest(json.dumps({"survey": survey, "cubes": cubes}).encode(), None)


@pytest.mark.sweep  # a worker and four flow-run processes (about a minute unloaded): `make test-sweep`, which CI runs
@pytest.mark.timeout(900)
def test_a_manifest_runs_end_to_end_on_a_worker_and_the_catalog_deployment_rebuilds_it(
    tables, store_root, tmp_path, capsys
):
    """prefect.yaml's deployments on a process worker: the manifest's landing starts the tile runs (as
    phspectra-listen does), then `prefect deployment run 'phspectra-survey-catalog/…'` rebuilds the catalog."""
    from prefect.artifacts import Artifact

    from tasks.phspectra import landing
    from tests.helpers.prefect_runs import Worker, deploy_from_prefect_yaml, prefect_cli, wait_for_runs

    survey, name = "grs-deployed", f"survey-{uuid.uuid4().hex[:6]}"
    deployments = deploy_from_prefect_yaml(
        tmp_path, {"phspectra-survey", "phspectra-survey-catalog"}, f"pool-{name}", name
    )
    worker = Worker(f"pool-{name}", tmp_path / "worker.log")
    try:
        manifest = {"survey": survey, "cubes": tile_cubes(store_root, tmp_path), "chunk_size": 4}
        arrival = arrive(store_root, f"surveys/incoming/{survey}/night-1.json", json.dumps(manifest).encode())
        assert landing.object_arrived(arrival, deployments["phspectra-survey"])[0] == "started"
        runs = wait_for_runs(deployments["phspectra-survey"], 3, worker=worker)
        assert [r.state_name for r in runs] == ["Completed"] * 3, worker.tail()

        code, status = cli(capsys, "survey-status", "--survey", survey)
        assert code == 0 and (status["tiles_completed"], status["tiles_total"], status["spectra_fitted"]) == (3, 3, 18)
        assert Artifact.get(f"phspectra-survey-progress-{survey}").data == 100.0
        built = catalog_components(store_root, survey)
        assert list(built) == list(TILES)
        assert {t: [r[0] for r in rows] for t, rows in built.items()} == {
            t["tile"]: [t["run_id"]] * t["n_components"] for t in status["tiles"]
        }

        prefect_cli(
            "deployment",
            "run",
            deployments["phspectra-survey-catalog"],
            "--param",
            f"survey={survey}",
            "--param",
            "force=true",
            timeout=120,
        )
        (rebuild,) = wait_for_runs(deployments["phspectra-survey-catalog"], 1, worker=worker)
        assert rebuild.state_name == "Completed", worker.tail()
        assert catalog_components(store_root, survey) == built  # every tile rewritten, the same dataset
        assert "3 tile(s) written, 0 unchanged" in Artifact.get(f"phspectra-survey-{survey}").data
    finally:
        worker.stop()


def test_the_catalog_is_built_and_queried_on_s3(tables, s3_base, tmp_path):
    """OBJECT_STORE_BASE_URL=s3://…: the runs' Parquet and the catalog in the bucket, one code path."""
    from tasks.core.object_store import ObjectStore

    survey, store = "grs-s3-catalog", ObjectStore.from_url(s3_base)
    for seed, tile in enumerate(("s-a", "s-b")):
        store.put_file(
            f"cubes/{tile}.fits",
            write_fits(synthetic_cube(ny=1, nx=3, n_channels=48, seed=seed), tmp_path / f"{tile}.fits"),
        )
        _tile_run(f"run-{tile}", survey, store.url_for(f"cubes/{tile}.fits"))
    built = catalog.build_catalog(survey)
    assert built["catalog_url"] == f"{s3_base}/{keys.survey_catalog_prefix(survey)}"
    assert sorted(store.list(keys.survey_catalog_prefix(survey))) == [
        keys.survey_catalog_key(survey, t) for t in ("s-a", "s-b")
    ]
    rows = catalog.query_catalog(survey)
    assert len(rows) == sum(built["written"].values()) > 0 and {r["tile"] for r in rows} == {"s-a", "s-b"}
    expected = sorted(run_components(store, "run-s-a") + run_components(store, "run-s-b"))
    assert (
        sorted((r["run_id"], r["x"], r["y"], r["component"], r["amplitude"], r["mean"], r["stddev"]) for r in rows)
        == expected
    )
    assert catalog.build_catalog(survey)["unchanged"] == ["s-a", "s-b"]  # the recorded source read back from S3
    assert [r["tile"] for r in catalog.query_catalog(survey, tile="s-b", limit=1)] == ["s-b"]
