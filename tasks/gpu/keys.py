"""Seed 002's keys: job, node and task ids.

Every key of this pipeline is built and parsed here; nothing else formats them by hand. Identifiers are
validated by the shared validators of ``tasks.core.keys`` so no input can write outside its prefix.
"""

from __future__ import annotations

from tasks.core.keys import InvalidKey, safe_id

GPU_JOB_ID_MAX = 96  # room for the task-id suffix inside safe_id's 128 characters


def gpu_job_id(value: str) -> str:
    """A job id: a safe id of at most 96 characters (task ids are built from it)."""
    safe_id(value, "job_id")
    if len(value) > GPU_JOB_ID_MAX:
        raise InvalidKey(f"invalid job_id {value!r}: at most {GPU_JOB_ID_MAX} characters")
    return value


def gpu_job_id_for_run(flow_run_id: str) -> str:
    """``job-{flow_run_id}``: the job id of a flow run that was given none."""
    return gpu_job_id(f"job-{flow_run_id}")


def gpu_node_name(value: str) -> str:
    """A node name, if it is a safe id (else InvalidKey)."""
    return safe_id(value, "node_name")


def gpu_local_node_name(index: int) -> str:
    """``local-{index}``: the local backend's node slots."""
    if not isinstance(index, int) or index < 0:
        raise InvalidKey(f"invalid local node index {index!r}")
    return f"local-{index}"


def gpu_local_task_id(job_id: str, retry: int, node_index: int) -> str:
    """``{job_id}-r{retry}-n{node_index}``: a local task's id, one per job attempt and node."""
    return safe_id(f"{gpu_job_id(job_id)}-r{int(retry)}-n{int(node_index)}", "ecs_task_id")


def gpu_task_id(value: str) -> str:
    """A task id, if it is a safe id (else InvalidKey)."""
    return safe_id(value, "ecs_task_id")
