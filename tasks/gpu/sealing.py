"""Which fields of a GPU job row decide what runs, sealed by its launch (``tasks.core.seal``).

The command and its env, how many tasks run it, on which cluster and through which backend: a job row whose
sealed fields are not what its launch wrote (a row written straight into ``ecs_job``, or changed after its launch)
runs nothing. The fields that change as the job moves on (status, retry, assigned nodes, owners) are not sealed:
none of them says what runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.core import seal
from tasks.core.seal import SealBroken

PURPOSE = "gpu-job"
SEALED = ("command", "env", "num_nodes", "cluster_name", "backend")


def sealed_fields(job: Mapping[str, Any]) -> dict[str, Any]:
    """The job's fields that decide what runs (an absent one counts as None, so it cannot be added later)."""
    return {name: job.get(name) for name in SEALED}


def seal_job(job: Mapping[str, Any]) -> dict[str, str]:
    """The seal attributes a launch stores with the new job row; LaunchKeyMissing without a launch key."""
    return seal.seal(PURPOSE, job["job_id"], sealed_fields(job))


def check_job(job: Mapping[str, Any], backend_name: str) -> None:
    """SealBroken unless the job row is as its launch sealed it, for the backend that is to run it."""
    seal.verify(PURPOSE, job["job_id"], sealed_fields(job), job)
    if job.get("backend") != backend_name:
        raise SealBroken(f"job {job['job_id']} was launched for the {job.get('backend')} backend, not {backend_name}")
