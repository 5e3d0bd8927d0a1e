"""A listener's ECS service task: one run of the listener's ``ecs`` deployment, executed in this container.

    python -m deployments.ecs_listener ndjson-listen/ecs

In AWS each landing place's listener is an ECS service of one task (ECS starts another when it dies, never two at
once). The task runs its deployment's flow run itself (created Pending, so no ECS worker picks it up, then
``prefect flow-run execute``), so the run belongs to the deployment: the Prefect UI shows it there and
``landing-listener-not-running`` sees it live. A live run of the deployment that the task finds at its start was
its predecessor's (ECS runs at most one task of the service): it is marked Crashed, so the deployment's
one-at-a-time limit does not cancel the new one. The ecs deployments carry no triggers (prefect.yaml): after the
6-hour handover the run completes, the container exits, and ECS starts the next task, the only listener there.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any
from uuid import UUID

LIVE = ("SCHEDULED", "PENDING", "RUNNING")
WAIT_FOR_DEPLOYMENT_S = 30  # the stack's services start before `prefect deploy --name ecs` has run


def read_deployment(client: Any, name: str, wait_s: float = WAIT_FOR_DEPLOYMENT_S, attempts: int | None = None):
    """The deployment ``flow/deployment``, waited for (not failed on: ECS would restart the task in a loop)."""
    from prefect.exceptions import ObjectNotFound

    from tasks.landing.heartbeat import Heartbeat

    tried = 0
    while True:
        try:
            return client.read_deployment_by_name(name)
        except ObjectNotFound:
            tried += 1
            if attempts is not None and tried >= attempts:
                raise
            print(f"deployment {name} is not on the server yet; waiting {wait_s:.0f} s", file=sys.stderr, flush=True)
            # waiting for `prefect deploy` is alive, not stuck: a replaced task would wait the same
            Heartbeat.from_env().beat()
            time.sleep(wait_s)


def take_over(client: Any, deployment_id: UUID) -> list[UUID]:
    """Mark the deployment's live runs Crashed: they belonged to this service's previous task, now gone."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    live = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType(s) for s in LIVE])))
    runs = client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])), flow_run_filter=live
    )
    for run in runs:
        client.set_flow_run_state(
            run.id, Crashed(message="its ECS service task is gone; the service started another"), force=True
        )
    return [run.id for run in runs]


def start_run(name: str, attempts: int | None = None) -> UUID:
    """The deployment's new run, Pending (no worker takes it), after its predecessors are marked Crashed."""
    from prefect.client.orchestration import get_client
    from prefect.states import Pending

    with get_client(sync_client=True) as client:
        deployment = read_deployment(client, name, attempts=attempts)
        taken = take_over(client, deployment.id)
        if taken:
            print(f"marked {len(taken)} run(s) of {name} Crashed: {taken}", file=sys.stderr, flush=True)
        return client.create_flow_run_from_deployment(deployment.id, state=Pending()).id


def main(argv: list[str] | None = None) -> None:
    """Start the run and become its process (``prefect flow-run execute``)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or "/" not in argv[0]:
        raise SystemExit("usage: python -m deployments.ecs_listener FLOW/DEPLOYMENT")
    run_id = start_run(argv[0])
    os.environ["PREFECT__FLOW_RUN_ID"] = str(run_id)
    os.execvp(sys.executable, [sys.executable, "-m", "prefect", "flow-run", "execute", str(run_id)])


if __name__ == "__main__":
    main()
