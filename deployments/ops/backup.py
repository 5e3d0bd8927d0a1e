"""`pipelines backup DEST` and `pipelines restore SRC`: the local stack's backup and its restore (deployments/backup.py,
docs/operations.md "Backup and restore")."""

from __future__ import annotations

from pathlib import Path


def register(subparsers) -> None:
    """Add the ``backup`` and ``restore`` commands."""
    from deployments import backup

    made = subparsers.add_parser("backup", help="a consistent backup of the running local stack into a new folder")
    made.add_argument("dest", type=Path, help="a new folder (made 0700)")
    made.set_defaults(handler=lambda a: backup.backup(a.dest))
    back = subparsers.add_parser(
        "restore", help="rebuild a stack from a backup in a new data folder (PIPELINES_DATA_DIR); then `make up`"
    )
    back.add_argument("src", type=Path, help="the backup's folder")
    back.set_defaults(handler=lambda a: backup.restore(a.src))
