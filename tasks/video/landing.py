"""A video upload starts its job (seed 003's upload event): ``input/{job_id}/source.mp4`` -> one `video-process` run.

    arrival ──> job id from the key ──> claim the upload on the job item (created, never claimed before)
        ──> create the `video-process` run (idempotency key from the claim) ──> record its id on the job item

The claim is written BEFORE the run is created and the run's id AFTER, both guarded, so a second event for
the same upload starts nothing. A listener that dies between the two leaves a job "claimed, no run": the next
event for the upload (a redelivery, or the local catch-up listing) finds it and creates the run with the same
idempotency key, which the Prefect server answers with the run already created if there is one, never a second.
"""

from __future__ import annotations

from tasks.core.runtime import run_logger, start_deployment_run
from tasks.landing.listener import Outcome
from tasks.landing.pipelines import handle_each
from tasks.landing.sources import Arrival
from tasks.video import jobs, keys

PIPELINE = "video"
PROCESS_DEPLOYMENT = "video-process/local"


def run_key(job: dict) -> str:
    """The idempotency key of the run an upload starts: the job and the claim's time (one per claim)."""
    return f"video-upload:{job['job_id']}:{job[jobs.UPLOAD_SEEN]}"


def upload_arrived(arrival: Arrival, deployment: str = PROCESS_DEPLOYMENT) -> tuple[str, list[str]]:
    """Start the job of one upload: (what happened, the run it started); one log line when nothing is started
    (InvalidKey: not an upload key)."""
    log = run_logger(__name__)
    job_id = keys.parse_source_key(arrival.key)
    claim = jobs.claim_upload(job_id, arrival.event_id)
    job = claim.item
    if not claim.applied:
        if job is None:
            log.warning("upload %s is for no video job (%s): nothing started", arrival.url, job_id)
            return "unknown", []
        if job.get("status") == jobs.DELETED:
            log.warning("upload %s is for deleted video job %s: nothing started", arrival.url, job_id)
            return "deleted", []
        if job.get(jobs.PROCESS_RUN):
            log.info("upload %s again: video job %s already has run %s", arrival.url, job_id, job[jobs.PROCESS_RUN])
            return "duplicate", [str(job[jobs.PROCESS_RUN])]
        if not job.get(jobs.UPLOAD_SEEN) or job.get("status") != jobs.CREATED:
            # e.g. a person ran video-process for it, or it failed: not the upload's to start
            log.warning("upload %s: video job %s is %s: nothing started", arrival.url, job_id, job.get("status"))
            return "not-created", []
        log.warning("upload %s: video job %s was claimed but has no run yet: starting it", arrival.url, job_id)
    flow_run_id = start_deployment_run(deployment, {"job_id": job_id}, run_key(job))
    jobs.note_process_run(job_id, flow_run_id)
    log.info("upload %s started %s run %s for video job %s", arrival.url, deployment, flow_run_id, job_id)
    return "started", [flow_run_id]


def handle_uploads(arrivals: list[Arrival], deployment: str = PROCESS_DEPLOYMENT) -> Outcome:
    """The video listener's handler: each upload starts its job once; one that cannot be handled now is retried."""
    return handle_each(arrivals, PIPELINE, lambda arrival: upload_arrived(arrival, deployment))
