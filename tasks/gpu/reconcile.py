"""The GPU pipeline's reconciliation adapter: task records against what the backend says of their process."""

from __future__ import annotations

from collections.abc import Iterable

from tasks.core import state_store
from tasks.core.runtime import now_iso, run_logger
from tasks.reconcile.adapters import TableAdapter, Tracked


class GpuTaskAdapter(TableAdapter):
    """Seed 002 tasks: a task is held by its process on a node, not by the short Prefect task that started it,
    so the backend is asked first (local: the process; ECS: ``describe_tasks``). A task that still runs (or
    that the backend cannot tell about) is never tracked, so never TERMINATED; a stopped one gets the stop
    the backend reports (COMPLETE for exit 0, else TERMINATED), through the job's own guarded write, and
    ``gpu-sweep`` or the watcher moves its job on. A COMPLETE task stays: its exit code is the truth."""

    def __init__(self) -> None:
        super().__init__(
            "gpu",
            "ecs_task",
            "task_status",
            "IN_PROGRESS",
            None,
            "TERMINATED",
            ("ecs_task_id",),
            error_attr="termination_reason",
            ended_attr="updated_at",
        )

    def _exit(self, task_id: str):
        """The backend's answer (TaskExit), None while the task runs or when the backend cannot tell."""
        from tasks.gpu import jobs as gpu
        from tasks.gpu.backends import BackendError

        try:
            return gpu.make_runner().backend.poll(task_id)
        except BackendError as error:
            run_logger(__name__).warning("gpu task %s: cannot ask the backend (%s); left as it is", task_id, error)
            return None

    def tracked(self) -> Iterable[Tracked]:
        """In-flight task records whose task the backend says has stopped."""
        return [r for r in super().tracked() if self._exit(r.key["ecs_task_id"]) is not None]

    def repair(self, record: Tracked, reason: str) -> state_store.WriteResult:
        """Record the stop the backend reports, only if the task is still IN_PROGRESS and still stopped."""
        from tasks.gpu import jobs as gpu

        stopped = self._exit(record.key["ecs_task_id"])
        if stopped is None:
            return state_store.WriteResult(state_store.Outcome.STALE, None)
        return gpu.record_stop(
            record.key["ecs_task_id"],
            stopped.exit_code,
            f"{stopped.reason} ({reason})",
            **{self.error_attr: reason, "reconciled_at": now_iso()},
        )


ADAPTERS = (GpuTaskAdapter(),)
