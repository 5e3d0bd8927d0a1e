"""The video pipeline's reconciliation adapter: jobs held by process and reassembly runs that all ended."""

from __future__ import annotations

from collections.abc import Iterable

from tasks.core import config, state_store
from tasks.core.runtime import run_logger
from tasks.reconcile.adapters import TableAdapter, Tracked


class VideoJobAdapter(TableAdapter):
    """Seed 003 jobs chunking or ``chunking_complete``: held by their video-process run and by the reassembly runs
    of their lock (``tasks.video.jobs.holders``). Once every one has ended, the job is recovered the way
    ``video-sweep-stuck`` does it (``recover_stuck_job``): reassembled, re-driven, or failed with the reason."""

    def __init__(self) -> None:
        super().__init__(
            "video",
            "video_jobs",
            "status",
            "chunking_in_progress",
            None,
            "failed",
            ("job_id",),
            error_attr="failure_reason",
            ended_attr="failed_at",
            flow_level=True,
            action="recover",
        )

    def tracked(self) -> Iterable[Tracked]:
        """Jobs chunking or chunking_complete with a process run, with the reassembly runs that also hold them; a job
        waiting for space is no run's (its run ended on purpose): `video-sweep-stuck` takes it once there is room."""
        from tasks.video import jobs as video

        def held(item) -> bool:
            return (
                item.get("status") in (video.CHUNKING, video.CHUNKED)
                and bool(item.get("prefect_flow_run_id"))
                and video.WAITING_FOR_SPACE not in item
            )

        jobs = list(state_store.scan_all(self.table_name(), keep=held))
        locks = {
            lock["job_id"]: lock
            for lock in state_store.get_many(
                config.table_name("video_reassembly_locks"), ({"job_id": job["job_id"]} for job in jobs)
            )
        }
        for job in jobs:
            owner = str(job["prefect_flow_run_id"])
            others = tuple(r for r in video.holders(job, locks.get(job["job_id"])) if r != owner)
            yield Tracked({"job_id": job["job_id"]}, job["status"], "in_flight", owner, None, holders=others)

    def repair(self, record: Tracked, reason: str) -> state_store.WriteResult:
        """``recover_stuck_job`` for the job, only while it is held by the same run (else: stale)."""
        from tasks.video import jobs as video

        result = video.recover_stuck_job(record.key["job_id"], owner=record.flow_run_id, why=reason)
        run_logger(__name__).warning("video job %s: %s", record.key["job_id"], result)
        outcome = state_store.Outcome.STALE if result["action"] == "none" else state_store.Outcome.APPLIED
        return state_store.WriteResult(outcome, result)


ADAPTERS = (VideoJobAdapter(),)
