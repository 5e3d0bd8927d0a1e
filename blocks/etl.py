"""Configuration of the NDJSON→Parquet ETL (seed 001); env ``ETL_<FIELD>`` overrides, and the seed's Lambda variable
names (``TTL_DAYS``, ...) still do, as aliases."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from blocks.base import ConfigBlock

__all__ = ["EtlSettings"]


class EtlSettings(ConfigBlock):
    """Batching, validation and storage settings of the ETL (env ``ETL_MAX_FILES_PER_MANIFEST`` etc. override)."""

    _block_type_name = "ETL Settings"
    # the names seed 001's manifest_builder Lambda reads; ETL_<FIELD> wins when both are set
    _env_aliases: ClassVar[Mapping[str, str]] = {
        "MAX_FILES_PER_MANIFEST": "max_files_per_manifest",
        "EXPECTED_FILE_SIZE_MB": "expected_file_size_mb",
        "SIZE_TOLERANCE_PERCENT": "size_tolerance_percent",
        "MIN_FILES_FOR_PARTIAL_BATCH": "min_files_for_partial_batch",
        "TTL_DAYS": "ttl_days",
        "NUM_STATUS_SHARDS": "num_status_shards",
    }

    max_files_per_manifest: int = Field(default=10, description="Files per batch threshold.")
    expected_file_size_mb: float = Field(default=10, description="File validation centre (MB).")
    size_tolerance_percent: float = Field(default=99, description="Validation tolerance (% of expected size).")
    min_files_for_partial_batch: int = Field(default=1, description="Minimum files for an orphan-flush batch.")
    ttl_days: int = Field(default=30, description="DynamoDB record TTL (days).")
    num_status_shards: int = Field(default=10, description="GSI write-sharding count.")
    input_store_url: str = Field(default="", description="Input store; empty: the pipeline object store.")
    manifest_store_url: str = Field(default="", description="Manifest store; empty: the pipeline object store.")
    output_store_url: str = Field(default="", description="Parquet output store; empty: the pipeline object store.")
    quarantine_store_url: str = Field(default="", description="Quarantine store; empty: the pipeline object store.")
    target_file_mb: int = Field(default=128, description="Target size of a merged Parquet file (MB).")
    catalog_database: str = Field(
        default="ndjson_parquet", description="Glue database of the merged table (S3 output)."
    )
    catalog_table: str = Field(
        default="merged_parquet", description="Table the merged Parquet is registered as, one partition per date."
    )
    # width limits (issue 50): checked per file as its keys are read, before any table is built; a file past one
    # fails alone with the reason, its neighbours merge (docs/operations.md, "Width limits")
    max_columns_per_file: int = Field(
        default=1000, description="Distinct top-level keys (columns) one file may bring; a wider file fails alone."
    )
    max_columns_per_manifest: int = Field(
        default=2000,
        description="Distinct columns of one merged Parquet part (a manifest's files, up to target_file_mb); a file "
        "that would widen it past this fails alone.",
    )
    max_key_bytes: int = Field(
        default=255, description="Longest top-level key (UTF-8 bytes); Glue refuses column names over 255 characters."
    )
    notify_block: str | None = Field(
        default=None, description="Notification block told about failed merges, as 'block-type-slug/name' (unset: log)."
    )

    def size_bounds_bytes(self) -> tuple[float, float]:
        """Accepted file sizes: expected ± tolerance, in bytes."""
        centre = self.expected_file_size_mb * 1024 * 1024
        spread = centre * self.size_tolerance_percent / 100
        return centre - spread, centre + spread
