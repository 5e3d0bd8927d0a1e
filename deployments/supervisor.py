"""The local stack's supervisor: one supervisord (PyPI ``supervisor``) runs every long-lived process of the stack.

supervisord rather than circus: it is the widely used, still maintained one (4.3, 2025), pure Python with no
dependencies, and has what the stack needs built in: a process restarted when it dies, with a pause that grows by a
second on every start that fails (``startretries``), logs rotated by size, a control socket whose mode it sets, and
``user=`` to run PostgreSQL as its own user when the stack runs as root. circus needs ZeroMQ and has had few
releases lately.

Everything lives under the stack's data folder: the generated ``supervisor/supervisord.conf`` (0600, in a 0700
folder: it holds the programs' environment), the logs in ``logs/`` (``<program>.log``, 10 MB x 5 rotated, and
``supervisord.log`` with every start, exit and restart), each 0600 from its first byte (supervisord starts with umask
077 and keeps it for its children; the folder is 0700). The control socket is in this user's private runtime folder
(0700; a Unix socket path is at most 107 bytes, so not under the checkout) with mode 0700: only the stack's user
can start, stop or read its processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
import xmlrpc.client
from pathlib import Path

from deployments.dynamodb_local import StackError

# a start that fails (the process ends before ``startsecs``) is tried again after 1 s, then 2, 3 ... s: the pause
# grows by a second each time, up to STARTRETRIES tries (about 80 minutes in all) before supervisord gives it up
# (FATAL, shown by `make status`; `make up` starts it again). A process that ran ``startsecs`` and then died (a
# SIGKILL, a crash) is started again at once, its pauses counted afresh.
STARTRETRIES = 100
LOG_BYTES, LOG_BACKUPS = "10MB", 5


class Supervisor:
    """The supervisord of one stack data folder: its configuration, control socket and XML-RPC interface."""

    def __init__(self, data: Path, socket_path: str) -> None:
        self.data = data
        self.folder = data / "supervisor"
        self.conf = self.folder / "supervisord.conf"
        self.pidfile = self.folder / "supervisord.pid"
        self.logs = data / "logs"
        self.socket_path = socket_path

    def proxy(self):
        """The XML-RPC proxy on the control socket (``supervisor.*`` methods)."""
        from supervisor.xmlrpc import SupervisorTransport

        transport = SupervisorTransport(None, None, f"unix://{self.socket_path}")
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport).supervisor

    def running(self) -> bool:
        """Whether this folder's supervisord answers on its socket."""
        try:
            return self.proxy().getState()["statename"] == "RUNNING"
        except (OSError, xmlrpc.client.Error):
            return False

    def config_text(self, programs: dict[str, dict[str, str]]) -> str:
        """supervisord.conf for ``programs`` (name -> program options, in start order)."""
        lines = [
            "[unix_http_server]",
            f"file={self.socket_path}",
            "chmod=0700",
            "",
            "[supervisord]",
            f"logfile={self.logs / 'supervisord.log'}",
            f"logfile_maxbytes={LOG_BYTES}",
            f"logfile_backups={LOG_BACKUPS}",
            f"pidfile={self.pidfile}",
            f"childlogdir={self.logs}",
            f"directory={Path(__file__).resolve().parents[1]}",
            "umask=077",
            "",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
            "",
            "[supervisorctl]",
            f"serverurl=unix://{self.socket_path}",
        ]
        for priority, (name, options) in enumerate(programs.items(), start=1):
            section = {
                "priority": str(priority * 10),
                "autostart": "true",
                "autorestart": "true",
                "startsecs": "3",
                "startretries": str(STARTRETRIES),
                "stopasgroup": "true",
                "killasgroup": "true",
                "stopwaitsecs": "60",
                "redirect_stderr": "true",
                "stdout_logfile": str(self.logs / f"{name}.log"),
                "stdout_logfile_maxbytes": LOG_BYTES,
                "stdout_logfile_backups": str(LOG_BACKUPS),
                **options,
            }
            lines += ["", f"[program:{name}]", *(f"{key}={value}" for key, value in section.items())]
        return "\n".join(lines) + "\n"

    def ensure(self, programs: dict[str, dict[str, str]]) -> bool:
        """Write the configuration; start supervisord if it does not run (True), else apply a changed configuration
        (programs added, changed or removed restart) and start any program that is stopped (False)."""
        from tasks.core.private_folder import private_folder, private_logs

        private_folder(self.folder)
        private_logs(self.logs)
        text = self.config_text(programs)
        changed = not self.conf.exists() or self.conf.read_text() != text
        if changed:
            self.conf.touch(mode=0o600)
            self.conf.chmod(0o600)
            self.conf.write_text(text)
        if not self.running():
            result = subprocess.run(
                [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf)],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
                umask=0o077,  # its own log is opened before it sets the configuration's umask: 0600 from the start
            )
            if result.returncode != 0:
                raise StackError(f"supervisord did not start: {result.stdout[-1500:]}{result.stderr[-1500:]}")
            deadline = time.monotonic() + 30
            while not self.running():
                if time.monotonic() > deadline:
                    raise StackError(f"supervisord does not answer on {self.socket_path}; see {self.logs}")
                time.sleep(0.2)
            return True
        if changed:
            self.ctl("update")
        self.ctl("start", "all")
        return False

    def ctl(self, *args: str) -> str:
        """``supervisorctl`` with this configuration; its output."""
        result = subprocess.run(
            [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(self.conf), *args],
            capture_output=True,
            text=True,
        )
        return result.stdout + result.stderr

    def info(self, name: str) -> dict | None:
        """supervisord's record of program ``name`` (statename, pid, start, now ...), or None."""
        with contextlib.suppress(OSError, xmlrpc.client.Error):
            return self.proxy().getProcessInfo(name)
        return None

    def pid(self, name: str) -> int | None:
        """The running process of program ``name``, or None."""
        info = self.info(name)
        return info["pid"] if info and info["statename"] == "RUNNING" and info["pid"] else None

    def statuses(self) -> list[dict]:
        """Every program's record, in start order; [] when supervisord does not run."""
        with contextlib.suppress(OSError, xmlrpc.client.Error):
            return self.proxy().getAllProcessInfo()
        return []

    def stop(self, name: str) -> str:
        """Stop program ``name`` (its whole process group); 'stopped' if it was not running, else 'stopped now'."""
        info = self.info(name)
        if not info or info["statename"] not in ("RUNNING", "STARTING", "BACKOFF"):
            return "stopped"
        with contextlib.suppress(xmlrpc.client.Fault):  # it ended meanwhile
            self.proxy().stopProcess(name, True)
        return "stopped now"

    def shutdown(self) -> bool:
        """Stop every program and supervisord itself; whether it was running."""
        if not self.running():
            return False
        pid = int(self.pidfile.read_text()) if self.pidfile.exists() else None
        with contextlib.suppress(OSError, xmlrpc.client.Error):
            self.proxy().shutdown()
        deadline = time.monotonic() + 120
        while pid is not None and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        return True


def uptime(info: dict) -> str:
    """A running program's uptime as H:MM:SS ('' when it does not run)."""
    if info["statename"] != "RUNNING" or not info["start"]:
        return ""
    seconds = int(info["now"] - info["start"])
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def socket_for(data: Path) -> str:
    """The control socket of the stack in ``data``: in this user's private runtime folder, one per data folder."""
    from tasks.core.private_folder import runtime_folder

    digest = hashlib.sha256(str(data.resolve()).encode()).hexdigest()[:12]
    return str(runtime_folder() / f"supervisor-{digest}.sock")
