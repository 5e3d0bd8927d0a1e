"""The local event source: a file-system watch (watchfiles, inotify) on a ``file://`` store's prefix, plus a
catch-up listing at start and every ``rescan_seconds``, so files that landed while nothing watched are found.

    watch thread (inotify) ─┐
    catch-up listing ───────┴─> keys to look at ──> complete? ──> receive() ──> Arrival ──> ack() / release()

A file still being written is never offered:
- names ending ``.tmp`` / ``.part`` or starting with ``.`` are ignored (the object store's own atomic writes
  go through ``.{name}.{random}.part`` and a rename);
- a file renamed in (moved into place once written) is taken as soon as it is seen: the watch reported it
  appear and never change, and no process has it open for writing (a read lease would be refused);
- a file written in place is taken once its size and mtime have been stable for ``settle_seconds`` and no
  process holds it open for writing (a writer that pauses longer than that is waited for until it closes).

A file whose name is not a valid key (not UTF-8, a control character, a backslash) is moved to
``quarantine/landing/`` under its name percent-encoded, beside a ``.reason.json``; its neighbours go on.
Suffix filters (``suffixes``) apply to files only: a folder created or moved in is listed at once.

An arrival's ``event_id`` is its key, size and mtime (ns). What has been offered and not acked or released is
not offered again. After a restart, the catch-up listing starts from the watermark (``WATERMARK_NAME``, a
hidden file in the watched folder): every file that existed when it was taken had been acked, so only folders
and files changed since (ctime) are read and offered; see docs/design.md, "The catch-up watermark".
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from urllib.parse import quote

from tasks.core import keys
from tasks.core.object_store import LocalStore, ObjectStore
from tasks.landing.sources import Arrival

LOG = logging.getLogger(__name__)
IGNORED_SUFFIXES = (".tmp", ".part")
TICK_SECONDS = 0.05  # how often receive() looks again at files waiting to settle
MAX_RELEASE_DELAY = 60.0  # a released arrival is offered again after 1, 2, 4 … seconds, at most this
WATCH_RESTART_S = 0.2  # a file watch that stopped on an error is started again after this
WATERMARK_NAME = ".landing-watermark"  # in the watched folder: a hidden name, never an arrival
# the watermark is taken this long before a listing starts: a timestamp the kernel gave a change an instant
# before the listing (its clock ticks coarser than time.time) still counts as after it
WATERMARK_SLACK_S = 2.0
LANDING_QUARANTINE_PREFIX = "quarantine/landing/"


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


def read_watermark(folder: Path) -> float:
    """The catch-up watermark kept in ``folder`` (epoch seconds); 0 when there is none or it does not parse."""
    try:
        return float(json.loads((folder / WATERMARK_NAME).read_text())["watermark"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def write_watermark(folder: Path, watermark: float) -> None:
    """Keep ``watermark`` in ``folder``: written beside, then renamed over the old one (never half a file)."""
    body = json.dumps({"watermark": watermark, "at": datetime.fromtimestamp(watermark, UTC).isoformat()})
    temporary = folder / f"{WATERMARK_NAME}.{os.getpid()}.part"
    temporary.write_text(body)
    os.replace(temporary, folder / WATERMARK_NAME)


def changed_files(
    folder: Path, since: float, take: Callable[[Path], bool] = lambda path: True
) -> Iterator[tuple[Path, os.stat_result]]:
    """Every regular file under ``folder`` changed (ctime) at or after ``since`` that ``take`` accepts, with its stat.

    A folder whose ctime is older than ``since`` had no entry added, removed or renamed since: its files are not
    looked at, and with no subfolder (link count 2) it is not even read. A folder renamed in after ``since``
    (ctime new, mtime old) counts as new with everything under it, whatever its files' own times."""
    stack: list[tuple[Path, bool]] = [(folder, since <= 0)]
    while stack:
        current, everything = stack.pop()
        try:
            stat = os.stat(current, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            continue
        changed = everything or stat.st_ctime >= since
        if not changed and stat.st_nlink == 2:
            continue  # an unchanged folder without subfolders
        moved_in = everything or (changed and current != folder and stat.st_mtime < since)
        try:
            entries = list(os.scandir(current))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                stack.append((path, moved_in))
            elif changed and entry.is_file(follow_symlinks=False) and take(path):
                try:
                    file_stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if moved_in or file_stat.st_ctime >= since:
                    yield path, file_stat


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
        self._offered_ctime: dict[str, float] = {}  # key -> ctime of the version offered
        self._acked: dict[str, str] = {}  # key -> event id acked (a rescan does not offer it again)
        self._acked_ctime: dict[str, float] = {}  # key -> its ctime when acked (forgotten once under the watermark)
        self._not_before: dict[str, float] = {}  # released keys: not offered again before this monotonic time
        self._receives: dict[str, int] = {}  # event id -> times offered
        self._refused: set[str] = set()  # names already logged as refused (logged once)
        self._watermark = read_watermark(self.folder)  # files changed before it were all acked
        self._scans: list[tuple[float, set[str]]] = []  # (a listing's start, its keys not acked yet): oldest first
        self._next_rescan = 0.0
        self._stop = threading.Event()
        self._watching = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"watch {self.prefix}", daemon=True)
        self._thread.start()
        self._watching.wait(timeout=10)

    @classmethod
    def for_prefix(
        cls, store_url: str | None, prefix: str, suffixes: Sequence[str] | None = None, **options
    ) -> LocalWatchSource:
        """A watch on ``prefix`` of the store at ``store_url`` (the configured object store when empty)."""
        if not store_url:
            from tasks.core.config import object_store

            store_url = object_store().url
        return cls(store_url, prefix, suffixes=suffixes, **options)

    # ------------------------------------------------------------------ the watch thread and the listing

    def _watch(self) -> None:
        """Feed the keys inotify reports into ``_dirty`` until closed; a watch that fails (a name it cannot
        decode) is started again, and a listing then finds what it missed."""
        import watchfiles

        restarted = False
        while not self._stop.is_set():
            try:
                changes_seen = watchfiles.watch(
                    self.folder,
                    watch_filter=None,
                    debounce=50,
                    step=10,
                    rust_timeout=500,
                    yield_on_timeout=True,
                    stop_event=self._stop,
                    raise_interrupt=False,
                )
                self._watching.set()
                for changes in changes_seen:
                    if restarted:  # watching again: list what landed while nothing watched
                        restarted, self._next_rescan = False, 0.0
                    with self._changed:
                        for change, path in changes:
                            key = self._key_of(Path(path), file=None)
                            if key is not None:
                                written = change == watchfiles.Change.modified
                                self._dirty[key] = self._dirty.get(key, False) or written
                        if changes:
                            self._changed.notify_all()
            except Exception as error:  # noqa: BLE001 - watch again; the listing covers the gap
                LOG.warning(
                    "the file watch on %s stopped (%s: %s); watching again and listing what it missed",
                    self.folder,
                    type(error).__name__,
                    error,
                )
                self._next_rescan, restarted = 0.0, True
                self._stop.wait(WATCH_RESTART_S)
            finally:
                self._watching.set()

    def _key_of(self, path: Path, file: bool | None = True) -> str | None:
        """The store key of a path under the prefix, or None (ignored name, a file of another suffix, outside the
        prefix, or a name that is no valid key: quarantined). ``file``: None when it may be a folder."""
        if ignored_name(path.name) or (file and self.suffixes and not path.name.endswith(self.suffixes)):
            return None
        try:
            relative = path.relative_to(self.store.root).as_posix()
        except ValueError:
            return None
        try:
            relative.encode("utf-8")
            key = keys.safe_key(relative)
        except (UnicodeEncodeError, keys.InvalidKey) as error:
            if relative.startswith(self.prefix) and file is not None:
                self._quarantine(path, relative, error)
            return None
        return key if key.startswith(self.prefix) else None

    def _quarantine(self, path: Path, relative: str, error: Exception) -> None:
        """Move a file whose name is no valid key to ``quarantine/landing/`` (its name percent-encoded) beside
        a ``.reason.json``; logged once. A crash in between leaves it where it was, to be moved by the next look."""
        reason = "the name is not UTF-8" if isinstance(error, UnicodeEncodeError) else str(error)
        target_key = LANDING_QUARANTINE_PREFIX + quote(os.fsencode(relative), safe="/")
        try:
            target = self.store.path(keys.safe_key(target_key))
            target.parent.mkdir(parents=True, exist_ok=True)
            self.store.put_bytes(
                keys.quarantine_reason_key(target_key),
                json.dumps(
                    {
                        "name": os.fsencode(relative).decode("utf-8", "backslashreplace"),
                        "reason": reason,
                        "quarantined_at": datetime.now(UTC).isoformat(),
                    }
                ).encode(),
            )
            os.replace(path, target)
        except (OSError, ValueError) as failure:
            if str(path) not in self._refused:
                self._refused.add(str(path))
                LOG.error("could not quarantine %r (%s): %s; it stays, ignored", path, reason, failure)
            return
        LOG.warning("quarantined %r as %s: %s", path, target_key, reason)

    def _listing(self, folder: Path | None = None, since: float = 0.0) -> Iterator[tuple[str, os.stat_result]]:
        """Every regular file under the prefix (or ``folder``) changed since ``since`` (0: all), with its stat."""
        for path, stat in changed_files(folder or self.folder, since, lambda path: not ignored_name(path.name)):
            key = self._key_of(path)
            if key is not None:
                yield key, stat

    def _rescan(self) -> None:
        """The catch-up listing from the watermark: note every file changed since and not acked in its version;
        the listing's start becomes the next watermark once all it found are acked."""
        started = time.time() - WATERMARK_SLACK_S
        outstanding = set()
        for key, stat in self._listing(since=self._watermark):
            self._note(key, stat)
            if self._acked.get(key) != self._event_id(key, stat.st_size, stat.st_mtime_ns):
                outstanding.add(key)
        self._scans.append((started, outstanding))
        self._advance_watermark()

    def _settled(self, key: str) -> None:
        """``key`` needs nothing more (acked, gone): the listings waiting on it may move the watermark on."""
        for _, outstanding in self._scans:
            outstanding.discard(key)

    def _advance_watermark(self) -> None:
        """Move the watermark to the latest listing whose files (and every earlier listing's) are all acked."""
        advanced = None
        while self._scans and not self._scans[0][1]:
            advanced = self._scans.pop(0)[0]
        if advanced is None or advanced <= self._watermark:
            return
        self._watermark = advanced
        try:
            write_watermark(self.folder, advanced)
        except OSError as error:  # the next advance writes it; until then a restart lists a little more
            LOG.warning("could not write the watermark in %s: %s", self.folder, error)
        for key in [k for k, ctime in self._acked_ctime.items() if ctime < advanced]:  # never listed again
            self._acked.pop(key, None)
            self._acked_ctime.pop(key, None)

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
            self._looks[key] = _Look(
                stat.st_size, stat.st_mtime_ns, time.monotonic(), written or bool(look and look.modified)
            )
        elif written:
            look.modified = True

    def _complete(self, key: str, look: _Look, now: float) -> bool:
        """Open for writing nowhere, and renamed in (never written to since it appeared) or stable long enough."""
        stable = now - look.since >= self.settle_seconds or time.time_ns() - look.mtime_ns >= self.settle_seconds * 1e9
        if not stable and (look.modified or look.size == 0):
            return False
        writing = open_for_writing(self.store.path(key))
        return writing is False or (stable and writing is None)  # None: the kernel cannot say; stable must do

    def _ready(self, max_items: int) -> list[Arrival]:
        """Look at reported and waiting files; the complete ones not in flight, as arrivals (at most ``max_items``)."""
        with self._changed:
            dirty, self._dirty = self._dirty, {}
        for key, written in dirty.items():
            stat = self._stat(key)
            if stat is None:
                self._looks.pop(key, None)
                self._settled(key)
                continue
            if S_ISDIR(stat.st_mode):  # a new folder: files may have landed in it before the watch covered it
                for inner, inner_stat in self._listing(self.store.path(key)):
                    self._note(inner, inner_stat)
            elif S_ISREG(stat.st_mode) and self._key_of(self.store.path(key)) is not None:
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
                    self._settled(key)
                continue
            del self._looks[key]
            event_id = self._event_id(key, look.size, look.mtime_ns)
            self._offered[key] = event_id
            self._offered_ctime[key] = stat.st_ctime
            self._receives[event_id] = self._receives.get(event_id, 0) + 1
            ready.append(
                Arrival(
                    url=self.store.url_for(key),
                    key=key,
                    size=look.size,
                    event_time=datetime.fromtimestamp(look.mtime_ns / 1e9, UTC).isoformat(),
                    event_id=event_id,
                    receive_count=self._receives[event_id],
                )
            )
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
            ctime = self._offered_ctime.pop(arrival.key, time.time())
            if self._offered.get(arrival.key) == arrival.event_id:
                del self._offered[arrival.key]
            self._acked[arrival.key] = arrival.event_id
            self._acked_ctime[arrival.key] = ctime
            self._not_before.pop(arrival.key, None)
            self._receives.pop(arrival.event_id, None)
            self._settled(arrival.key)
        self._advance_watermark()

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
