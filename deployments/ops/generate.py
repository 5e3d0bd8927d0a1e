"""`pipelines generate`: the files generated from the pipelines' declarations, rewritten (or, with ``--check``, the
stale ones named): prefect.yaml's deployments, the CloudFormation template, the settings' docs and docs/aws.md's
counts and cost."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def targets() -> list[tuple[Path, Callable[[], str]]]:
    """(file, its text as generated) for every generated file: one more generated file is one more line here."""
    from deployments import prefect_yaml, settings_docs
    from infra import aws_docs, cloudformation

    return [
        (prefect_yaml.PATH, prefect_yaml.render),
        (cloudformation.TEMPLATE_PATH, cloudformation.render),
        (settings_docs.DOC, settings_docs.render_doc),
        (aws_docs.DOC, aws_docs.render_doc),
    ]


def generate(args: argparse.Namespace) -> dict:
    """Write each generated file that differs from its generation (``--check``: name them, write nothing)."""
    rendered = [(path, render()) for path, render in targets()]  # every text before any write: all or none
    stale = [(path, text) for path, text in rendered if not path.exists() or path.read_text() != text]
    root = Path(__file__).resolve().parents[2]
    names = [str(path.relative_to(root) if path.is_relative_to(root) else path) for path, _ in stale]
    if args.check:
        if stale:
            raise RuntimeError(f"stale: {', '.join(names)}: run `pipelines generate` and commit them")
        return {"stale": []}
    for path, text in stale:
        path.write_text(text)
    return {"written": names}


def register(subparsers) -> None:
    """Add ``generate [--check]``."""
    command = subparsers.add_parser(
        "generate",
        help=(
            "rewrite what the declarations generate: prefect.yaml's deployments, the template, the settings' docs, "
            "docs/aws.md's counts and cost"
        ),
    )
    command.add_argument("--check", action="store_true", help="exit non-zero naming each stale file; write nothing")
    command.set_defaults(handler=generate)
