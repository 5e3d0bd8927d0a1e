"""`pipelines aws-stack deploy|destroy`: one environment in AWS by one command (deployments/aws.py, docs/aws.md).

The group is ``aws-stack``, not ``aws``: a documented line starting with ``aws`` is the AWS CLI's."""

from __future__ import annotations

import argparse
import os

from deployments import aws


def register(subparsers) -> None:
    """Add the ``aws-stack`` subcommands: deploy, destroy."""
    group = subparsers.add_parser("aws-stack", help="deploy or remove one environment in AWS (docs/aws.md)")
    commands = group.add_subparsers(dest="command", required=True)
    deploy = commands.add_parser("deploy", help="ECR, image, stack (change set), pool, blocks, deployments")
    deploy.add_argument("--env", required=True, help="the environment (TABLE_ENV): names the stack and its tables")
    deploy.add_argument(
        "--region",
        help="the region to change (default: boto3's own: AWS_REGION, AWS_DEFAULT_REGION, the profile's region)",
    )
    deploy.add_argument("--vpc", required=True, help="VPC id of the subnets")
    deploy.add_argument("--subnets", required=True, help="comma-separated subnet ids (private, with a NAT)")
    deploy.add_argument("--security-groups", required=True, help="comma-separated security group ids")
    deploy.add_argument(
        "--prefect-api-url",
        default=os.environ.get("PREFECT_API_URL"),
        help="the server's API (default: PREFECT_API_URL, else the Prefect profile's)",
    )
    deploy.add_argument(
        "--api-key-secret-arn",
        default="",
        help="Secrets Manager secret (name or ARN) holding PREFECT_API_KEY as a plain string (default for a Prefect "
        "Cloud URL: pipelines/ENV/prefect-api-key, kept from PREFECT_API_KEY or `prefect cloud login`)",
    )
    deploy.add_argument("--bucket", help="the data bucket's name (default pipelines-ACCOUNT-ENV)")
    deploy.add_argument("--image-tag", help="the image's tag (default: the checkout's commit)")
    deploy.add_argument("--assign-public-ip", default="DISABLED", choices=("ENABLED", "DISABLED"))
    deploy.add_argument(
        "--parameter",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        type=stack_parameter,
        help=f"a pipeline's own stack parameter, repeatable: {pipeline_parameter_help()}",
    )
    deploy.add_argument("--dry-run", action="store_true", help="print the change set; change nothing")
    deploy.set_defaults(handler=run_deploy)
    destroy = commands.add_parser("destroy", help="remove the stack and its artifacts; the data is kept")
    destroy.add_argument("--env", required=True)
    destroy.add_argument(
        "--region",
        help="the region to change (default: boto3's own: AWS_REGION, AWS_DEFAULT_REGION, the profile's region)",
    )
    destroy.set_defaults(handler=lambda a: aws.destroy(a.env, a.region))


def stack_parameter(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` of ``--parameter``."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=VALUE")
    return name, value


def pipeline_parameter_help() -> str:
    """The pipelines' own stack parameters, each with what it is for (from the pipelines' declarations)."""
    from infra import cloudformation as cfn

    return "; ".join(
        f"{name} ({declaration.get('Description', '')})"
        for parts in cfn.pipeline_parts()
        for name, declaration in parts.parameters.items()
    )


def run_deploy(args) -> dict:
    """The deploy command's arguments to ``aws.deploy``."""
    if not args.prefect_api_url:  # the active profile's (`prefect cloud login` sets it); none is named by the deploy
        from prefect.settings import PREFECT_API_URL

        args.prefect_api_url = PREFECT_API_URL.value() or ""
    return aws.deploy(
        args.env,
        args.region,
        args.vpc,
        args.subnets.split(","),
        args.security_groups.split(","),
        args.prefect_api_url,
        bucket=args.bucket,
        api_key_secret_arn=args.api_key_secret_arn,
        tag=args.image_tag,
        assign_public_ip=args.assign_public_ip,
        dry_run=args.dry_run,
        pipeline_parameters=dict(args.parameter),
    )
