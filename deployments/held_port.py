"""Hold a loopback port for a server that restarts: no moment when another local user could listen there instead.

    python -m deployments.held_port PORT -- COMMAND...

This process binds and listens on ``127.0.0.1:PORT`` at once, then runs COMMAND with the listening socket as file
descriptor 3 (``LISTEN_FDS=1``, as systemd's socket activation passes it) and starts COMMAND again whenever it ends,
after a pause that grows while it keeps failing. Connections that arrive while COMMAND restarts wait in the socket's
backlog instead of finding the port free. COMMAND ends with this process (PR_SET_PDEATHSIG); SIGTERM or SIGINT stops
COMMAND and then this process. Exit code 3 when the port is taken (the caller names who holds it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

LISTEN_FD = 3  # systemd's SD_LISTEN_FDS_START
PORT_TAKEN = 3
STEADY_S = 30.0  # a run this long resets the pause before the next start
MAX_PAUSE_S = 10.0


def listening_socket() -> socket.socket:
    """The listening socket a held port handed this process (``LISTEN_FDS``), for a server to accept on; the
    process's own children do not inherit it."""
    if os.environ.pop("LISTEN_FDS", None) != "1":
        raise RuntimeError("no socket was handed to this process: run it under `python -m deployments.held_port`")
    sock = socket.socket(fileno=LISTEN_FD)
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) != 1:
        raise RuntimeError(f"file descriptor {LISTEN_FD} is not a listening socket")
    sock.set_inheritable(False)
    return sock


def _end_with_holder() -> None:
    """In COMMAND's process, before exec: SIGTERM when the holder dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))


def bind_and_listen(port: int) -> socket.socket:
    """``127.0.0.1:port`` bound and listening in one step. SO_REUSEADDR lets a restarted holder bind while the
    connections its predecessor closed sit in TIME_WAIT (60 s); Linux still refuses a bind or listen beside a
    listening socket, so a neighbour cannot share the port."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(512)
    return sock


class Restarting:
    """A command run again whenever it ends, after a pause that doubles while it keeps failing (reset once a run
    lasts STEADY_S), until this process gets SIGTERM or SIGINT (passed on to the command). The command ends with this
    process (PR_SET_PDEATHSIG)."""

    def __init__(self, command: list[str], *, release: tuple[int, ...] = (), **popen) -> None:
        self.command, self.popen, self.release = command, popen, release
        self.child: subprocess.Popen | None = None
        self.stopping = False

    def stop(self, signum: int, _frame=None) -> None:
        self.stopping = True
        for fd in self.release:  # the port is free once the command closes its copy: a successor binds it at once
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self) -> int:
        """Run the command until told to stop; 0 then."""
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        pause = 1.0
        while not self.stopping:
            started = time.monotonic()
            self.child = subprocess.Popen(self.command, preexec_fn=_end_with_holder, **self.popen)
            code = self.child.wait()
            if self.stopping:
                break
            pause = 1.0 if time.monotonic() - started > STEADY_S else min(pause * 2, MAX_PAUSE_S)
            print(
                f"held_port: {self.command[0]} ended ({code}); started again in {pause:g} s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(pause)
        return 0


def main(argv: list[str]) -> int:
    """Bind and listen, then run and restart COMMAND until told to stop."""
    port, command = int(argv[0]), argv[argv.index("--") + 1 :]
    try:
        sock = bind_and_listen(port)
    except OSError as error:
        print(f"held_port: cannot listen on 127.0.0.1:{port} ({error})", file=sys.stderr, flush=True)
        return PORT_TAKEN
    os.dup2(sock.fileno(), LISTEN_FD, inheritable=True)
    print(f"held_port: listening on 127.0.0.1:{port}", flush=True)
    held = (sock.detach(), LISTEN_FD)
    return Restarting(command, release=held, env={**os.environ, "LISTEN_FDS": "1"}, pass_fds=(LISTEN_FD,)).run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
