"""A survey's combined catalog: every Gaussian component of every tile, one Parquet dataset partitioned by tile.

    decompositions/survey={s}/run_id={r}/chunk-*.parquet     one row per spectrum, its components as lists
        ── each tile's newest COMPLETED run, one row per component ──>
    catalogs/survey={s}/tile={t}/part-0.parquet               hive partition ``tile``; ``run_id`` a column

A tile's partition is one file, written whole to a local temp file and then put in one step (a rename locally, one
PUT or a completed multipart upload on S3): a reader sees the old partition or the new one. The file's metadata
names the run it came from (``run_id``, ``completed_at``), so a rebuild rewrites only the tiles whose newest
completed run changed, and building twice gives the same dataset. A tile with no completed run keeps whatever
partition it had (reported as ``missing``); partitions of tiles no longer among the survey's runs are kept.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.core import keys
from tasks.core.config import object_store
from tasks.core.object_store import ObjectStore
from tasks.phspectra import keys as phspectra_keys
from tasks.phspectra import sealing
from tasks.phspectra import survey as ph
from tasks.phspectra.survey_status import tile_runs

SOURCE_METADATA = b"phspectra.source"  # the run a partition was built from: {"run_id", "completed_at"}
SPECTRUM_COLUMNS = ("x", "y", "n_components", "beta", "rms", "min_persistence")  # as the runs' Parquet types them
COMPONENT_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ph.PARQUET_SCHEMA.field("x"),
        ph.PARQUET_SCHEMA.field("y"),
        ("component", pa.int32()),  # 0-based, in the fit's order
        ("amplitude", pa.float64()),
        ("mean", pa.float64()),
        ("stddev", pa.float64()),
        *(ph.PARQUET_SCHEMA.field(name) for name in SPECTRUM_COLUMNS[2:]),
    ]
)


def components(spectra: pa.Table, run_id: str) -> pa.Table:
    """A run's Parquet rows (one per spectrum, ``PARQUET_SCHEMA``) as one row per component, in the same order."""
    lengths = pc.fill_null(pc.list_value_length(spectra["component_amplitudes"]), 0).to_numpy()
    parents = np.repeat(np.arange(len(lengths)), lengths)
    index = np.arange(len(parents)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    per_spectrum = spectra.select(list(SPECTRUM_COLUMNS)).take(pa.array(parents, pa.int64()))
    flat = {name: pc.list_flatten(spectra[f"component_{name}s"]) for name in ("amplitude", "mean", "stddev")}
    columns = {
        "run_id": pa.array([run_id] * len(parents), pa.string()),
        "component": pa.array(index, pa.int32()),
        **flat,
        **{name: per_spectrum[name] for name in SPECTRUM_COLUMNS},
    }
    return pa.table({name: columns[name] for name in COMPONENT_SCHEMA.names}, schema=COMPONENT_SCHEMA)


def run_source(run: dict[str, Any]) -> dict[str, Any]:
    """What a partition built from ``run`` records about it (a resumed run finishes again, with a new
    ``completed_at``)."""
    return {"run_id": run["PK"], "completed_at": run.get("completed_at")}


def partition_source(store: ObjectStore, key: str) -> dict[str, Any] | None:
    """The source run recorded in the partition at ``key``; None when there is none (or it is not readable)."""
    if not store.exists(key):
        return None
    try:
        metadata = pq.read_schema(store.arrow_path(key), filesystem=store.arrow_filesystem()).metadata or {}
        return json.loads(metadata[SOURCE_METADATA])
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None  # unreadable or foreign: rebuilt


def write_partition(store: ObjectStore, survey: str, tile: str, run: dict[str, Any]) -> int:
    """Every component of ``run`` as tile ``tile``'s partition, published in one step; how many components."""
    source_store, run_id = object_store(run.get("output_url")), run["PK"]
    schema = COMPONENT_SCHEMA.with_metadata({SOURCE_METADATA: json.dumps(run_source(run)).encode()})
    written = 0
    with tempfile.TemporaryDirectory(prefix="phspectra-catalog-") as tmp:
        path = Path(tmp, phspectra_keys.CATALOG_PART)
        with pq.ParquetWriter(path, schema, compression="snappy") as writer:
            for chunk in ph.list_chunks(run_id):  # spectrum order; a COMPLETED run's chunks are all COMPLETED
                table = components(ph.read_parquet(source_store, chunk["output_key"]), run_id)
                writer.write_table(table.replace_schema_metadata(schema.metadata))
                written += table.num_rows
        store.put_file(phspectra_keys.survey_catalog_key(survey, tile), path)
    return written


def build_catalog(survey: str, catalog_url: str | None = None, force: bool = False) -> dict[str, Any]:
    """Each tile's partition from its newest COMPLETED run, rewritten only where that run changed (all with ``force``).

    Returns the tiles written (with their component counts), unchanged, missing (no completed run) and kept
    (partitions of tiles that no run of the survey names any more). LookupError for a survey with no run.
    """
    store = object_store(catalog_url)
    tiles = tile_runs(survey)
    written, unchanged, missing = {}, [], []
    for tile, runs in tiles.items():
        # a RUN item its split did not seal names a store it never wrote: its partition is never read from there
        run = next((r for r in runs if r.get("status") == ph.RUN_COMPLETED and not sealing.broken(r)), None)
        if run is None:
            missing.append(tile)
            continue
        key = phspectra_keys.survey_catalog_key(survey, tile)
        if not force and partition_source(store, key) == run_source(run):
            unchanged.append(tile)
            continue
        written[tile] = write_partition(store, survey, tile, run)
    kept = sorted(set(catalog_tiles(store, survey)) - set(tiles))
    return {
        "survey": survey,
        "catalog_url": store.url_for(phspectra_keys.survey_catalog_prefix(survey)),
        "written": written,
        "unchanged": unchanged,
        "missing": missing,
        "kept": kept,
    }


def catalog_tiles(store: ObjectStore, survey: str) -> list[str]:
    """The tiles that have a partition in the survey's catalog, sorted."""
    prefix = phspectra_keys.survey_catalog_prefix(survey)
    return sorted(
        phspectra_keys.survey_catalog_tile(survey, key)
        for key in store.list(prefix)
        if key.endswith(f"/{phspectra_keys.CATALOG_PART}")
    )


def open_catalog(survey: str, catalog_url: str | None = None):
    """The survey's catalog as a ``pyarrow.dataset`` (``tile`` a partition column); LookupError if it has none."""
    import pyarrow.dataset as ds

    store = object_store(catalog_url)
    tiles = catalog_tiles(store, survey)
    if not tiles:
        raise LookupError(
            f"no catalog for survey {survey} in {store.url}: it is built when every tile has finished, "
            f"or now with `pipelines phspectra build-catalog --survey {survey}`"
        )
    prefix = phspectra_keys.survey_catalog_prefix(survey)
    return ds.dataset(
        [store.arrow_path(phspectra_keys.survey_catalog_key(survey, tile)) for tile in tiles],
        format="parquet",
        filesystem=store.arrow_filesystem(),
        partition_base_dir=store.arrow_path(prefix).rstrip("/"),
        partitioning=ds.partitioning(pa.schema([("tile", pa.string())]), flavor="hive"),
    )


def query_catalog(
    survey: str,
    tile: str | None = None,
    min_amplitude: float | None = None,
    limit: int | None = None,
    catalog_url: str | None = None,
) -> list[dict[str, Any]]:
    """Components of the survey's catalog (of one ``tile``, with ``amplitude >= min_amplitude``), at most ``limit``,
    by tile then spectrum; LookupError for a survey without a catalog or a tile not in it."""
    import pyarrow.dataset as ds

    keys.safe_id(survey, "survey")
    if tile is not None:
        phspectra_keys.safe_tile(tile)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    dataset = open_catalog(survey, catalog_url)
    condition = ds.scalar(True)
    if tile is not None:
        known = catalog_tiles(object_store(catalog_url), survey)
        if tile not in known:
            raise LookupError(f"no tile {tile} in the catalog of survey {survey} (tiles: {', '.join(known)})")
        condition = condition & (ds.field("tile") == tile)
    if min_amplitude is not None:
        condition = condition & (ds.field("amplitude") >= min_amplitude)
    table = dataset.head(limit, filter=condition) if limit else dataset.to_table(filter=condition)
    return table.to_pylist()
