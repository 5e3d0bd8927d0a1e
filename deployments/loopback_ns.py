"""Run a server that binds every interface (DynamoDB Local: ``*:PORT``, no bind option) reachable from loopback only,
and only by requests signed with the stack's key.

    python -m deployments.loopback_ns PORT -- COMMAND...

This process binds and listens on ``127.0.0.1:PORT`` in the machine's network namespace at once, then moves itself
into a new network namespace (with a user namespace when not root) whose only interface is its own loopback, and
starts COMMAND there: COMMAND's ``*:PORT`` exists only inside. Nothing listens on the machine's other addresses.
Each HTTP request on a connection to ``127.0.0.1:PORT`` is read whole and forwarded only when its AWS SigV4
signature is valid under the stack's key (``deployments/sigv4_door.py``; the key from the file that
``PIPELINES_DYNAMODB_KEYS`` names, else ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` in this process's environment,
never its command line); any other is answered with a DynamoDB-style error and its connection closed. A connection
that comes before COMMAND answers inside waits for it. COMMAND is started again when it dies (``held_port.Restarting``),
so the port is never free while it restarts. No firewall rule, nothing to undo: when this process ends, the namespace
goes.
Exit codes: 0 once stopped (SIGTERM); 2 without a key; 3 when the namespace cannot be made (the caller says so and
decides).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct
import sys
import threading
import time
from pathlib import Path

if not __package__:  # run as a script (its path shows in ps as the relay's): the repository's modules importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deployments.held_port import Restarting
from deployments.sigv4_door import Door, NoKey, Reader, Refused

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
CANNOT_ISOLATE = 3


def enter_private_network() -> None:
    """Move this (single-threaded) process into a new network namespace with its loopback up; OSError if not allowed."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET if uid == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if libc.unshare(flags) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"unshare: {os.strerror(error)}")
    if flags & CLONE_NEWUSER:  # keep our own ids inside (files in the data folder stay ours)
        with open("/proc/self/setgroups", "w") as handle:
            handle.write("deny")
        with open("/proc/self/uid_map", "w") as handle:
            handle.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as handle:
            handle.write(f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:  # `ip link set lo up`, without `ip`
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags_now = struct.unpack("16sH14s", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags_now | IFF_UP, b""))


def cannot_isolate() -> str | None:
    """Why this machine refuses a private network namespace (tried in a throwaway child), or None when it allows one."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child tries and reports; the caller's own namespace never changes
        os.close(read)
        try:
            enter_private_network()
            message = b""
        except OSError as error:
            message = str(error).encode() or b"refused"
        os.write(write, message)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        reason = pipe.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return reason or None


INNER_WAIT_S = 120  # how long a connection that came before the server answers inside waits for it
INTERNAL_ERROR = "com.amazonaws.dynamodb.v20120810#InternalServerError"


def _connect_inner(port: int, server: Restarting) -> socket.socket | None:
    """A connection to the server inside, waiting (up to INNER_WAIT_S) while it starts or restarts; None if it never
    answers."""
    deadline = time.monotonic() + INNER_WAIT_S
    while True:
        try:
            inner = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            if server.stopping or time.monotonic() > deadline:
                return None
            time.sleep(0.1)
            continue
        inner.settimeout(None)
        inner.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return inner


def _answer(inner: socket.socket, client: socket.socket, refusing: threading.Event) -> None:
    """Relay the server's responses to the caller until the server ends the connection (then end the caller's,
    unless a refusal is about to be written to it)."""
    try:
        while data := inner.recv(262144):
            client.sendall(data)
    except OSError:
        pass
    finally:
        if not refusing.is_set():
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)


class Relay:
    """One caller's connection: each request read whole and checked at the door, then forwarded to the server."""

    def __init__(self, client: socket.socket, caller: str, port: int, server: Restarting, door: Door) -> None:
        self.client, self.caller, self.port, self.server, self.door = client, caller, port, server, door
        self.inner: socket.socket | None = None
        self.answers: threading.Thread | None = None
        self.refusing = threading.Event()

    def serve(self) -> None:
        """Forward checked requests until the caller or the server ends the connection, or a request is refused."""
        reader = Reader(self.client)
        try:
            while True:
                try:
                    request = reader.request()
                    if request is None:
                        break
                    self.door.check(request)
                except Refused as refusal:
                    self.refuse(refusal)
                    return
                if self.inner is None and not self.open_inner():
                    return
                self.inner.sendall(request.head + request.body)
            if self.inner is not None:  # the caller is done sending: the server's last answers still reach it
                self.inner.shutdown(socket.SHUT_WR)
                self.answers.join()
        except OSError:
            pass
        finally:
            for sock in (self.client, self.inner):
                if sock is not None:
                    sock.close()

    def open_inner(self) -> bool:
        self.inner = _connect_inner(self.port, self.server)
        if self.inner is None:
            unavailable = Refused("DynamoDB Local does not answer", INTERNAL_ERROR, 503)
            self.client.sendall(unavailable.response())
            return False
        self.answers = threading.Thread(target=_answer, args=(self.inner, self.client, self.refusing), daemon=True)
        self.answers.start()
        return True

    def refuse(self, refusal: Refused) -> None:
        """Answer ``refusal`` (after the server's answers so far) and end the connection; one log line, which never
        holds a key or a signature."""
        print(f"loopback_ns: refused a request from {self.caller}: {refusal.message}", file=sys.stderr, flush=True)
        self.refusing.set()
        if self.inner is not None:  # the requests forwarded before it are answered first (the server ends then)
            with contextlib.suppress(OSError):
                self.inner.shutdown(socket.SHUT_WR)
            self.answers.join(timeout=10)
            with contextlib.suppress(OSError):
                self.inner.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.client.sendall(refusal.response())
            self.client.shutdown(socket.SHUT_RDWR)


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def main(argv: list[str]) -> int:
    """Bind and listen on loopback, isolate, start the command, relay checked requests until it exits."""
    port, command = int(argv[0]), argv[argv.index("--") + 1 :]
    try:
        door = Door.from_environment(dict(os.environ))
    except NoKey as error:
        print(f"loopback_ns: {error}", file=sys.stderr, flush=True)
        return 2
    outer = socket.socket()
    outer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart rebinds past the last TIME_WAITs
    outer.bind(("127.0.0.1", port))  # in the machine's namespace, before leaving it
    outer.listen(128)  # at once: a port bound but not listened on is another user's to take
    try:
        enter_private_network()
    except OSError as error:
        print(f"loopback_ns: cannot make a private network namespace ({error})", file=sys.stderr, flush=True)
        return CANNOT_ISOLATE
    # the command is started again when it dies, so the port stays this relay's through the restart; it ends with
    # this relay (a SIGKILLed relay leaves no server holding its data in a namespace no one reaches)
    server = Restarting(command)

    def accept() -> None:
        """Serve every connection, one thread each; one that comes before the server answers inside waits."""
        while True:
            client, (host, caller_port) = outer.accept()
            relay = Relay(client, f"{host}:{caller_port}", port, server, door)
            threading.Thread(target=relay.serve, daemon=True).start()

    def announce() -> None:
        while not _answers(port):
            time.sleep(0.2)
        print(f"loopback_ns: 127.0.0.1:{port} -> private namespace, SigV4 checked", flush=True)

    threading.Thread(target=accept, daemon=True).start()
    threading.Thread(target=announce, daemon=True).start()
    return server.run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
