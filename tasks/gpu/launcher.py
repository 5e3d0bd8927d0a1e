"""Local backend: run one task's command and leave its exit code in a file that any process can read.

    python -I -S launcher.py EXIT_FILE -- COMMAND [ARGS...]

The task outlives the process that started it (a killed flow run, a worker restart), so its exit must not
live only in that process's ``Popen``: the watcher, the scheduled sweep, ``gpu stop`` and the reconciler
all read ``EXIT_FILE``. Standard library only (started with ``-S``, it must not import the project).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def _write(path: str, code: int) -> None:
    """Write the exit code atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        handle.write(str(code))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    """Run the command after ``--``, wait for it, record its exit code (negative: the signal that ended it)."""
    exit_file, separator, command = argv[0], argv[1], argv[2:]
    if separator != "--" or not command:
        sys.exit("usage: launcher.py EXIT_FILE -- COMMAND [ARGS...]")
    # a stop signals the whole process group: the launcher outlives its command to record how it ended
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    try:
        child = subprocess.Popen(command)
    except OSError as error:
        print(f"command cannot start: {error}", file=sys.stderr, flush=True)
        _write(exit_file, 127)
        return 0
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - wait() retries on EINTR itself
            continue
    _write(exit_file, code)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
