"""PHSpectra survey test helpers: a synthetic cube, the decompositions a run wrote and those of a direct fit."""

from __future__ import annotations

import time
from pathlib import Path

import phspectra
import pyarrow.dataset as ds

from deployments.samples.phspectra import synthetic_cube, write_fits
from tasks.phspectra import keys
from tasks.phspectra import survey as ph


def direct_rows(cube_url: str, params: dict) -> dict[tuple[int, int], list[tuple[float, float, float]]]:
    """(x, y) -> components of ``phspectra.fit_gaussians`` called directly on the same spectrum."""
    spectra, xs, ys, _ = ph.prepare_spectra(ph.load_cube(cube_url))
    return {
        (int(x), int(y)): [(c.amplitude, c.mean, c.stddev) for c in phspectra.fit_gaussians(s, **params)]
        for s, x, y in zip(spectra, xs, ys)
    }


def output_rows(store_root: Path, survey: str, run_id: str) -> dict[tuple[int, int], list[tuple[float, float, float]]]:
    """(x, y) -> components of the run's Parquet output; each spectrum must appear once."""
    table = ds.dataset(store_root / keys.decomposition_prefix(survey, run_id), format="parquet").to_table()
    assert table.schema.equals(ph.PARQUET_SCHEMA)
    rows = table.to_pylist()
    pairs = [(r["x"], r["y"]) for r in rows]
    assert len(pairs) == len(set(pairs)), "a spectrum appears twice"
    return {
        (r["x"], r["y"]): list(zip(r["component_amplitudes"], r["component_means"], r["component_stddevs"]))
        for r in rows
    }


def fits_cube(tmp_path: Path, **kwargs) -> str:
    """A synthetic cube (``synthetic_cube(**kwargs)``) written as FITS under ``tmp_path``; its URL."""
    return write_fits(synthetic_cube(**kwargs), tmp_path / "cube.fits").as_uri()


def wait_until_leases_expire(run_id: str, timeout: float = 60) -> None:
    """Wait until no chunk of the run holds a live lease (as the maintenance flows find it after a fitter died)."""
    deadline = time.monotonic() + timeout
    while any(c["status"] == "IN_PROGRESS" and not ph.lease_expired(c) for c in ph.list_chunks(run_id)):
        assert time.monotonic() < deadline, f"run {run_id}: a lease was still renewed after {timeout} s"
        time.sleep(0.1)
