"""The local event source: a file-system watch (watchfiles, inotify) on a ``file://`` store's prefix, plus a
catch-up listing at start and every ``rescan_seconds``, so files that landed while nothing watched are found.

    watch thread (inotify) ─┐
    catch-up listing ───────┴─> keys to look at ──> complete? ──> receive() ──> Arrival ──> ack() / release()

A file still being written is never offered:
- names ending ``.tmp`` / ``.part`` or starting with ``.`` are ignored (the object store's own atomic writes
  go through ``.{name}.{random}.part`` and a rename);
- a file renamed in (moved into place once written) is taken as soon as it is seen: the watch reported it
  appear and never change, and no process has it open for writing (a read lease would be refused);
- a file written in place is taken once its size and mtime have been stable for ``settle_seconds``.

An arrival's ``event_id`` is its key, size and mtime (ns). What has been offered and not acked or released is
not offered again; after a restart the catch-up listing offers everything again and the pipelines'
create-if-absent writes make the repeats change nothing.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import Iterator, Sequence

from tasks.core import keys
from tasks.core.object_store import LocalStore, ObjectStore
from tasks.landing.sources import Arrival

LOG = logging.getLogger(__name__)
IGNORED_SUFFIXES = (".tmp", ".part")
TICK_SECONDS = 0.05  # how often receive() looks again at files waiting to settle
MAX_RELEASE_DELAY = 60.0  # a released arrival is offered again after 1, 2, 4 … seconds, at most this


@dataclass
class _Look:
    """What was last seen of one file: its version, since when, and whether the watch saw it change."""

    size: int
    mtime_ns: int
    since: float  # monotonic time this version was first seen
    modified: bool = False  # the watch reported a write to it (written in place, not renamed in)


def ignored_name(name: str) -> bool:
    """A temporary or hidden file name: an unfinished write, never an arrival."""
    return name.startswith(".") or name.endswith(IGNORED_SUFFIXES)


def open_for_writing(path: Path) -> bool | None:
    """Whether any process has ``path`` open for writing (Linux read lease); None when the kernel cannot say."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False
    except OSError as error:
        return True if error.errno in (errno.EAGAIN, errno.EBUSY) else None
    finally:
        os.close(fd)


class LocalWatchSource:
    """An EventSource over a folder of a ``file://`` object store (see the module docstring)."""

    def __init__(
        self,
        store_url: str,
        prefix: str,
        *,
        suffixes: Sequence[str] | None = None,
        settle_seconds: float = 1.0,
        rescan_seconds: float = 60.0,
    ):
        store = ObjectStore.from_url(store_url)
        if not isinstance(store, LocalStore):
            raise ValueError(f"the watch source needs a file:// store, not {store_url!r} (use the SQS source)")
        self.store = store
        self.prefix = keys.safe_key(prefix).rstrip("/") + "/"
        self.folder = store.path(self.prefix)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.suffixes = tuple(suffixes) if suffixes else None
        self.settle_seconds = settle_seconds
        self.rescan_seconds = rescan_seconds
        self._changed = threading.Condition()
        self._dirty: dict[str, bool] = {}  # keys the watch reported: key -> whether it saw a write
        self._looks: dict[str, _Look] = {}  # files seen and not offered yet
        self._offered: dict[str, str] = {}  # key -> event id offered and not acked or released
        self._acked: dict[str, str] = {}  # key -> event id acked (a rescan does not offer it again)
        self._not_before: dict[str, float] = {}  # released keys: not offered again before this monotonic time
        self._receives: dict[str, int] = {}  # event id -> times offered
        self._refused: set[str] = set()  # names already logged as refused (logged once)
        self._next_rescan = 0.0
        self._stop = threading.Event()
        self._watching = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"watch {self.prefix}", daemon=True)
        self._thread.start()
        self._watching.wait(timeout=10)

    @classmethod
    def for_prefix(cls, store_url: str | None, prefix: str, suffixes: Sequence[str] | None = None, **options) -> "LocalWatchSource":
        """A watch on ``prefix`` of the store at ``store_url`` (the configured object store when empty)."""
        if not store_url:
            from tasks.core.config import object_store

            store_url = object_store().url
        return cls(store_url, prefix, suffixes=suffixes, **options)

    # ------------------------------------------------------------------ the watch thread and the listing

    def _watch(self) -> None:
        """Feed the keys inotify reports into ``_dirty`` until closed (a failed watch leaves the rescans)."""
        import watchfiles

        try:
            changes_seen = watchfiles.watch(
                self.folder, watch_filter=None, debounce=50, step=10, rust_timeout=500, yield_on_timeout=True,
                stop_event=self._stop, raise_interrupt=False,
            )
            self._watching.set()
            for changes in changes_seen:
                with self._changed:
                    for change, path in changes:
                        key = self._key_of(Path(path))
                        if key is not None:
                            written = change == watchfiles.Change.modified
                            self._dirty[key] = self._dirty.get(key, False) or written
                    if changes:
                        self._changed.notify_all()
        except Exception:  # noqa: BLE001 - the listing every rescan_seconds still finds every file
            LOG.exception("the file watch on %s stopped; relying on the listing every %.0f s", self.folder, self.rescan_seconds)
        finally:
            self._watching.set()

    def _key_of(self, path: Path) -> str | None:
        """The store key of a path under the prefix, or None (ignored name, wrong suffix, invalid key: logged once)."""
        if ignored_name(path.name) or (self.suffixes and not path.name.endswith(self.suffixes)):
            return None
        try:
            key = keys.safe_key(path.relative_to(self.store.root).as_posix())
        except (ValueError, keys.InvalidKey) as error:
            if str(path) not in self._refused:
                self._refused.add(str(path))
                LOG.warning("ignoring %s: not a valid key under %s (%s)", path, self.prefix, error)
            return None
        return key if key.startswith(self.prefix) else None

    def _listing(self, folder: Path | None = None) -> Iterator[tuple[str, os.stat_result]]:
        """Every regular file under the prefix (or ``folder``) with its stat (one scandir pass, no I/O per file)."""
        folders = [folder or self.folder]
        while folders:
            try:
                entries = list(os.scandir(folders.pop()))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    key = self._key_of(Path(entry.path))
                    if key is not None:
                        try:
                            yield key, entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue

    def _rescan(self) -> None:
        """The catch-up listing: note every file not offered or acked in its current version."""
        found = set()
        for key, stat in self._listing():
            found.add(key)
            self._note(key, stat)
        for key in [k for k in self._acked if k not in found]:  # deleted since: forget them
            del self._acked[key]

    # ------------------------------------------------------------------ deciding what is complete

    @staticmethod
    def _event_id(key: str, size: int, mtime_ns: int) -> str:
        return f"{key}:{size}:{mtime_ns}"

    def _note(self, key: str, stat: os.stat_result, written: bool = False) -> None:
        """Record a look at ``key`` (unless that version was acked); a new version restarts its settle time."""
        if self._acked.get(key) == self._event_id(key, stat.st_size, stat.st_mtime_ns):
            return
        look = self._looks.get(key)
        if look is None or (look.size, look.mtime_ns) != (stat.st_size, stat.st_mtime_ns):
            self._looks[key] = _Look(stat.st_size, stat.st_mtime_ns, time.monotonic(), written or bool(look and look.modified))
        elif written:
            look.modified = True

    def _complete(self, key: str, look: _Look, now: float) -> bool:
        """Renamed in (never written to since it appeared, open for writing nowhere), or stable long enough."""
        if now - look.since >= self.settle_seconds or time.time_ns() - look.mtime_ns >= self.settle_seconds * 1e9:
            return True
        return not look.modified and look.size > 0 and open_for_writing(self.store.path(key)) is False

    def _ready(self, max_items: int) -> list[Arrival]:
        """Look at reported and waiting files; the complete ones not in flight, as arrivals (at most ``max_items``)."""
        with self._changed:
            dirty, self._dirty = self._dirty, {}
        for key, written in dirty.items():
            stat = self._stat(key)
            if stat is None:
                self._looks.pop(key, None)
                continue
            if S_ISDIR(stat.st_mode):  # a new folder: files may have landed in it before the watch covered it
                for inner, inner_stat in self._listing(self.store.path(key)):
                    self._note(inner, inner_stat)
            elif S_ISREG(stat.st_mode):
                self._note(key, stat, written)
        now = time.monotonic()
        ready: list[Arrival] = []
        for key, look in list(self._looks.items()):
            if len(ready) >= max_items:
                break
            if self._acked.get(key) == self._event_id(key, look.size, look.mtime_ns):
                del self._looks[key]  # noted by a listing before its ack came
                continue
            if key in self._offered or self._not_before.get(key, 0.0) > now or not self._complete(key, look, now):
                continue
            stat = self._stat(key)
            if stat is None or (stat.st_size, stat.st_mtime_ns) != (look.size, look.mtime_ns):
                if stat is not None:
                    self._note(key, stat)
                else:
                    del self._looks[key]
                continue
            del self._looks[key]
            event_id = self._event_id(key, look.size, look.mtime_ns)
            self._offered[key] = event_id
            self._receives[event_id] = self._receives.get(event_id, 0) + 1
            ready.append(Arrival(
                url=self.store.url_for(key), key=key, size=look.size,
                event_time=datetime.fromtimestamp(look.mtime_ns / 1e9, timezone.utc).isoformat(),
                event_id=event_id, receive_count=self._receives[event_id],
            ))
        return ready

    def _stat(self, key: str) -> os.stat_result | None:
        try:
            return os.stat(self.store.path(key), follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None

    # ------------------------------------------------------------------ EventSource

    def receive(self, max_items: int = 10, wait_seconds: float = 20.0) -> list[Arrival]:
        """Up to ``max_items`` complete files, waiting at most ``wait_seconds`` for the first."""
        deadline = time.monotonic() + wait_seconds
        while True:
            if time.monotonic() >= self._next_rescan:
                self._rescan()
                self._next_rescan = time.monotonic() + self.rescan_seconds
            ready = self._ready(max_items)
            left = deadline - time.monotonic()
            if ready or left <= 0:
                return ready
            # files waiting to settle are looked at every tick; otherwise sleep until the watch reports one
            timeout = min(left, max(0.0, self._next_rescan - time.monotonic()), TICK_SECONDS if self._looks else left)
            with self._changed:
                if not self._dirty:
                    self._changed.wait(timeout)

    def ack(self, arrivals: Sequence[Arrival]) -> None:
        """These files' work is durable: forget them (a later version of the same key is a new arrival)."""
        for arrival in arrivals:
            if self._offered.get(arrival.key) == arrival.event_id:
                del self._offered[arrival.key]
            self._acked[arrival.key] = arrival.event_id
            self._not_before.pop(arrival.key, None)
            self._receives.pop(arrival.event_id, None)

    def release(self, arrivals: Sequence[Arrival], reason: str) -> None:
        """Offer these again later: after 1, 2, 4 … seconds (at most a minute) by how often they were offered."""
        for arrival in arrivals:
            if self._offered.get(arrival.key) == arrival.event_id:
                del self._offered[arrival.key]
            delay = min(MAX_RELEASE_DELAY, 2.0 ** (arrival.receive_count - 1))
            self._not_before[arrival.key] = time.monotonic() + delay
            with self._changed:
                self._dirty.setdefault(arrival.key, False)

    def close(self) -> None:
        """Stop the watch thread; what was not acked is offered again by the next source's catch-up listing."""
        self._stop.set()
        self._thread.join(timeout=10)
