"""Run a server that binds every interface (DynamoDB Local: ``*:PORT``, no bind option) reachable from loopback only.

    python -m deployments.loopback_ns PORT -- COMMAND...

This process binds ``127.0.0.1:PORT`` in the machine's network namespace, then moves itself into a new network
namespace (with a user namespace when not root) whose only interface is its own loopback, and starts COMMAND
there: COMMAND's ``*:PORT`` exists only inside. Connections to ``127.0.0.1:PORT`` are relayed in; nothing listens
on the machine's other addresses, and a connection from another local user (its socket's uid in the kernel's TCP
table) is closed unanswered: only this process's user reaches COMMAND. No firewall rule, nothing to undo: when this
process ends, the namespace goes.
Exit codes: COMMAND's; 3 when the namespace cannot be made (the caller says so and decides).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

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


def _end_with_parent() -> None:
    """In the command's process: SIGTERM when this relay dies (Linux's PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))


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


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, target):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Callers:
    """Who is at the other end of a loopback connection: the kernel's TCP tables of the machine's network namespace,
    opened before this process leaves it (a /proc/net file keeps the namespace it was opened in)."""

    def __init__(self) -> None:
        self.tables = [open(name) for name in ("/proc/self/net/tcp", "/proc/self/net/tcp6") if os.path.exists(name)]

    def uid(self, caller_port: int, port: int) -> int | None:
        """The uid owning the socket 127.0.0.1:``caller_port`` connected to 127.0.0.1:``port``, or None."""
        local, remote = f"0100007F:{caller_port:04X}", f"0100007F:{port:04X}"  # IPv4 (or v4-mapped v6), hex
        for table in self.tables:
            table.seek(0)
            for line in table.read().splitlines()[1:]:
                fields = line.split()
                if fields[1].endswith(local) and fields[2].endswith(remote):
                    return int(fields[7])
        return None


def _relay(client: socket.socket, port: int) -> None:
    try:
        inner = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        client.close()
        return
    inner.settimeout(None)
    for sock in (client, inner):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=_pipe, args=(inner, client), daemon=True).start()
    _pipe(client, inner)
    client.close()
    inner.close()


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def main(argv: list[str]) -> int:
    """Bind loopback, isolate, start the command, relay until it exits."""
    port, command = int(argv[0]), argv[argv.index("--") + 1 :]
    callers = Callers()  # before leaving the machine's namespace
    owner = os.getuid()
    outer = socket.socket()
    outer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    outer.bind(("127.0.0.1", port))  # in the machine's namespace, before leaving it
    try:
        enter_private_network()
    except OSError as error:
        print(f"loopback_ns: cannot make a private network namespace ({error})", file=sys.stderr, flush=True)
        return CANNOT_ISOLATE
    # the command ends with this relay (a SIGKILLed relay leaves no server holding its data in a namespace no one
    # reaches; the next relay starts its own)
    child = subprocess.Popen(command, preexec_fn=_end_with_parent)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    while not _answers(port):  # listen outside only once the server answers inside
        if child.poll() is not None:
            return child.returncode
        time.sleep(0.2)
    outer.listen(128)
    print(f"loopback_ns: 127.0.0.1:{port} -> private namespace (pid {child.pid})", flush=True)

    def accept() -> None:
        """Relay every connection to the namespace, one thread each."""
        while True:
            client, (_, caller_port) = outer.accept()
            uid = callers.uid(caller_port, port)
            if uid != owner:  # another local user (or one the tables do not show): closed unanswered
                print(f"loopback_ns: refused a caller running as uid {uid} (only {owner})", file=sys.stderr, flush=True)
                client.close()
                continue
            threading.Thread(target=_relay, args=(client, port), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return child.wait()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
