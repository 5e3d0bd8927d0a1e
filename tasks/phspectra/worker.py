"""The fitting process of a chunk: ``phspectra.fit_gaussians`` per spectrum, each fit bounded in time.

A chunk is fitted in child processes (the seed's worker Lambda), so that:
- fits use every core (no GIL), on the thread pool and on Dask alike;
- each spectrum's fit can be bounded with ``SIGALRM`` (only a process's main thread can take signals);
- the process doing the fit has a pid that the chunk item records, and that can die (OOM, SIGKILL) without
  taking its orchestrator with it.

Children are forked by a small fork server (a clean ``python -m tasks.phspectra.worker`` process per
caller process, with numpy/scipy/phspectra already imported, so a child costs milliseconds). It is a
plain subprocess, so it works from Dask's daemonic worker processes too. Its BLAS/OpenMP thread pools are sized
before numpy loads, as a careful user would: the caller's cores shared among its fitting slots (at least one
thread each), so ``slots`` fitting processes never run more threads than there are cores; thread variables the
environment sets already (``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``, ...) are the user's choice and kept.

A caller process has ``slots`` fitting processes at a time (its cores), shared by every chunk it fits: each
free slot forks a child for the next piece of the oldest chunk, pieces shrinking as the work left does
(guided self-scheduling). So the oldest chunk is fitted on every core, the others' bookkeeping (Parquet,
DynamoDB, Prefect states) overlaps with it, and the last chunk leaves no core idle for longer than a small piece.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import inspect
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from tasks.core.errors import LostRace, PipelineError, Unavailable


def _exit_with_parent(parent: int) -> None:
    """Exit this process once ``parent`` is no longer its parent (checked every 0.5 s)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


if __name__ == "__main__" and os.environ.get("PHSPECTRA_FORKSERVER_PARENT"):
    # the fork server watches its parent before its slow imports: a parent killed meanwhile leaves no server
    threading.Thread(
        target=_exit_with_parent, args=(int(os.environ["PHSPECTRA_FORKSERVER_PARENT"]),), daemon=True
    ).start()

import numpy as np  # noqa: E402 - after the watcher above: a parent killed during these imports leaves no server
import phspectra  # noqa: E402 - after the watcher above: a parent killed during these imports leaves no server

STOP_POLL_S = 0.2  # how often a waiting caller checks whether it was asked to stop the fit
MIN_PIECE = 4  # spectra: the smallest piece a slot forks a child for (the bare pool's chunksize)
TIMED_OUT = -1  # n_components of a spectrum whose fit exceeded the time limit (refitted by the slow lane)
DEFAULT_BETA = inspect.signature(phspectra.fit_gaussians).parameters["beta"].default
FIT_PARAM_NAMES = tuple(p for p in inspect.signature(phspectra.fit_gaussians).parameters if p != "signal")


# the thread pools a fitting process's numpy/scipy may start: OpenBLAS (numpy's and scipy's), OpenMP, MKL, BLIS, ...
THREAD_VARIABLES = (
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def caller_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's cpuset), at least 1."""
    with contextlib.suppress(AttributeError, OSError):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def threads_per_fit(slots: int, cores: int | None = None) -> int:
    """BLAS/OpenMP threads per fitting process: the cores shared among ``slots`` fitting processes, at least 1."""
    return max(1, (cores or caller_cores()) // max(1, slots))


def thread_environment(threads: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The thread variables a fork server starts with: ``threads`` each, unless ``environ`` sets one (then none
    changes: the user chose)."""
    if any(environ.get(name) for name in THREAD_VARIABLES):
        return {}
    return dict.fromkeys(THREAD_VARIABLES, str(threads))


class SpectrumTimeout(PipelineError):
    """A spectrum's fit ran past its time limit."""


class WorkerDied(Unavailable, RuntimeError):
    """The fitting process ended without results (killed, out of memory, crashed)."""


class FitStopped(LostRace, RuntimeError):
    """The caller stopped the fit (its claim on the chunk was lost); its fitting processes were killed."""


class Fitted(NamedTuple):
    """A fit's rows in spectrum order, the seconds its fitting processes spent in ``fit_spectra``, and how many
    processes (pieces) fitted it."""

    rows: list[dict[str, Any]]
    fit_seconds: float
    n_processes: int


def validate_fit_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``params`` as keyword arguments of ``fit_gaussians``, or ValueError naming the unknown keys."""
    params = dict(params or {})
    unknown = sorted(set(params) - set(FIT_PARAM_NAMES))
    if unknown:
        raise ValueError(f"unknown fit_params key(s) {unknown}: fit_gaussians accepts {list(FIT_PARAM_NAMES)}")
    for name, value in params.items():
        default = inspect.signature(phspectra.fit_gaussians).parameters[name].default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"fit_params[{name!r}] must be a number, got {value!r}")
        if isinstance(default, int):
            if not float(value).is_integer():
                raise ValueError(f"fit_params[{name!r}] must be an integer, got {value!r}")
            params[name] = int(value)
        else:
            params[name] = float(value)
    return params


def _on_alarm(signum, frame):  # signal handler signature
    raise SpectrumTimeout()


def fit_one(spectrum: np.ndarray, params: Mapping[str, Any], time_limit: float | None = None) -> dict[str, Any]:
    """One spectrum's row: beta, rms, min_persistence and its components (n_components -1 on timeout)."""
    beta = float(params.get("beta", DEFAULT_BETA))
    rms = float(phspectra.estimate_rms(spectrum))
    row: dict[str, Any] = {"beta": beta, "rms": rms, "min_persistence": beta * rms}
    try:
        if time_limit:
            signal.setitimer(signal.ITIMER_REAL, time_limit)
        try:
            components = phspectra.fit_gaussians(spectrum, **params)
        finally:
            if time_limit:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except SpectrumTimeout:
        components = None
    if components is None:
        row.update(n_components=TIMED_OUT, component_amplitudes=[], component_means=[], component_stddevs=[])
    else:
        row.update(
            n_components=len(components),
            component_amplitudes=[float(c.amplitude) for c in components],
            component_means=[float(c.mean) for c in components],
            component_stddevs=[float(c.stddev) for c in components],
        )
    return row


def fit_spectra(spectra: np.ndarray, params: Mapping[str, Any], time_limit: float | None) -> list[dict[str, Any]]:
    """Every spectrum's row, in order (call in a process's main thread when ``time_limit`` is set)."""
    if time_limit:
        signal.signal(signal.SIGALRM, _on_alarm)
    return [fit_one(np.asarray(s, dtype=np.float64), params, time_limit) for s in spectra]


def worker_main(
    in_path: str, out_path: str, params: dict[str, Any], time_limit: float | None, lo: int, hi: int
) -> float:
    """The child's body: spectra ``[lo, hi)`` of ``in_path`` (npz), rows pickled to ``out_path`` (written last);
    the seconds the fit took."""
    with np.load(in_path) as data:
        spectra = data["spectra"][lo:hi]
    began = time.perf_counter()
    rows = fit_spectra(spectra, params, time_limit)
    seconds = time.perf_counter() - began
    tmp = out_path + ".part"
    with open(tmp, "wb") as handle:
        pickle.dump(rows, handle, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, out_path)
    return seconds


class _ForkServer:
    """A clean interpreter (``python -m tasks.phspectra.worker``) with phspectra imported, that forks one
    child per request. Unlike multiprocessing's forkserver it never re-imports the caller's ``__main__``.

    Protocol on one connection: request (in_path, out_path, params, time_limit, lo, hi) -> child's pid -> the
    fit's seconds. A child killed mid-fit closes the connection without them (EOFError for the caller).
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads  # BLAS/OpenMP threads of each fitting process (unless the environment chose)
        self.folder = tempfile.mkdtemp(prefix="phspectra-forkserver-")
        self.address = os.path.join(self.folder, "socket")
        self.authkey = os.urandom(16)
        self.owner = os.getpid()
        env = {
            **os.environ,
            **thread_environment(threads, os.environ),  # before the server imports numpy: pools are sized at load
            "PHSPECTRA_FORKSERVER_KEY": self.authkey.hex(),
            "PHSPECTRA_FORKSERVER_PARENT": str(self.owner),
        }
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tasks.phspectra.worker", "--serve", self.address], env=env
        )
        deadline = time.monotonic() + 120
        while not os.path.exists(self.address):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise WorkerDied(f"the fitting fork server did not start (exit code {self.process.poll()})")
            time.sleep(0.01)

    def connect(self):
        """A new authenticated connection to the fork server's socket."""
        from multiprocessing.connection import Client

        return Client(self.address, family="AF_UNIX", authkey=self.authkey)

    def close(self) -> None:
        """Kill the fork server and remove its socket folder."""
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_server_lock = threading.Lock()
_server: _ForkServer | None = None


def start_fork_server(slots: int = 1) -> None:
    """Start this process's fork server for ``slots`` fitting slots now, waiting until it serves (it runs
    already: nothing to do)."""
    _slots.resize(slots)
    _fork_server()


def _fork_server() -> _ForkServer:
    """This process's fork server, started on first use (again if it died, or if the slots now call for another
    thread count: the old one serves its children to the end and goes at exit)."""
    global _server
    threads = threads_per_fit(_slots.capacity)
    with _server_lock:
        if (
            _server is None
            or _server.process.poll() is not None
            or _server.owner != os.getpid()
            or _server.threads != threads
        ):
            _server = _ForkServer(threads)
            atexit.register(_server.close)
        return _server


def warm_up(slots: int = 1) -> None:
    """Start this process's fork server for ``slots`` fitting slots in the background (it imports
    numpy/scipy/phspectra once)."""
    _slots.resize(slots)
    threading.Thread(target=_fork_server, name="phspectra-forkserver-warm-up", daemon=True).start()


def warm_fit() -> None:
    """Fit one small spectrum, so what numpy/scipy set up on first use is there before any child is forked."""
    channels = np.arange(64, dtype=np.float64)
    spectrum = np.exp(-0.5 * ((channels - 32.0) / 3.0) ** 2) + 0.01 * np.sin(channels)
    with contextlib.suppress(Exception):  # a warm-up only: a fit's real errors surface in the children
        fit_one(spectrum, {})


def serve(address: str) -> None:
    """The fork server's loop; it exits when its parent dies."""
    from multiprocessing.connection import Listener

    if not os.environ.get("PHSPECTRA_FORKSERVER_PARENT"):  # started by hand: watch the parent from here
        threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    listener = Listener(
        address + ".tmp", family="AF_UNIX", authkey=bytes.fromhex(os.environ["PHSPECTRA_FORKSERVER_KEY"])
    )
    warm_fit()
    # the imported modules' objects leave the collector's view: a child's collections never touch (and copy) them
    gc.freeze()
    os.replace(address + ".tmp", address)  # the socket appears only once it listens
    while True:
        try:
            connection = listener.accept()
        except Exception:  # noqa: BLE001 - a client that failed authentication (or hung up) must not stop the server
            continue
        if os.fork() == 0:  # the child: fit, report, exit
            listener._listener._socket.close()  # the child must not keep the server socket
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 1
            try:
                args = connection.recv()
                connection.send(os.getpid())
                connection.send(worker_main(*args))
                code = 0
            finally:
                os._exit(code)
        connection.close()


class _Job:
    """One ``run_in_child`` call: its ``n`` spectra handed to the slots in pieces, rows gathered by piece."""

    def __init__(
        self,
        path: str,
        n: int,
        params: dict[str, Any],
        time_limit: float | None,
        folder: str,
        on_start: Callable[[int], None] | None,
    ) -> None:
        self.path, self.n, self.params, self.time_limit, self.folder = path, n, params, time_limit, folder
        self.on_start = on_start  # called with the first fitting process's pid
        self.handed = 0  # spectra [0, handed) are in pieces already
        self.running = 0  # pieces being fitted now
        self.pieces: dict[int, list[dict[str, Any]]] = {}  # piece start -> its rows
        self.pids: set[int] = set()
        self.fit_seconds = 0.0
        self.error: BaseException | None = None
        self.done = threading.Event()


class _Slots:
    """A caller process's fitting slots: ``capacity`` threads, each forking one child at a time for the next
    piece of the oldest job with spectra left."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.jobs: list[_Job] = []  # oldest first
        self.capacity = 0
        self.alive: set[int] = set()  # indices of the slot threads running
        self.owner = os.getpid()

    def resize(self, capacity: int) -> None:
        """``capacity`` slots from now on (threads past it exit once their piece ends)."""
        if self.owner != os.getpid():  # a forked copy: the threads and jobs were the parent's
            self.__init__()
        with self.changed:
            self.capacity = max(1, capacity)
            for index in set(range(self.capacity)) - self.alive:
                self.alive.add(index)
                threading.Thread(
                    target=self._slot, args=(index,), name=f"phspectra-fit-slot-{index}", daemon=True
                ).start()
            self.changed.notify_all()

    def submit(self, job: _Job) -> None:
        """Queue a job behind the others."""
        with self.changed:
            self.jobs.append(job)
            self._settle(job)
            self.changed.notify_all()

    def cancel(self, job: _Job, error: BaseException) -> None:
        """Hand out no more of the job's pieces and kill its fitting processes; the first error stays."""
        with self.changed:
            job.error = job.error or error
            job.handed = job.n
            for pid in job.pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._settle(job)

    def _settle(self, job: _Job) -> None:
        """Mark the job done once every piece is handed out and none runs (caller holds the lock)."""
        if job.handed >= job.n and not job.running and not job.done.is_set():
            self.jobs.remove(job)
            job.done.set()

    def _next_piece(self, index: int) -> tuple[_Job, int, int] | None:
        """The oldest job's next piece, sized to a share of all the work not yet handed out; None: exit."""
        with self.changed:
            while True:
                if index >= self.capacity:
                    self.alive.discard(index)
                    return None
                job = next((j for j in self.jobs if j.handed < j.n), None)
                if job is not None:
                    break
                self.changed.wait()
            left = sum(j.n - j.handed for j in self.jobs)
            size = job.n - job.handed if self.capacity == 1 else max(MIN_PIECE, -(-left // (2 * self.capacity)))
            lo, job.handed = job.handed, min(job.n, job.handed + size)
            job.running += 1
            return job, lo, job.handed

    def _slot(self, index: int) -> None:
        while (piece := self._next_piece(index)) is not None:
            job, lo, hi = piece
            try:
                rows, seconds = self._fit_piece(job, lo, hi)
            except BaseException as error:  # noqa: BLE001 - the job's caller raises it
                self.cancel(job, error)
                rows = None
            with self.changed:
                job.running -= 1
                if rows is not None:
                    job.pieces[lo] = rows
                    job.fit_seconds += seconds
                self._settle(job)

    def _fit_piece(self, job: _Job, lo: int, hi: int) -> tuple[list[dict[str, Any]], float]:
        """Fork a child for spectra ``[lo, hi)`` of the job, wait for it; its rows and fit seconds."""
        out_path = os.path.join(job.folder, f"rows-{lo}.pkl")
        connection = _fork_server().connect()
        pid = None
        try:
            connection.send((job.path, out_path, job.params, job.time_limit, lo, hi))
            pid = connection.recv()
            with self.changed:
                if job.error is not None:  # cancelled while it started
                    os.kill(pid, signal.SIGKILL)
                job.pids.add(pid)
                on_start, job.on_start = job.on_start, None
            if on_start:
                on_start(pid)
            try:
                seconds = connection.recv()
            except EOFError:
                raise WorkerDied(f"fitting process {pid} ended without results (killed or crashed)") from None
        except BaseException:
            if pid is not None and pid in job.pids:  # e.g. on_start failed: the child must not fit on unseen
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise
        finally:
            connection.close()
            with self.changed:
                job.pids.discard(pid)
        with open(out_path, "rb") as handle:
            return pickle.load(handle), seconds


_slots = _Slots()


def run_in_child(
    spectra_path: str | Path,
    params: Mapping[str, Any],
    time_limit: float | None,
    on_start: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
    slots: int = 1,
) -> Fitted:
    """Fit the spectra of an npz file in child processes, on this process's ``slots`` fitting slots;
    ``on_start(pid)`` is called once the first runs.

    Raises WorkerDied if a child ends without writing its results (killed, out of memory, crashed), and
    FitStopped (its children killed) once ``stop`` is set.
    """
    with np.load(spectra_path) as data:
        n = len(data["spectra"])
    _slots.resize(slots)
    with tempfile.TemporaryDirectory(prefix="phspectra-fit-") as folder:
        job = _Job(str(spectra_path), n, dict(params), time_limit, folder, on_start)
        _slots.submit(job)
        try:
            while not job.done.wait(STOP_POLL_S):
                if stop is not None and stop.is_set():
                    pids = sorted(job.pids)
                    raise FitStopped(f"fitting process(es) {pids} stopped: the claim was lost")
        except BaseException as error:
            _slots.cancel(job, error)
            job.done.wait(30)  # killed children end at once: their slots let go of the folder
            raise
        if job.error is not None:
            raise job.error
        return Fitted([row for lo in sorted(job.pieces) for row in job.pieces[lo]], job.fit_seconds, len(job.pieces))


if __name__ == "__main__":  # python -m tasks.phspectra.worker --serve ADDRESS
    serve(sys.argv[2])
