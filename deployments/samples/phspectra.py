"""Sample data for the PHSpectra survey demo: a small FITS cube with known Gaussian components."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SURVEY = "grs-demo"


def synthetic_cube(ny: int = 6, nx: int = 8, n_channels: int = 128, seed: int = 0, nan_channels: int = 3) -> np.ndarray:
    """(channels, y, x): one to three Gaussians per spectrum plus noise, and a few NaN channels."""
    rng = np.random.default_rng(seed)
    channels = np.arange(n_channels, dtype=np.float64)
    cube = rng.normal(0.0, 0.1, (n_channels, ny, nx))
    for y in range(ny):
        for x in range(nx):
            for _ in range(1 + (x + y) % 3):
                amplitude, mean, width = rng.uniform(0.8, 3.0), rng.uniform(15, n_channels - 15), rng.uniform(2.0, 6.0)
                cube[:, y, x] += amplitude * np.exp(-0.5 * ((channels - mean) / width) ** 2)
    for _ in range(nan_channels):
        cube[rng.integers(n_channels), rng.integers(ny), rng.integers(nx)] = np.nan
    return cube


def write_fits(cube: np.ndarray, path: Path) -> Path:
    """Write ``cube`` as float32 to a FITS file at ``path`` (creating its folder); returns ``path``."""
    from astropy.io import fits

    path.parent.mkdir(parents=True, exist_ok=True)
    fits.PrimaryHDU(cube.astype(np.float32)).writeto(path, overwrite=True)
    return path


def make(workdir: Path) -> dict:
    """A 6x8x128 FITS cube; the phspectra-survey parameters that decompose it."""
    path = write_fits(synthetic_cube(), Path(workdir) / "phspectra" / "cube.fits")
    return {"cube_url": path.resolve().as_uri(), "survey": SURVEY, "chunk_size": 12, "fit_params": {"beta": 3.5}}


def drop(workdir: Path, store) -> dict:
    """The cube into the store, then a survey manifest naming it under ``surveys/incoming/{survey}/``."""
    import json

    from tasks.phspectra import keys

    params = make(workdir)
    cube_key = f"surveys/cubes/{Path(workdir).name}-cube.fits"
    store.put_file(cube_key, Path(params["cube_url"].removeprefix("file://")))
    manifest = {
        "survey": SURVEY,
        "cubes": [cube_key],
        "chunk_size": params["chunk_size"],
        "fit_params": params["fit_params"],
    }
    key = f"{keys.SURVEY_INCOMING_PREFIX}{SURVEY}/{Path(workdir).name}.json"
    store.put_bytes(key, json.dumps(manifest).encode())
    return {"manifest_url": store.url_for(key)}


def landed(manifest_url: str, **_: object) -> bool:
    """Whether the manifest's runs have ended (the latest run of the survey is no longer RUNNING)."""
    from tasks.phspectra import survey as ph

    run = ph.latest_run(SURVEY)
    return (
        bool(run)
        and run.get("cube_url", "").endswith(Path(manifest_url).stem + "-cube.fits")
        and run["status"] != ph.RUN_RUNNING
    )


def report(run_id: str | None = None, survey: str = SURVEY, **_: object) -> str:
    """The run read back with the seed's access patterns: latest run, its chunks, stuck chunks, failures."""
    from tasks.core.state_store import to_plain
    from tasks.phspectra import survey as ph

    run = to_plain(ph.get_run(run_id) if run_id else ph.latest_run(survey))
    if not run:
        return f"phspectra: no run for survey {survey}"
    run_id = run["PK"]
    chunks = to_plain(ph.list_chunks(run_id))
    lines = [
        f"phspectra run {run_id} ({run['survey']}): {run.get('status')}, chunks {run['jobs_completed']} completed / "
        f"{run['jobs_failed']} failed / {run['jobs_total']} total, {run['n_spectra']} spectra, "
        f"{run.get('n_components', '?')} components",
    ]
    lines += [
        f"  {c['SK']}: {c['status']} n_spectra={c['n_spectra']} n_components={c.get('n_components')} "
        f"duration_ms={c.get('duration_ms')}"
        for c in chunks
    ]
    lines.append(f"  stuck (>15 min): {len(ph.stuck_chunks(run_id))}, failures: {len(ph.failures(run_id))}")
    return "\n".join(lines)
