"""The ETL pipeline's reconciliation adapter: MANIFEST records left processing by a merge run that ended."""

from __future__ import annotations

from tasks.core import state_store
from tasks.core.runtime import run_logger
from tasks.etl.keys import MANIFEST_PREFIX, manifest_name_from_record_key
from tasks.reconcile.adapters import TableAdapter, Tracked, show_key


class EtlManifestAdapter(TableAdapter):
    """Seed 001: a MANIFEST record `processing` while its ndjson-merge flow run ended -> completed with its files when
    the merge published its output (the best-effort status update was lost); back to pending when the run Crashed
    (killed, not failed: the next merge run takes it, at most ``MAX_MANIFEST_REDRIVES`` times); else failed, and its
    files follow at once (``manifested#N -> failed#N``, what ``etl remediate`` / the hourly flush would do later)."""

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
            redriven = self._redrive_crashed(record, name, reason)
            if redriven is not None:
                return redriven
        result = super().repair(record, reason)
        if result.applied:
            moved = etl_ops.remediate_manifested(record.key["date_prefix"])
            run_logger(__name__).warning("etl %s: files followed the failed manifest: %s", show_key(record.key), moved)
        return result

    def _redrive_crashed(self, record: Tracked, name: str, reason: str) -> state_store.WriteResult | None:
        """A manifest whose run Crashed (its process killed: an upgrade's swap, a restart), not one that failed with a
        reason: back to ``pending`` for the next merge run (bounded: ``MAX_MANIFEST_REDRIVES``). None: fail it."""
        from tasks.etl import merge as etl_merge
        from tasks.reconcile import prefect_states

        state = prefect_states([record.flow_run_id], []).get(str(record.flow_run_id))
        if state is None or state.type != "CRASHED":
            return None
        result = etl_merge.redrive_manifest(record.key["date_prefix"], name, str(record.flow_run_id), reason)
        if result is not None:
            run_logger(__name__).warning("etl %s: re-driven (pending) after %s", show_key(record.key), reason)
        return result


ADAPTERS = (EtlManifestAdapter(),)
