"""The stack's runtime folder (its sockets, slot files) when another local user got to the temporary folder first.

``nobody`` may create ``{temp}/pipelines-{uid}`` before the stack does (a folder of theirs, a loose one, a link), or
own a folder above the one the stack would use: the stack never uses either, and still starts, in a folder it owns.
Each case runs in a fresh interpreter (``tempfile`` caches the temporary folder) with its own temporary folder
(sticky, open to all, as /tmp is) and home, so the machine's /tmp is left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers.other_user import as_nobody_python

REPO = Path(__file__).resolve().parents[2]
WHERE = (
    "import json; from pathlib import Path; from deployments.supervisor import socket_for; "
    "from tasks.core.private_folder import runtime_folder; "
    "print(json.dumps([str(runtime_folder()), socket_for(Path('/nonexistent/stack-data'))]))"
)


@pytest.fixture
def machine():
    """A temporary folder like /tmp (root's, 1777) and a home (root's, 0700), in a folder others may enter."""
    if os.geteuid() != 0:
        pytest.skip("another user's folders need root to set up")
    top = Path(tempfile.mkdtemp(prefix="runtime-"))
    top.chmod(0o755)
    temp, home = top / "tmp", top / "home"
    temp.mkdir()
    temp.chmod(0o1777)
    home.mkdir(mode=0o700)
    yield temp, home
    shutil.rmtree(top, ignore_errors=True)


def _where(temp: Path, home: Path, **env: str) -> tuple[Path, str]:
    """The runtime folder and a stack's supervisor socket, as a fresh process of the stack finds them."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PIPELINES_RUNTIME_DIR", "XDG_RUNTIME_DIR")}
    done = subprocess.run(
        [sys.executable, "-c", WHERE],
        env={**clean, "TMPDIR": str(temp), "HOME": str(home), "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    folder, socket = json.loads(done.stdout)
    return Path(folder), socket


def _owned_private(folder: Path) -> None:
    info = os.lstat(folder)
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700


def test_with_no_one_first_the_stack_uses_its_folder_in_the_temporary_folder(machine):
    temp, home = machine
    folder, socket = _where(temp, home)
    assert folder == temp / f"pipelines-{os.getuid()}" and Path(socket).parent == folder
    _owned_private(folder)


@pytest.mark.parametrize(
    "planted",
    [
        "import os; os.mkdir(TAKEN, 0o700)",  # a folder of theirs
        "import os; os.mkdir(TAKEN); os.chmod(TAKEN, 0o777)",  # open to all
        "import os; os.mkdir(TAKEN + '-mine', 0o777); os.symlink(TAKEN + '-mine', TAKEN)",  # a link to theirs
    ],
    ids=["their-folder", "loose-folder", "link-to-their-folder"],
)
def test_a_runtime_folder_another_user_made_first_is_passed_over_for_one_the_stack_owns(machine, planted):
    temp, home = machine
    taken = temp / f"pipelines-{os.getuid()}"
    made = as_nobody_python(f"TAKEN = {str(taken)!r}; {planted}")
    assert made.returncode == 0, made.stderr
    folder, socket = _where(temp, home)
    assert folder == home / ".cache" / f"pipelines-{os.getuid()}" and Path(socket).parent == folder
    _owned_private(folder)
    assert os.lstat(taken).st_uid != os.getuid() and not any(Path(os.path.realpath(taken)).iterdir())
    assert _where(temp, home)[0] == folder  # every process of the stack meets in the same one


def test_a_runtime_folder_under_a_folder_another_user_owns_is_never_used(machine):
    """$XDG_RUNTIME_DIR left from another user's session (``su`` keeps it): its owner could rename the stack's
    folder away after the check and put their own, with their sockets, in its place."""
    temp, home = machine
    theirs = temp / "run-user-nobody"
    made = as_nobody_python(f"import os; os.mkdir({str(theirs)!r}, 0o755)")
    assert made.returncode == 0, made.stderr
    folder, _ = _where(temp, home, XDG_RUNTIME_DIR=str(theirs))
    assert folder == temp / f"pipelines-{os.getuid()}"
    _owned_private(folder)
    assert not (theirs / "pipelines").exists()
    moved = as_nobody_python(f"import os; os.rename({str(folder)!r}, {str(temp / 'moved')!r}); print('moved')")
    assert moved.returncode != 0 and "moved" not in moved.stdout  # the sticky temporary folder keeps it in place
