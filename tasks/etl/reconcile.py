"""The ETL pipeline's reconciliation adapter: MANIFEST records left processing by a merge run that ended."""

from __future__ import annotations

from tasks.core import state_store
from tasks.core.runtime import run_logger
from tasks.etl.keys import MANIFEST_PREFIX, manifest_name_from_record_key
from tasks.reconcile.adapters import TableAdapter, Tracked, show_key


class EtlManifestAdapter(TableAdapter):
    """Seed 001: a MANIFEST record `processing` while its ndjson-merge flow run ended -> completed with its files when
    the merge published its output (the best-effort status update was lost), else failed, and its files follow at
    once (``manifested#N -> failed#N``, what ``etl remediate`` / the hourly flush would do later)."""

    def __init__(self) -> None:
        super().__init__(
            "etl",
            "etl_file_tracking",
            "status",
            "processing",
            None,
            "failed",
            ("date_prefix", "file_key"),
            keep=lambda item: str(item.get("file_key", "")).startswith(MANIFEST_PREFIX),
            error_attr="error_message",
            ended_attr="updated_at",
            flow_level=True,
            action="finish",
        )

    def repair(self, record: Tracked, reason: str) -> state_store.WriteResult:
        """A published merge: the status update it lost (``complete_if_published``, guarded on ``processing``);
        otherwise the manifest to failed (guarded), then ``remediate_manifested`` for its date (guarded per file)."""
        from tasks.etl import merge as etl_merge
        from tasks.etl import ops as etl_ops

        item = state_store.get_item(self.table_name(), record.key)
        if (
            item is not None
            and item.get("status") == record.status
            and item.get("prefect_flow_run_id") == record.flow_run_id
        ):
            name = manifest_name_from_record_key(record.key["file_key"])
            finished = etl_merge.complete_if_published(record.key["date_prefix"], name, item["manifest_path"])
            if finished is not None:
                outcome = (
                    state_store.Outcome.APPLIED
                    if finished["manifest_status"] == "completed"
                    else state_store.Outcome.STALE
                )
                run_logger(__name__).warning(
                    "etl %s: output published, status update completed: %s", show_key(record.key), finished
                )
                return state_store.WriteResult(outcome, state_store.get_item(self.table_name(), record.key))
        result = super().repair(record, reason)
        if result.applied:
            moved = etl_ops.remediate_manifested(record.key["date_prefix"])
            run_logger(__name__).warning("etl %s: files followed the failed manifest: %s", show_key(record.key), moved)
        return result


ADAPTERS = (EtlManifestAdapter(),)
