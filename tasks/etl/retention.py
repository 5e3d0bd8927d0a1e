"""The ETL pipeline's retention: merge staging older than the merge timeout, which no live merge can own.

Its tables stamp their own ttl at write (seed 001: 30 days), so it declares no record rules.
"""

from __future__ import annotations

from datetime import timedelta

from tasks.etl import ingest as etl
from tasks.etl.keys import MERGED_STAGING_PREFIX
from tasks.etl.pipeline import MERGE_TIMEOUT_S
from tasks.retention.sweep import Ageing, older_than


def age_out_staging(ageing: Ageing) -> dict[str, int]:
    """Delete merge staging older than the merge timeout; how many objects, as ``etl-staging``."""
    output = etl.store(etl.settings().output_store_url)
    old = older_than(output, MERGED_STAGING_PREFIX, ageing.now - timedelta(seconds=MERGE_TIMEOUT_S))
    return {"etl-staging": sum(output.delete(k) for k in old)}
