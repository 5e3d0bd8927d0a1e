"""A folder only its user can reach (mode 0700, owned by the user), for sockets and lock files other local users
must neither read, pre-create nor hold. Standard library only: the engine fork server's ``run`` loads it."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from tasks.core.errors import PipelineError


class NotPrivate(PipelineError, PermissionError):
    """A folder (or socket) another user owns or may reach: refused, never used."""


def check_private(path: Path, kind: str = "folder") -> None:
    """NotPrivate unless ``path`` (a folder, not a link) is owned by this user with no group or other access."""
    info = os.lstat(path)
    if kind == "folder" and not stat.S_ISDIR(info.st_mode):
        raise NotPrivate(f"{path} is not a folder (a link or a file in its place): refused")
    if info.st_uid != os.getuid():
        raise NotPrivate(f"{path} belongs to uid {info.st_uid}, not to this user ({os.getuid()}): refused")
    if info.st_mode & 0o077:
        raise NotPrivate(
            f"{path} has mode {stat.S_IMODE(info.st_mode):04o}: others may reach it; refused (chmod 700 "
            f"it or remove it)"
        )


def private_folder(path: Path) -> Path:
    """``path`` created with mode 0700 if absent; NotPrivate if it exists and another user owns it or may reach it."""
    try:
        path.mkdir(mode=0o700, parents=False)
    except FileExistsError:
        pass
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return private_folder(path)
    check_private(path)
    return path


def check_parents(path: Path) -> Path:
    """``path`` under its parent with links resolved; NotPrivate unless every folder above it is root's or this
    user's and none lets another user write in it without the sticky bit: whoever may rename ``path`` away may put
    their own folder (and sockets) in its place after it was checked."""
    parent = Path(os.path.realpath(path.parent))
    for folder in (parent, *parent.parents):
        try:
            info = os.stat(folder)
        except FileNotFoundError:  # made by this user when the folder is: checked again then
            continue
        if info.st_uid not in (0, os.getuid()):
            raise NotPrivate(f"{folder}, above {path}, belongs to uid {info.st_uid}: refused")
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            raise NotPrivate(
                f"{folder}, above {path}, lets others rename what is in it (mode "
                f"{stat.S_IMODE(info.st_mode):04o}, no sticky bit): refused"
            )
    return parent / path.name


def runtime_candidates() -> list[Path]:
    """Where this user's runtime folder may be, in order: ``$XDG_RUNTIME_DIR/pipelines``, ``{temp}/pipelines-{uid}``,
    then ``~/.cache/pipelines-{uid}``, the one no other user can take first."""
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    candidates = [Path(runtime) / "pipelines"] if runtime and Path(runtime).is_dir() else []
    return [*candidates, Path(tempfile.gettempdir()) / f"pipelines-{uid}", Path.home() / ".cache" / f"pipelines-{uid}"]


def runtime_folder() -> Path:
    """This user's private folder for the pipelines' sockets and slot files: ``$PIPELINES_RUNTIME_DIR`` (refused if
    not private), else the first of ``runtime_candidates`` that is private with no other user above it (created 0700).

    A candidate another user took first (their folder, a link, a loose mode) or could swap (a folder above it is
    theirs) is passed over, never used: every process of the stack passes over the same ones, so they meet in the
    same folder, and another local user can neither plant the stack's sockets nor keep it from starting.
    """
    # imported here: the engine fork server loads this module by its path for check_private alone
    from tasks.core.settings import MachineSettings

    configured = MachineSettings.read().runtime_dir
    if configured:
        return _private_below_trusted(Path(configured))
    refused = []
    for candidate in runtime_candidates():
        try:
            return _private_below_trusted(candidate)
        except NotPrivate as error:
            refused.append(str(error))
    raise NotPrivate("no private runtime folder: " + "; ".join(refused))


def _private_below_trusted(path: Path) -> Path:
    """``private_folder`` of ``path`` once ``check_parents`` passed, checked again with every folder above made."""
    folder = private_folder(check_parents(path))
    check_parents(folder)
    return folder


def private_logs(folder: Path) -> Path:
    """``folder`` for logs only this user reads: made 0700 (an existing one of this user's made 0700 too) and every
    file in it 0600, so the logs an older stack left readable by everyone are closed as well."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    for path in folder.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o600)
    return folder


def open_private_log(path: Path):
    """``path`` opened for appending (binary), 0600 from its first byte: created with that mode, or made so."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def write_secret(path: Path, content: bytes | str) -> Path:
    """``content`` written whole to ``path`` in a private folder: staged 0600 beside it, then renamed over it, so no
    reader sees half of it and no one else ever can read it."""
    private_folder(path.parent)
    staged = path.with_name(f".{path.name}.{os.getpid()}.part")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content.encode() if isinstance(content, str) else content)
    os.replace(staged, path)
    return path
