"""`pipelines video …`: create a job (id + upload target), read and list jobs, soft-delete finished jobs."""

from __future__ import annotations

import argparse

from deployments.ops import key_argument
from tasks.video import jobs as video

CLEANUP_DEPLOYMENT = "video-delete-cleanup/local"


def _delete(args: argparse.Namespace) -> dict:
    """Soft delete, then queue the asynchronous cleanup (a deployment run, or in-process with --cleanup inline)."""
    result = video.request_delete(args.job_id)
    if args.cleanup == "inline":
        from flows.video import video_delete_cleanup

        result["cleanup"] = video_delete_cleanup(args.job_id)
    elif args.cleanup == "deployment":
        from prefect.deployments import run_deployment

        try:
            run = run_deployment(args.deployment, parameters={"job_id": args.job_id}, timeout=0)
            result["cleanup_flow_run_id"] = str(run.id)
        except Exception as error:  # noqa: BLE001 - the job is deleted either way; say that cleanup was not queued
            result["cleanup_error"] = (
                f"cleanup not queued ({type(error).__name__}: {error}); run: "
                f"prefect deployment run '{args.deployment}' --param job_id={args.job_id}"
            )
    return result


def register(subparsers) -> None:
    """Add the ``video`` subcommands: create-job, get-job, list, delete."""
    group = subparsers.add_parser("video", help="video pipeline (seed 003) jobs").add_subparsers(
        dest="command", required=True
    )

    create = group.add_parser("create-job", help="create a job; prints job_id and where to upload source.mp4")
    create.add_argument("--job-id", help="default: a new random id")
    create.add_argument("--mode", help="identity, grayscale, scale or denoise (default: the VideoInference block's)")
    create.add_argument("--segment-seconds", type=float)
    create.set_defaults(handler=lambda a: video.create_job(a.job_id, a.mode, a.segment_seconds))

    get = group.add_parser("get-job", help="one job (a deleted job is not found)")
    key_argument(get, "job_id", "--job-id")
    get.set_defaults(handler=lambda a: video.get_job(a.job_id))

    listing = group.add_parser("list", help="jobs that are not deleted, oldest first")
    listing.add_argument(
        "--status", choices=["created", "chunking_in_progress", "chunking_complete", "completed", "failed"]
    )
    listing.set_defaults(handler=lambda a: video.list_jobs(a.status))

    delete = group.add_parser("delete", help="soft-delete a completed or failed job and queue its cleanup")
    key_argument(delete, "job_id", "--job-id")
    delete.add_argument("--cleanup", choices=["deployment", "inline", "none"], default="deployment")
    delete.add_argument("--deployment", default=CLEANUP_DEPLOYMENT)
    delete.set_defaults(handler=_delete)
