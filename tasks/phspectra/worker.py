"""The fitting process of a chunk: ``phspectra.fit_gaussians`` per spectrum, each fit bounded in time.

A chunk is fitted in a child process of its own (the seed's worker Lambda), so that:
- fits use every core (no GIL), on the thread pool and on Dask alike;
- each spectrum's fit can be bounded with ``SIGALRM`` (only a process's main thread can take signals);
- the process doing the fit has a pid that the chunk item records, and that can die (OOM, SIGKILL) without
  taking its orchestrator with it.

Children are forked by a small fork server (a clean ``python -m tasks.phspectra.worker`` process per
caller process, with numpy/scipy/phspectra already imported, so a child costs milliseconds). It is a
plain subprocess, so it works from Dask's daemonic worker processes too.
"""

from __future__ import annotations

import atexit
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
from typing import Any


def _exit_with_parent(parent: int) -> None:
    """Exit this process once ``parent`` is no longer its parent (checked every 0.5 s)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


if __name__ == "__main__" and os.environ.get("PHSPECTRA_FORKSERVER_PARENT"):
    # the fork server watches its parent before its slow imports: a parent killed meanwhile leaves no server
    threading.Thread(target=_exit_with_parent, args=(int(os.environ["PHSPECTRA_FORKSERVER_PARENT"]),), daemon=True).start()

import numpy as np  # noqa: E402
import phspectra  # noqa: E402


STOP_POLL_S = 0.2  # how often a waiting caller checks whether it was asked to stop the fit
TIMED_OUT = -1  # n_components of a spectrum whose fit exceeded the time limit (refitted by the slow lane)
DEFAULT_BETA = inspect.signature(phspectra.fit_gaussians).parameters["beta"].default
FIT_PARAM_NAMES = tuple(p for p in inspect.signature(phspectra.fit_gaussians).parameters if p != "signal")


class SpectrumTimeout(Exception):
    """A spectrum's fit ran past its time limit."""


class WorkerDied(RuntimeError):
    """The fitting process ended without results (killed, out of memory, crashed)."""


class FitStopped(RuntimeError):
    """The caller stopped the fit (its claim on the chunk was lost); the fitting process was killed."""


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


def _on_alarm(signum, frame):  # noqa: ARG001 - signal handler signature
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


def worker_main(in_path: str, out_path: str, params: dict[str, Any], time_limit: float | None) -> None:
    """The child's body: spectra from ``in_path`` (npz), rows pickled to ``out_path`` (written last)."""
    with np.load(in_path) as data:
        spectra = data["spectra"]
    rows = fit_spectra(spectra, params, time_limit)
    tmp = out_path + ".part"
    with open(tmp, "wb") as handle:
        pickle.dump(rows, handle, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, out_path)


class _ForkServer:
    """A clean interpreter (``python -m tasks.phspectra.worker``) with phspectra imported, that forks one
    child per request. Unlike multiprocessing's forkserver it never re-imports the caller's ``__main__``.

    Protocol on one connection: request (in_path, out_path, params, time_limit) -> child's pid -> "done".
    A child killed mid-fit closes the connection without "done" (EOFError for the caller).
    """

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="phspectra-forkserver-")
        self.address = os.path.join(self.folder, "socket")
        self.authkey = os.urandom(16)
        self.owner = os.getpid()
        env = {**os.environ, "PHSPECTRA_FORKSERVER_KEY": self.authkey.hex(), "PHSPECTRA_FORKSERVER_PARENT": str(self.owner)}
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen([sys.executable, "-m", "tasks.phspectra.worker", "--serve", self.address], env=env)
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


def start_fork_server() -> None:
    """Start this process's fork server now, waiting until it serves (it runs already: nothing to do)."""
    _fork_server()


def _fork_server() -> _ForkServer:
    """This process's fork server, started on first use (and again if it died)."""
    global _server
    with _server_lock:
        if _server is None or _server.process.poll() is not None or _server.owner != os.getpid():
            _server = _ForkServer()
            atexit.register(_server.close)
        return _server


def warm_up() -> None:
    """Start this process's fork server in the background (it imports numpy/scipy/phspectra once)."""
    threading.Thread(target=_fork_server, name="phspectra-forkserver-warm-up", daemon=True).start()


def serve(address: str) -> None:
    """The fork server's loop; it exits when its parent dies."""
    from multiprocessing.connection import Listener

    if not os.environ.get("PHSPECTRA_FORKSERVER_PARENT"):  # started by hand: watch the parent from here
        threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    listener = Listener(address + ".tmp", family="AF_UNIX", authkey=bytes.fromhex(os.environ["PHSPECTRA_FORKSERVER_KEY"]))
    os.replace(address + ".tmp", address)  # the socket appears only once it listens
    while True:
        try:
            connection = listener.accept()
        except Exception:  # a client that failed authentication
            continue
        if os.fork() == 0:  # the child: fit, report, exit
            listener._listener._socket.close()  # noqa: SLF001 - the child must not keep the server socket
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 1
            try:
                args = connection.recv()
                connection.send(os.getpid())
                worker_main(*args)
                connection.send("done")
                code = 0
            finally:
                os._exit(code)
        connection.close()


def run_in_child(
    spectra_path: str | Path,
    params: Mapping[str, Any],
    time_limit: float | None,
    on_start: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> list[dict[str, Any]]:
    """Fit the spectra of an npz file in a child process; ``on_start(pid)`` is called once it runs.

    Raises WorkerDied if the child ends without writing its results (killed, out of memory, crashed), and
    FitStopped (the child killed) once ``stop`` is set.
    """
    with tempfile.TemporaryDirectory(prefix="phspectra-fit-") as tmp:
        out_path = os.path.join(tmp, "rows.pkl")
        connection = _fork_server().connect()
        try:
            connection.send((str(spectra_path), out_path, dict(params), time_limit))
            pid = connection.recv()
            if on_start:
                on_start(pid)
            while not connection.poll(STOP_POLL_S):  # readable at "done" and at EOF (the child died)
                if stop is not None and stop.is_set():
                    os.kill(pid, signal.SIGKILL)
                    raise FitStopped(f"fitting process {pid} stopped: its claim was lost")
            try:
                connection.recv()
            except EOFError:
                raise WorkerDied(f"fitting process {pid} ended without results (killed or crashed)") from None
        finally:
            connection.close()
        with open(out_path, "rb") as handle:
            return pickle.load(handle)


if __name__ == "__main__":  # python -m tasks.phspectra.worker --serve ADDRESS
    serve(sys.argv[2])
