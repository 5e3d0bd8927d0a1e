"""The merge deployment's circuit breaker (seed 001: CLOSED → OPEN → HALF_OPEN), on Prefect parts.

    merge runs Failed/Crashed/TimedOut: 3 within 300 s ──(prefect.yaml trigger: ndjson-merge-breaker, action=trip)──>
        OPEN: state saved, merge deployment paused. The ingest starts no merge of a paused deployment (its manifests
        wait ``pending``); a merge run already queued leaves its manifest ``pending`` (``admits``)
    OPEN, cool-down (300 s) over ──(the check the opening scheduled for then, action=check)──> HALF_OPEN: the oldest
        pending manifest is the one trial, a merge run tagged ``breaker-trial``
    the trial ended ──(trigger on that run's end, action=check)──> its manifest completed: CLOSED, deployment resumed,
        every waiting manifest started (``manifest.ready``) · failed: OPEN again, the cool-down from now

Prefect counts the failures (the trigger's threshold and window); pausing a deployment stops only its schedules
(runs created by triggers still run), so the holding is done here. The state is a Prefect variable
(``etl-merge-breaker-{deployment}``, visible in the UI with the deployment's paused flag and an artifact); only
the breaker flow writes it, one run at a time (its deployment's concurrency limit 1, ENQUEUE). The transitions
are plain functions (``tripped``, ``decide``, ``admits``).

No check runs on a clock while nothing is due: each step that leaves the breaker OPEN or HALF_OPEN schedules the
check it needs next (``next_check_at``: a run of the breaker's own deployment, one per due time by its idempotency
key), and the deployment's schedule (every 10 minutes) is the backstop for a lost run or event and for drift.
Every check makes the deployment's paused flag follow the state, whatever changed either by hand: a
deleted variable reads CLOSED (resumed), one that cannot be read (edited into something else) OPEN with its
cool-down over (a trial next, then CLOSED on its success), saved as such. A CLOSED check also announces the
manifests left ``pending`` with no run to take them (``announce_waiting``: a queued run that was cancelled or
crashed before it took them); merge runs ending Cancelled or Crashed trigger a check at once (prefect.yaml).
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from tasks.core.runtime import now_iso, run_logger, start_deployment_run
from tasks.etl import ingest as etl
from tasks.etl.ingest import TRIAL_TAG, ManifestRef, manifest_record

CLOSED, OPEN, HALF_OPEN = "CLOSED", "OPEN", "HALF_OPEN"
COOL_DOWN_S = 300.0  # seed 001: open for 300 s, then one test call
RECHECK_S = 5.0  # a draining merge run reads the breaker at most this often: it stops taking within 5 s of a trip
Action = Literal["start_trial", "close"] | None


@dataclass(frozen=True)
class BreakerState:
    """One merge deployment's breaker: its state, when it opened, and the trial manifest while HALF_OPEN."""

    state: str = CLOSED
    opened_at: str | None = None
    trial_date: str | None = None
    trial_manifest: str | None = None
    trial_started_at: str | None = None
    trips: int = 0
    reason: str = ""
    updated_at: str | None = None


def _seconds_since(stamp: str | None, now: str) -> float:
    return (datetime.fromisoformat(now) - datetime.fromisoformat(stamp)).total_seconds() if stamp else float("inf")


def tripped(state: BreakerState, now: str, reason: str) -> BreakerState:
    """Failures over the threshold: OPEN from ``now`` (from any state; a trial in flight no longer counts)."""
    return BreakerState(OPEN, opened_at=now, trips=state.trips + 1, reason=reason, updated_at=now)


def decide(
    state: BreakerState, now: str, cool_down_s: float, trial_status: str | None, oldest_pending: ManifestRef | None
) -> tuple[BreakerState, Action]:
    """The check: OPEN past its cool-down with a manifest waiting → HALF_OPEN with that one trial; HALF_OPEN whose
    trial manifest completed → CLOSED; failed (or gone) → OPEN again from ``now``; a trial not started within the
    cool-down is started again. ``trial_status``: the trial MANIFEST's base status (None when there is none)."""
    if state.state == OPEN and _seconds_since(state.opened_at, now) >= cool_down_s and oldest_pending is not None:
        trial = replace(
            state,
            state=HALF_OPEN,
            trial_date=oldest_pending.date_prefix,
            trial_manifest=oldest_pending.manifest_name,
            trial_started_at=now,
            updated_at=now,
        )
        return trial, "start_trial"
    if state.state != HALF_OPEN:
        return state, None
    if trial_status == etl.COMPLETED:
        return BreakerState(
            CLOSED, trips=state.trips, reason=f"trial {state.trial_manifest} completed", updated_at=now
        ), "close"
    if trial_status in (etl.FAILED, None):
        return tripped(state, now, f"trial {state.trial_manifest} {trial_status or 'gone'}"), None
    if trial_status == etl.PENDING and _seconds_since(state.trial_started_at, now) >= cool_down_s:
        return replace(state, trial_started_at=now, updated_at=now), "start_trial"  # its run was lost: once more
    return state, None


# OPEN past its cool-down with nothing waiting: checked this often, so the next manifest's trial starts within it
RECHECK_S = 60.0


def next_check_at(state: BreakerState, now: str, cool_down_s: float) -> str | None:
    """When the breaker next needs a check that no event triggers: OPEN at its cool-down's end (past it, with nothing
    waiting: within ``RECHECK_S``, on the minute, so checks asked at different moments share one), HALF_OPEN when its
    trial counts as lost (``decide``: not started within the cool-down); CLOSED, or a trial past that (its run's end
    triggers the check): None. An OPEN state read from an unreadable variable has no ``opened_at``: cool-down over."""
    current = datetime.fromisoformat(now)
    if state.state == OPEN:
        if state.opened_at is not None:
            due = datetime.fromisoformat(state.opened_at) + timedelta(seconds=cool_down_s)
            if due > current:
                return now_iso(due)
        return now_iso((current + timedelta(seconds=RECHECK_S)).replace(second=0, microsecond=0))
    if state.state == HALF_OPEN and state.trial_started_at:
        due = datetime.fromisoformat(state.trial_started_at) + timedelta(seconds=cool_down_s)
        return now_iso(due) if due > current else None
    return None


def admits(state: BreakerState, date_prefix: str, manifest_name: str) -> bool:
    """Whether a merge run may take this manifest: always when CLOSED, only the trial when HALF_OPEN, none when OPEN."""
    if state.state == CLOSED:
        return True
    return state.state == HALF_OPEN and (state.trial_date, state.trial_manifest) == (date_prefix, manifest_name)


# --------------------------------------------------------------------------- on the Prefect server


def variable_name(merge_deployment: str) -> str:
    """The Prefect variable holding ``merge_deployment``'s breaker (lowercase letters, digits and dashes)."""
    return "etl-merge-breaker-" + re.sub(r"[^a-z0-9]+", "-", merge_deployment.lower()).strip("-")


_STATES = (CLOSED, OPEN, HALF_OPEN)
_STAMPS = ("opened_at", "trial_started_at", "updated_at")
_TEXTS = ("trial_date", "trial_manifest", "reason")


def _unreadable(saved: Any) -> str:
    """Why a saved breaker cannot be read as one ("" when it can); fields it does not know are ignored."""
    if not isinstance(saved, dict):
        return f"not an object: {type(saved).__name__}"
    if saved.get("state") not in _STATES:
        return f"state {saved.get('state')!r}"
    for name in _STAMPS:
        try:
            if saved.get(name) is not None:
                datetime.fromisoformat(saved[name])
        except (TypeError, ValueError):
            return f"{name} {saved[name]!r}"
    if any(saved.get(name) is not None and not isinstance(saved[name], str) for name in _TEXTS):
        return "a text field that is not text"
    if not isinstance(saved.get("trips", 0), int) or isinstance(saved.get("trips"), bool):
        return f"trips {saved.get('trips')!r}"
    return ""


def parse(saved: Any) -> tuple[BreakerState, str]:
    """A saved breaker as a state, and why it could not be read ("" when it could). Nothing saved (never tripped,
    or the variable deleted): CLOSED. Unreadable: OPEN with its cool-down over, so the next check tries one trial."""
    if saved is None:
        return BreakerState(), ""
    problem = _unreadable(saved)
    if problem:
        return BreakerState(OPEN, reason=f"breaker variable unreadable ({problem}): read as OPEN"), problem
    fields = {name: saved[name] for name in BreakerState.__dataclass_fields__ if name in saved}
    return BreakerState(**fields), ""


def read(merge_deployment: str) -> tuple[BreakerState, str]:
    """The saved breaker of ``merge_deployment`` and why it could not be read ("" when it could): ``parse``."""
    from prefect.variables import Variable

    return parse(Variable.get(variable_name(merge_deployment), default=None))


def load(merge_deployment: str) -> BreakerState:
    """The saved breaker of ``merge_deployment`` (CLOSED when none is saved, OPEN when it cannot be read)."""
    return read(merge_deployment)[0]


def save(merge_deployment: str, state: BreakerState) -> None:
    """Store the breaker (the breaker flow is its only writer)."""
    from prefect.variables import Variable

    Variable.set(
        variable_name(merge_deployment),
        {k: v for k, v in asdict(state).items() if v is not None},
        tags=["etl", "circuit-breaker"],
        overwrite=True,
    )


def set_paused(merge_deployment: str, paused: bool) -> bool:
    """Pause (OPEN, HALF_OPEN) or resume (CLOSED) the merge deployment; whether that changed it (repeating either
    changes nothing)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(merge_deployment)
        if bool(deployment.paused) == paused:
            return False
        (client.pause_deployment if paused else client.resume_deployment)(deployment.id)
        return True


# the backstop check announces manifests pending this long: past their own announcement's run creation and its
# first take (seconds), so a steady flow gets no second run; a merge run's cancel triggers a check with 0
ANNOUNCE_AFTER_S = 30.0


def announce_waiting(merge_deployment: str, older_than_seconds: float = ANNOUNCE_AFTER_S) -> list[str]:
    """Announce the manifests left ``pending`` (older than ``older_than_seconds``) to ``merge_deployment`` unless a
    queued run will take them (``etl.deployment_launcher``); the names announced (none when a queued run has them).
    A duplicate announcement only starts a run that finds them taken: each manifest is taken by one conditional
    write."""
    waiting = etl.pending_manifests(older_than_seconds)
    launches = etl.launch_merges(waiting, etl.deployment_launcher(merge_deployment)) if waiting else []
    return [launch["manifest_name"] for launch in launches if launch["launched"] and launch["run"] is None]


def current_merge_deployment() -> str | None:
    """``flow/deployment`` of the running merge when its run was made from a deployment (None: a subflow, a call)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    run = context.flow_run if context else None
    if run is None or run.deployment_id is None:
        return None
    with get_client(sync_client=True) as client:
        return f"{context.flow.name}/{client.read_deployment(run.deployment_id).name}"


def admitted_here(date_prefix: str, manifest_name: str) -> bool:
    """``admits`` for the running merge's deployment (a run outside a deployment is never held)."""
    merge_deployment = current_merge_deployment()
    if merge_deployment is None:
        return True
    state = load(merge_deployment)
    if admits(state, date_prefix, manifest_name):
        return True
    run_logger(__name__).warning(
        "%s: held by the circuit breaker of %s (%s since %s): the manifest stays pending",
        manifest_name,
        merge_deployment,
        state.state,
        state.opened_at,
    )
    return False


def _trial_status(state: BreakerState) -> str | None:
    if not state.trial_manifest or not state.trial_date:
        return None
    try:
        return etl.base_status(manifest_record(state.trial_date, state.trial_manifest))
    except LookupError:
        return None


def _start_trial(merge_deployment: str, state: BreakerState) -> str:
    """The one trial: a run of the (paused) merge deployment for the trial manifest, tagged ``breaker-trial``."""
    from prefect.deployments import run_deployment

    run = run_deployment(
        name=merge_deployment,
        parameters={"date_prefix": state.trial_date, "manifest_name": state.trial_manifest},
        timeout=0,
        tags=[TRIAL_TAG],
    )
    return str(run.id)


# a worker starts a run due within its prefetch (Prefect's default 10 s) early: a scheduled check waits this long at
# most for its due time, so it never finds the cool-down a few seconds short
EARLY_START_S = 30.0


def _wait_until(check_at: str | None) -> None:
    """Sleep until ``check_at`` when that is at most ``EARLY_START_S`` ahead (a scheduled check started early)."""
    if check_at:
        ahead = _seconds_since(now_iso(), check_at)
        if 0 < ahead <= EARLY_START_S:
            time.sleep(ahead)


def schedule_check(check_deployment: str, merge_deployment: str, cool_down_s: float, due: str) -> str:
    """A run of the breaker's deployment ``check_deployment`` Scheduled for ``due``: one per breaker and due time
    (its idempotency key), whoever asks and however often. Its id."""
    parameters = {
        "merge_deployment": merge_deployment,
        "action": "check",
        "cool_down_seconds": cool_down_s,
        "check_at": due,
    }
    key = f"{variable_name(merge_deployment)}-check-{due}"
    return start_deployment_run(check_deployment, parameters, key, at=datetime.fromisoformat(due))


def _schedule_next(
    check_deployment: str | None, merge_deployment: str, state: BreakerState, cool_down_s: float
) -> dict[str, Any]:
    """The next check ``state`` needs (``next_check_at``), scheduled on ``check_deployment``: its time and run."""
    due = next_check_at(state, now_iso(), cool_down_s)
    if check_deployment is None or due is None:
        return {}
    try:
        return {
            "next_check": due,
            "next_check_run": schedule_check(check_deployment, merge_deployment, cool_down_s, due),
        }
    except Exception as error:  # noqa: BLE001 - the state is saved; the schedule's backstop check comes instead
        run_logger(__name__).warning("circuit breaker of %s: next check not scheduled (%s)", merge_deployment, error)
        return {"next_check": None}


def step(
    merge_deployment: str,
    action: Literal["trip", "check"],
    cool_down_s: float = COOL_DOWN_S,
    reason: str = "",
    announce_after_s: float = ANNOUNCE_AFTER_S,
    check_deployment: str | None = None,
    check_at: str | None = None,
) -> dict[str, Any]:
    """One breaker step on the server: ``trip`` (the failure trigger fired) or ``check`` (scheduled by an earlier
    step for ``check_at``, the backstop schedule, trial ended, a merge run cancelled or crashed); a CLOSED check
    announces what is pending over ``announce_after_s``. A step that leaves the breaker OPEN or HALF_OPEN schedules
    its next check on the breaker's deployment ``check_deployment`` (None: none scheduled)."""
    logger = run_logger(__name__)
    _wait_until(check_at)
    before, unreadable = read(merge_deployment)
    if unreadable:
        logger.warning("circuit breaker of %s: its variable cannot be read (%s): OPEN", merge_deployment, unreadable)
    now = now_iso()
    done: dict[str, Any] = {}
    if action == "trip":
        after, todo = tripped(before, now, reason or "merge failures over the threshold"), None
    else:
        waiting = etl.pending_manifests(0)
        after, todo = decide(before, now, cool_down_s, _trial_status(before), waiting[0] if waiting else None)
    if todo == "close":
        set_paused(merge_deployment, False)  # resumed, then saved CLOSED: the merges started below are admitted
        save(merge_deployment, after)
        launches = etl.launch_merges(etl.pending_manifests(0), etl.deployment_launcher(merge_deployment))
        done["restarted"] = [launch["manifest_name"] for launch in launches if launch["launched"]]
    elif after.state != CLOSED:
        if after != before or unreadable:
            save(merge_deployment, after)  # saved before the pause: a merge starting meanwhile is already held
        if set_paused(merge_deployment, True) and action == "check":
            logger.warning("circuit breaker of %s: %s, the deployment ran: paused", merge_deployment, after.state)
        if todo == "start_trial":
            done["trial_run"] = _start_trial(merge_deployment, after)
    else:  # CLOSED: the deployment runs, and nothing waits without a run to take it
        if set_paused(merge_deployment, False):
            logger.warning("circuit breaker of %s: CLOSED, the deployment was paused: resumed", merge_deployment)
            done["resumed"] = True
        done["announced"] = announce_waiting(merge_deployment, announce_after_s)
    if after.state != before.state:
        logger.warning(
            "circuit breaker of %s: %s -> %s (%s)", merge_deployment, before.state, after.state, after.reason
        )
    done |= _schedule_next(check_deployment, merge_deployment, after, cool_down_s)
    return {"merge_deployment": merge_deployment, "before": before.state, **asdict(after), **done}
