"""A recursive inotify watch over a folder that keeps every name as bytes, so no name can stop it.

    TreeWatch(root) ──read(timeout)──> [Change(path: bytes, written)], overflowed

watchfiles (notify) turns each path into a str and stops the whole watch, at its start or at the event, on a name
that is not UTF-8 (``WatchfilesRustInternalError: Unable to decode path``): one such folder anywhere under a landing
place would leave every neighbour to the catch-up listing. Here the caller judges names; the watch only reports.
A folder made or moved in is watched (with all under it) before it is reported, so the caller's listing of it
misses nothing; a folder moved away stops being watched. An overflowed queue says so (the caller lists again).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
import time
from dataclasses import dataclass

LOG = logging.getLogger(__name__)

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF = 0x100, 0x200, 0x400
IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x4000, 0x8000, 0x40000000
IN_ONLYDIR, IN_DONT_FOLLOW, IN_EXCL_UNLINK = 0x01000000, 0x02000000, 0x04000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
WATCHED = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF) | (
    IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK
)  # folders only, a link never followed
EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then len bytes of name)
READ_BYTES = 1 << 16
DEBOUNCE_S, STEP_S = 0.05, 0.01  # once something changed, gather more for up to 50 ms while it keeps coming


@dataclass(frozen=True)
class Change:
    """Something under the watched folder changed: ``path`` (bytes, as the file system spells it), whether its
    content or times changed (``written``), and whether it was made or moved in (``appeared``)."""

    path: bytes
    written: bool = False
    appeared: bool = False


LIBC = ctypes.CDLL(None, use_errno=True)  # the C library this interpreter runs on (inotify_* are glibc's)


class TreeWatch:
    """An inotify watch on ``root`` and every folder under it (see the module docstring); ``close()`` ends it."""

    def __init__(self, root: bytes) -> None:
        self._lib = LIBC
        self.fd = self._lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        self.root = root
        self._folders: dict[int, bytes] = {}  # watch descriptor -> the folder's path
        self._unwatched: set[bytes] = set()  # folders that could not be watched (logged once)
        try:
            if not self._add(root):
                raise FileNotFoundError(errno.ENOENT, "the watched folder is gone", os.fsdecode(root))
            self._root_wd = next(iter(self._folders))
            self._add_under(root)
        except BaseException:
            self.close()
            raise

    def _add(self, folder: bytes) -> bool:
        """Watch ``folder``; False when it cannot be (gone, no longer a folder, not ours to read, no watches left:
        the catch-up listing covers it)."""
        wd = self._lib.inotify_add_watch(self.fd, folder, WATCHED)
        if wd >= 0:
            self._folders[wd] = folder
            return True
        code = ctypes.get_errno()
        if code not in (errno.ENOENT, errno.ENOTDIR) and folder not in self._unwatched:
            self._unwatched.add(folder)
            LOG.warning(
                "cannot watch %r (%s): only the catch-up listing sees what lands there", folder, os.strerror(code)
            )
        return False

    def _add_under(self, top: bytes) -> None:
        """Watch every folder under ``top`` (a link never followed)."""
        stack = [top]
        while stack:
            try:
                with os.scandir(stack.pop()) as entries:
                    for entry in entries:
                        try:
                            if entry.is_dir(follow_symlinks=False) and self._add(entry.path):
                                stack.append(entry.path)
                        except OSError:  # gone meanwhile
                            continue
            except OSError:  # gone or unreadable meanwhile: nothing under it to watch
                continue

    def _forget(self, top: bytes) -> None:
        """Stop watching ``top`` and every folder under it (moved away; moved back in, it is watched again)."""
        for wd, folder in list(self._folders.items()):
            if folder == top or folder.startswith(top + b"/"):
                del self._folders[wd]
                self._lib.inotify_rm_watch(self.fd, wd)

    def read(self, timeout: float) -> tuple[list[Change], bool]:
        """What changed within ``timeout`` seconds (empty when nothing did), gathered for up to DEBOUNCE_S once
        something did, and whether the kernel's queue overflowed (changes were lost); a file that appeared in
        the same gathering is not ``written`` (as watchfiles reported it). Raises FileNotFoundError once the
        watched folder itself is gone."""
        changes: list[Change] = []
        overflowed = False
        deadline = None
        wait = timeout
        while select.select([self.fd], [], [], wait)[0]:
            try:
                data = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                break
            offset = 0
            while offset < len(data):
                wd, mask, _, length = EVENT.unpack_from(data, offset)
                name = data[offset + EVENT.size : offset + EVENT.size + length].rstrip(b"\0")
                offset += EVENT.size + length
                overflowed |= bool(mask & IN_Q_OVERFLOW)
                change = self._event(wd, mask, name)
                if change is not None:
                    changes.append(change)
            deadline = deadline or time.monotonic() + DEBOUNCE_S
            wait = min(STEP_S, max(0.0, deadline - time.monotonic()))
            if wait <= 0:
                break
        if self._root_wd not in self._folders:
            raise FileNotFoundError(errno.ENOENT, "the watched folder is gone", os.fsdecode(self.root))
        appeared = {change.path for change in changes if change.appeared}
        return [Change(c.path, c.written and c.path not in appeared, c.appeared) for c in changes], overflowed

    def _event(self, wd: int, mask: int, name: bytes) -> Change | None:
        """One inotify event as a change (None for the watch's own bookkeeping); folders made, moved in or moved
        away are watched or forgotten first."""
        if mask & IN_IGNORED:
            self._folders.pop(wd, None)
            return None
        folder = self._folders.get(wd)
        if folder is None or not name:  # the queue's overflow, or an event on a watched folder itself
            return None
        path = folder + b"/" + name
        if mask & IN_ISDIR:
            if mask & (IN_CREATE | IN_MOVED_TO) and self._add(path):
                self._add_under(path)
            elif mask & IN_MOVED_FROM:
                self._forget(path)
            elif mask & IN_ATTRIB:  # a folder's own times or mode: nothing landed
                return None
        written = bool(mask & (IN_MODIFY | IN_ATTRIB)) and not mask & IN_ISDIR
        return Change(path, written, appeared=bool(mask & (IN_CREATE | IN_MOVED_TO)))

    def close(self) -> None:
        """End the watch (every folder's with it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
