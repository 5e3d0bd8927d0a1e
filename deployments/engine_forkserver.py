"""A fork server for the local worker's flow runs: Prefect imported once, each run a fork of it.

Starting a flow run is a new Python process that imports Prefect, prefect-aws and the pipelines' libraries before
the flow's first line: about 1.5 s of the ~2 s a `deployment run` waits on 2 cores. The server imports
those libraries once, then forks a child per run; the child takes the caller's standard streams, environment,
working folder and ``sys.path``, refreshes Prefect's settings and logging from that environment, and runs
``python -m prefect.engine`` as the caller would have.

The pipelines' own code is preloaded too: every ``flows`` module of this checkout, with the ``tasks`` and ``blocks``
modules it imports (a flow module's import was ~0.3-0.8 s of each run's start). A run still executes the code on disk
now: at each fork the server compares every ``.py`` file under ``flows/``, ``tasks/`` and ``blocks/`` (mtime_ns and
size; a file added or removed counts) with the listing it took before its preload. Where anything changed, the child
drops every project module and imports them anew, as without the preload, and the server preloads again after the
fork (the next run is fast again). When the engine loads the entrypoint (after the pull step set the run's folder),
the child also checks that the run's path finds the packages in the folders the preloaded ones came from; a run of
another checkout drops them and imports its own. The child marks which it was in the run's environment:
``PIPELINES_ENGINE_FORK=preloaded`` or ``fresh``. The preloaded modules were imported in the server's environment
and folder, so module-level code in those packages reads neither (``os.environ``, ``Path.cwd()``: at call time) and
makes no client, session, thread or socket that every fork would share:
``tests/stack/test_engine_forkserver_preload.py`` checks both. The Prefect settings a ``@task`` or ``@flow``
decorator reads as it is applied (default retries, caching) were the server's: a run whose own differ imports anew too.

    python deployments/engine_forkserver.py serve SOCKET   # `make up`'s supervisor runs it beside the worker
    python deployments/engine_forkserver.py run SOCKET     # the pool's command for a run

``run`` is the process the worker starts and watches: it hands its streams to the server, forwards SIGTERM, SIGINT
and SIGHUP to its child (Prefect's cancellation), and exits as the child did (its code, or killed by its signal).
If it is killed outright the server SIGKILLs its child, and a child whose server dies is SIGKILLed by the kernel, so
no run outlives the process Prefect watches. With no server listening it execs ``python -m prefect.engine`` itself.
Only the standard library is imported at the top: ``run`` starts in milliseconds.

The stack's supervisor (``deployments/supervisor.py``) runs the server and the worker as two programs and starts
either again when it dies. The runs are forks of the server, not of the worker: a worker that dies leaves them
running, and their output, which the worker read through pipes, is relayed by a thread of theirs that drops it once
the worker is gone (rich would end the run at its next log line on the broken pipe). The server ends on SIGTERM
(``make down``) once its runs, which get the SIGTERM too, have ended.

A run hands over its whole environment (secrets included) and its streams, so both ends check the other: the socket
lives in a private folder (0700, this user's: ``tasks/core/private_folder.py``; the server refuses any other), ``run``
talks only to a socket its own user owns in such a folder and whose peer (SO_PEERCRED) runs as its user, and the
server serves only callers of its own uid. A check that fails: ``run`` starts the engine itself (nothing handed over)
and says why; the server refuses the caller.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import time

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# third-party libraries a flow run imports; a failed import is skipped (the run imports it itself, or fails there)
PRELOAD = (
    "prefect.flow_engine",
    "prefect.task_engine",
    "prefect.deployments",
    "prefect.futures",
    "prefect.task_runners",
    "prefect.cache_policies",
    "prefect.artifacts",
    "prefect.events",
    "prefect_aws",
    "boto3",
    "botocore.session",
    "pyarrow",
    "pyarrow.parquet",
    "numpy",
    "ffmpeg",
    "yaml",
    "av",  # PyAV: a video run's first probe imported it (~0.1-0.25 s) inside the user's wait
)
# the pipelines' own packages: preloaded too (every ``flows`` module and what it imports), checked at each fork
PROJECT_PACKAGES = ("flows", "tasks", "blocks")
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORK_MARK = "PIPELINES_ENGINE_FORK"  # in a run's environment: "preloaded" or "fresh" (its project code imported anew)
HEADER = struct.Struct("!Q")
PR_SET_PDEATHSIG = 1
UCRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (the kernel's word, SO_PEERCRED)."""
    return UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))[1]


def _private_folder_module():
    """``tasks/core/private_folder.py`` loaded by its path (``run`` starts with ``deployments/`` as its path)."""
    import importlib.util

    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tasks", "core", "private_folder.py"
    )
    spec = importlib.util.spec_from_file_location("_pipelines_private_folder", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def untrusted_socket(socket_path: str) -> str | None:
    """Why the server socket at ``socket_path`` may not be this user's own (its folder reachable by others, or the
    socket another user's), or None when it is; a missing socket is None (nothing to hand anything to)."""
    try:
        info = os.lstat(socket_path)
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
        return f"{socket_path} is not a socket of this user (uid {info.st_uid})"
    try:
        _private_folder_module().check_private(os.path.dirname(socket_path) or ".")
    except OSError as error:
        return str(error)
    return None


# --------------------------------------------------------------------------- the run command (stdlib only)


def run(socket_path: str) -> None:
    """Start ``python -m prefect.engine`` as a fork of the server at ``socket_path``; exit as it did."""
    argv = [sys.executable, "-m", "prefect.engine"]
    refused = untrusted_socket(socket_path)
    try:
        if refused:
            raise PermissionError(refused)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.connect(socket_path)
        if peer_uid(server) != os.getuid():
            raise PermissionError(f"the process serving {socket_path} runs as uid {peer_uid(server)}, not as this user")
    except PermissionError as error:  # never hand the environment to another user: the engine runs here instead
        sys.stderr.write(f"engine fork server not used: {error}\n")
        sys.stderr.flush()
        os.execv(sys.executable, argv)
    except OSError:  # no server (a worker started without one): the engine in a process of its own
        os.execv(sys.executable, argv)
    pending: list[int] = []
    child: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child:
            os.kill(child[0], signum)
        else:
            pending.append(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    cwd = os.getcwd()
    request = json.dumps(
        {"env": dict(os.environ), "cwd": cwd, "path": [cwd, *sys.path[1:]], "argv": sys.argv[3:]}
    ).encode()
    socket.send_fds(server, [HEADER.pack(len(request))], [0, 1, 2])
    server.sendall(request)
    replies = server.makefile("r", encoding="ascii")
    for line in replies:
        word, value = line.split()
        if word == "pid":
            child.append(int(value))
            for signum in pending:
                os.kill(child[0], signum)
        elif word == "exit":
            code = int(value)
            if code < 0:  # killed by a signal: end the same way, so the worker reports what it would have
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            sys.exit(code)
    sys.stderr.write(f"engine fork server at {socket_path} went away before the flow run ended\n")
    sys.exit(1)


# --------------------------------------------------------------------------- the server


def project_sources(root: str = PROJECT_ROOT) -> dict[str, tuple[int, int]]:
    """Every Python file under the project packages in ``root``: its path -> (mtime_ns, size). A file edited, added
    or removed changes it."""
    sources: dict[str, tuple[int, int]] = {}
    folders = [os.path.join(root, package) for package in PROJECT_PACKAGES]
    while folders:
        try:
            entries = list(os.scandir(folders.pop()))
        except OSError:  # a package folder gone: its files are gone from the listing too
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    folders.append(entry.path)
            elif entry.name.endswith(".py"):
                info = entry.stat()
                sources[entry.path] = (info.st_mtime_ns, info.st_size)
    return sources


def project_module_names() -> list[str]:
    """The project modules imported in this process."""
    return [name for name in sys.modules if name.split(".", 1)[0] in PROJECT_PACKAGES]


def package_folders(path: list[str], cwd: str) -> dict[str, list[str]]:
    """Where each project package would be found on ``path``: every folder of that name (``pkgutil.extend_path``
    joins them all into the package), in order."""
    found: dict[str, list[str]] = {}
    for package in PROJECT_PACKAGES:
        folders = found.setdefault(package, [])
        for entry in path:
            folder = os.path.realpath(os.path.join(cwd, entry, package))
            if folder not in folders and os.path.isdir(folder):
                folders.append(folder)
    return found


def preloaded_folders() -> dict[str, list[str]]:
    """The folders of each preloaded project package (its ``__path__``), as ``package_folders`` gives them."""
    found: dict[str, list[str]] = {}
    for package in PROJECT_PACKAGES:
        module = sys.modules.get(package)
        if module is not None:
            folders = found.setdefault(package, [])
            for folder in map(os.path.realpath, getattr(module, "__path__", [])):
                if folder not in folders:
                    folders.append(folder)
    return found


def _import_checked(import_object, folders: dict[str, list[str]]):
    """Prefect's ``import_object`` (how the engine loads a run's entrypoint, after the pull step set its folder),
    first checking that the run's path finds the project packages where the preloaded ones came from; where it
    does not (a run from another checkout), the preloaded modules go and the run imports its own."""

    def checked(import_path: str):
        cwd = os.getcwd()
        # the folders import_object puts first on the path: the script's own, then the working folder
        first = [os.path.dirname(os.path.abspath(import_path.rsplit(":", 1)[0]))] if ".py:" in import_path else []
        found = package_folders([*first, cwd, *sys.path], cwd)
        if any(found[package] != folders[package] for package in folders):
            drop_project_modules()
            os.environ[FORK_MARK] = "fresh"
        return import_object(import_path)

    return checked


def drop_project_modules() -> None:
    """Forget the imported project modules, so that the next import of each reads its file on disk now; the block
    types they registered go too (registered again without Prefect's warning of a type overridden)."""
    import importlib

    names = set(project_module_names())
    for name in names:
        del sys.modules[name]
    try:
        from prefect.utilities.dispatch import _TYPE_REGISTRIES
    except ImportError:
        _TYPE_REGISTRIES = {}
    for registry in _TYPE_REGISTRIES.values():
        for key in [key for key, cls in registry.items() if getattr(cls, "__module__", None) in names]:
            del registry[key]
    importlib.invalidate_caches()


def preload_project(root: str = PROJECT_ROOT) -> dict[str, tuple[int, int]]:
    """Import every ``flows`` module of ``root`` (with the tasks and blocks they import); the sources as they were
    before the imports (a file edited during them reads as changed at the next fork)."""
    import importlib

    sources = project_sources(root)
    if root not in sys.path:
        sys.path.append(root)  # after the server's own folders: the server runs with deployments/ first
    importlib.invalidate_caches()
    flow_modules = sorted(
        os.path.basename(path)[:-3]
        for path in sources
        if os.path.dirname(path) == os.path.join(root, "flows") and not path.endswith("__init__.py")
    )
    for name in flow_modules:
        try:
            importlib.import_module(f"flows.{name}")
        except Exception as error:  # noqa: BLE001 - a module being edited: the run imports it itself (or fails there)
            print(f"engine fork server: flows.{name} not preloaded: {error!r}", file=sys.stderr, flush=True)
    return sources


def _set_parent_death_signal(signum: int = signal.SIGKILL) -> None:
    """This process gets ``signum`` when the server (its parent) dies (Linux; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum))
    except (OSError, AttributeError):
        pass


def _relay_pipes() -> list:
    """Stream 1 and 2, where they are pipes (the worker reads them), become pipes of this process that a thread
    each drains into them; once the worker that read one is gone (EPIPE), the rest is dropped. Written to directly,
    a dead worker's pipe would crash the run at its next log line (rich exits on a broken pipe), while the run
    itself, a fork of the server, goes on and its logs reach the API as before. The threads, to join at exit."""
    import threading

    def drain(read_fd: int, out_fd: int) -> None:
        broken = False
        while chunk := os.read(read_fd, 65536):
            while chunk and not broken:
                try:
                    chunk = chunk[os.write(out_fd, chunk) :]
                except OSError:  # the reader is gone: nobody will read the rest
                    broken = True
        os.close(read_fd)
        os.close(out_fd)

    relays = []
    for target in (1, 2):
        if not stat.S_ISFIFO(os.fstat(target).st_mode):  # a terminal or a file never breaks this way
            continue
        read_fd, write_fd = os.pipe()
        out_fd = os.dup(target)
        os.dup2(write_fd, target)
        os.close(write_fd)
        relay = threading.Thread(target=drain, args=(read_fd, out_fd), name=f"relay {target}", daemon=True)
        relay.start()
        relays.append(relay)
    return relays


def _settings_read_at_import(settings) -> tuple:
    """The Prefect settings a ``@task`` or ``@flow`` decorator reads as it is applied (default retries and retry
    delays, caching): a preloaded module's tasks and flows hold the server's."""
    return (settings.tasks, settings.flows, settings.results)


def _become_run(request: dict, fds: list[int], server_pid: int, preloaded: dict[str, list[str]] | None) -> None:
    """In the forked child: take the caller's streams, folder, environment and path; run the engine; exit.
    ``preloaded``: the preloaded project packages' folders, or None where the files changed since the preload (the
    run imports its project modules anew, as without the fork server)."""
    import atexit
    import runpy
    import threading
    import traceback

    _set_parent_death_signal()
    if os.getppid() != server_pid:  # the server died before the line above
        os._exit(1)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    relays = _relay_pipes()
    code = 0
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["path"]
        sys.argv = ["-m", *request["argv"]]
        import prefect.context
        import prefect.logging.configuration
        from prefect.settings import get_current_settings

        applied = _settings_read_at_import(get_current_settings())  # the server's, that the preload's decorators read
        prefect.context.refresh_global_settings_context()  # the settings Prefect read at import: from the run's env
        prefect.logging.configuration.setup_logging(incremental=False)
        if preloaded is not None and _settings_read_at_import(get_current_settings()) != applied:
            preloaded = None  # the run's own settings differ: its decorators must read them
        if preloaded is None:
            drop_project_modules()
        os.environ[FORK_MARK] = "fresh" if preloaded is None else "preloaded"
        if preloaded:
            import prefect.flows
            import prefect.utilities.importtools

            checked = _import_checked(prefect.utilities.importtools.import_object, preloaded)
            prefect.utilities.importtools.import_object = checked
            prefect.flows.import_object = checked  # bound there at import
        sys.modules.pop("prefect.engine", None)  # run as __main__, not the preloaded module (runpy warns otherwise)
        runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        if isinstance(exit_.code, int) or exit_.code is None:
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - the run's child reports any failure (a folder gone) and exits 1
        traceback.print_exc()
        code = 1
    # what the interpreter does at exit (wait for threads, atexit: Prefect flushes its logs to the API), without
    # unwinding into the server's own stack
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed or broken stream must not keep the child from exiting
                pass
        for target in (1, 2):  # the relays' end of file (a process the run started may still hold them open)
            os.close(target)
        for relay in relays:
            relay.join(timeout=2)
        os._exit(code)


class ForkServer:
    """Accepts ``run`` callers on a Unix socket and forks a child per caller; one thread, no locks held at fork."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}  # child pid -> its caller's connection
        self.callers: dict[socket.socket, int] = {}
        self.stopping = False
        self.sources: dict[str, tuple[int, int]] = {}  # the project's files as they were at the preload
        self.folders: dict[str, list[str]] = {}  # where the preloaded project packages came from

    def listen(self) -> None:
        _private_folder_module().check_private(os.path.dirname(self.socket_path) or ".")  # NotPrivate: refused
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o077)  # only this user may start runs through it
        try:
            self.listener.bind(self.socket_path)
        finally:
            os.umask(old_umask)
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")

    def serve(self) -> int:
        """Preload, then serve until SIGTERM (``make down``) once the runs have ended."""
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        started = time.perf_counter()
        import importlib

        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception as error:  # noqa: BLE001 - a library a run may not need
                print(f"engine fork server: {name} not preloaded: {error}", file=sys.stderr, flush=True)
        self._preload_project()
        self.listen()
        print(
            f"engine fork server: listening on {self.socket_path} ({time.perf_counter() - started:.1f} s to preload)",
            flush=True,
        )
        try:
            return self._loop()
        finally:
            os.unlink(self.socket_path)

    def _preload_project(self) -> None:
        """(Re)import the pipelines' own modules as they are on disk now."""
        drop_project_modules()
        self.sources = preload_project()
        self.folders = preloaded_folders()

    def _stop(self, _signum: int, _frame: object) -> None:
        self.stopping = True  # the group's SIGTERM reached the children too: wait for them, then exit

    def _loop(self) -> int:
        while True:
            if self.stopping and not self.children:
                return 0
            for key, _ in self.selector.select(timeout=0.5):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    os.read(self.wake_r, 512)
                    self._reap()
                else:
                    self._caller_readable(key.fileobj)
            self._reap()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        if self.stopping:
            conn.close()  # its run command falls back to nothing: it reports that the server went away
            return
        caller = peer_uid(conn)
        if caller != os.getuid():  # a run of another user would run as this one, with this one's rights
            print(f"engine fork server: refused a caller running as uid {caller}", file=sys.stderr, flush=True)
            conn.close()
            return
        try:
            conn.settimeout(10)
            message, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
            (size,) = HEADER.unpack(message)
            body = bytearray()
            while len(body) < size:
                chunk = conn.recv(min(1 << 20, size - len(body)))
                if not chunk:
                    raise ConnectionError("caller closed its request early")
                body += chunk
            request = json.loads(body)
            conn.settimeout(None)
        except (OSError, ValueError, struct.error) as error:
            print(f"engine fork server: bad request: {error}", file=sys.stderr, flush=True)
            conn.close()
            return
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        changed = project_sources() != self.sources  # an edit, a file added or removed: the preload is stale
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.selector.close()
            for fd in (self.wake_r, self.wake_w):
                os.close(fd)
            for other in [self.listener, conn, *self.callers]:
                other.close()
            try:
                _become_run(request, fds, server_pid, None if changed else self.folders)  # ends in os._exit
            except BaseException:  # noqa: BLE001 - a bad request (say, a folder gone): never unwind into the server's loop
                import traceback

                traceback.print_exc()
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.callers[conn] = pid
        self.selector.register(conn, selectors.EVENT_READ, "caller")
        self._reply(conn, f"pid {pid}")
        if changed:  # the next run is fast again: the modules as they are now (this one imports them itself)
            started = time.perf_counter()
            self._preload_project()
            print(
                f"engine fork server: project code changed, preloaded again ({time.perf_counter() - started:.1f} s)",
                flush=True,
            )

    def _caller_readable(self, conn: socket.socket) -> None:
        """A caller sends nothing after its request: readable means it is gone, so its run goes too."""
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if data:
            return
        self.selector.unregister(conn)
        pid = self.callers.get(conn)
        if pid is not None and pid in self.children:
            try:
                os.kill(pid, signal.SIGKILL)  # as a run process killed with its caller would be
            except ProcessLookupError:
                pass

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            self.callers.pop(conn, None)
            self._reply(conn, f"exit {os.waitstatus_to_exitcode(status)}")
            try:
                self.selector.unregister(conn)
            except (KeyError, ValueError):
                pass
            conn.close()

    @staticmethod
    def _reply(conn: socket.socket, line: str) -> None:
        try:
            conn.sendall(f"{line}\n".encode())
        except OSError:
            pass  # the caller is gone; its child was or will be killed


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "run":
        run(argv[1])
    if len(argv) == 2 and argv[0] == "serve":
        return ForkServer(argv[1]).serve()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
