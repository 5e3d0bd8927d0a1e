"""The local event source: a file-system watch (inotify, every name kept as bytes: ``tasks/landing/inotify.py``)
on a ``file://`` store's prefix, plus a
catch-up listing at start and every ``rescan_seconds``, so files that landed while nothing watched are found.

    watch thread (inotify) ─┐
    catch-up listing ───────┴─> keys to look at ──> complete? ──> receive() ──> Arrival ──> ack() / release()

A file still being written is never offered:
- names ending ``.tmp`` / ``.part`` or starting with ``.`` are ignored (the object store's own atomic writes
  go through ``.{name}.{random}.part`` and a rename);
- a file renamed in (moved into place once written) is taken as soon as it is seen: the watch reported it
  appear and never change, and no process has it open for writing (a read lease would be refused);
- a file written in place is taken once its size and mtime have been stable for ``settle_seconds`` and no
  process holds it open for writing (a writer that pauses longer than that is waited for until it closes);
- a file the kernel cannot check (another user's: only a file's owner, or root, may take a lease) is taken only
  once unchanged for ``unchecked_settle_seconds`` (60 s), logged once per file: a writer of another user that
  pauses longer than that would still let part of a file through (docs/design.md, "The catch-up watermark").

What can never be an arrival is moved to ``quarantine/landing/`` as it is, under a name that always fits (its
readable part and a hash of its bytes: ``quarantine_key``; ``~2``, ``~3`` … after it when that name is taken),
beside a ``.reason.json`` with the original name's bytes, and logged: a file whose name is not a valid key (not
UTF-8, a control character, a backslash), a symbolic link (the link itself, never followed: it may point anywhere),
a device, pipe or socket, and a folder whose name is not UTF-8 with all in it. The watch reports such names like
any other (a watch that stops anyway is started again less and less often, logged once): its neighbours go on.
Suffix filters (``suffixes``) apply to files only: a folder created or moved in is listed at once.

An arrival's ``event_id`` is its key, size, mtime (ns), inode and ctime (ns): a replacement that keeps the old size
and mtime (``cp -p``, rsync, tar) still has a new ctime, so it is a new arrival. What has been offered and not
acked or released is not offered again. After a restart, the catch-up listing starts from the watermark
(``WATERMARK_NAME``, a hidden file in the watched folder): every file that existed when it was taken had been
acked, so only files changed since (ctime, on the file system's own clock) and every file of a folder it does not
know at its path (made, moved in or renamed since) are offered; the backlog health check counts by the same
listing. See docs/design.md, "The catch-up watermark".
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from stat import S_ISDIR, S_ISLNK, S_ISREG

from tasks.core import keys
from tasks.core.object_store import LocalStore, ObjectStore
from tasks.landing.inotify import Change, TreeWatch
from tasks.landing.sources import Arrival

LOG = logging.getLogger(__name__)
IGNORED_SUFFIXES = (".tmp", ".part")
TICK_SECONDS = 0.05  # how often receive() looks again at files waiting to settle
MAX_RELEASE_DELAY = 60.0  # a released arrival is offered again after 1, 2, 4 … seconds, at most this
WATCH_RESTART_S = 0.2  # a file watch that stopped on an error is started again after this
WATCH_RESTART_MAX_S = 30.0  # … doubled each time it stops again at once, at most this
WATCH_READ_S = 0.5  # the watch thread looks at its stop event at least this often
# a file whose writer cannot be checked (another user's: the kernel refuses a lease) is taken only once unchanged
# this long: a writer that pauses longer would still let part of a file through
UNCHECKED_SETTLE_S = 60.0
WATERMARK_NAME = ".landing-watermark"  # in the watched folder: a hidden name, never an arrival
CLOCK_NAME = ".landing-clock"  # in the watched folder: touched to read the file system's clock
# the watermark is taken this long before a listing starts: a timestamp the kernel gave a change an instant
# before the listing (its clock ticks coarser than time.time) still counts as after it
WATERMARK_SLACK_S = 2.0
LANDING_QUARANTINE_PREFIX = "quarantine/landing/"
READABLE_NAME_CHARS = 48  # a quarantined name keeps at most this much of the original, sanitised, before its hash


@dataclass
class _Look:
    """What was last seen of one file: its version, since when, and whether the watch saw it change."""

    size: int
    mtime_ns: int
    version: Version  # what tells this version from another (``version_of``)
    since: float  # monotonic time this version was first seen
    modified: bool = False  # the watch reported a write to it (written in place, not renamed in)
    aged: float = 0.0  # seconds it had been unchanged when first seen (the fs clock; 0 when the watch saw it)
    unchecked: bool = False  # the kernel could not say whether it is open for writing (another user's file)


Version = tuple[int, int, int, int]


def version_of(stat: os.stat_result) -> Version:
    """What tells one version of a file from another: its size and mtime, and its inode and ctime, which nobody can
    carry over to a replacement (``cp -p``, rsync and tar give it the old size and mtime; its ctime is the kernel's
    clock when it was written, and a new file has a new inode)."""
    return stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns


def ignored_name(name: str) -> bool:
    """A temporary or hidden file name: an unfinished write, never an arrival."""
    return name.startswith(".") or name.endswith(IGNORED_SUFFIXES)


def open_for_writing(path: Path) -> bool | None:
    """Whether any process has ``path`` open for writing (Linux read lease); None when the kernel cannot say (a
    file another user owns: only its owner, or root, may take a lease). A path that is gone or no longer a file
    (its folder renamed, a link put there) is open nowhere: the caller's stat finds what lies there now."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as error:
        return None if error.errno in (errno.EACCES, errno.EPERM) else False
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False
    except OSError as error:
        return True if error.errno in (errno.EAGAIN, errno.EBUSY) else None
    finally:
        os.close(fd)


def fs_now(folder: Path, wall_clock: Callable[[], float] = time.time) -> float:
    """The file system's own clock: the ctime it gives ``CLOCK_NAME`` in ``folder`` touched now (``wall_clock``
    only where the folder cannot be written, e.g. a health check running as another user)."""
    path = folder / CLOCK_NAME
    try:
        path.touch()
        return os.stat(path).st_ctime
    except OSError:
        return wall_clock()


def _boot() -> tuple[str, float]:
    """This boot's id and the seconds since it (CLOCK_BOOTTIME: never stepped, counts suspend)."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = ""
    return boot_id, time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Watermark:
    """Where a catch-up listing starts: every file changed before ``at`` (the fs clock) in a folder of ``folders``
    was acked."""

    at: float = 0.0  # the file system's clock at the start of that listing, less WATERMARK_SLACK_S
    # folder path (under the watched one) -> inode, as listed; None: a watermark written before folders were kept
    folders: dict[str, int] | None = field(default_factory=dict)
    boot_id: str = ""  # the boot it was taken in, and CLOCK_BOOTTIME then: how far the clock stepped since
    boot_s: float = 0.0

    def since(self, now: float) -> float:
        """Where a listing starts when the fs clock says ``now``: ``at``, or earlier by as much as the clock was
        stepped back since (CLOCK_BOOTTIME tells how long ago ``at`` was). After a reboot, a clock behind ``at``
        was stepped back by an amount nobody knows: from the start of this boot on today's clock as well (never
        from the beginning of time, which would offer again files whose tracking expired long ago)."""
        if self.at <= 0:
            return 0.0
        boot_id, boot_s = _boot()
        if self.boot_id and boot_id == self.boot_id:
            return min(self.at, now - WATERMARK_SLACK_S - (boot_s - self.boot_s))
        return self.at if now >= self.at else min(self.at, now - boot_s) - WATERMARK_SLACK_S


def read_watermark(folder: Path) -> Watermark:
    """The catch-up watermark kept in ``folder``; none (list everything) when absent or unreadable."""
    try:
        body = json.loads((folder / WATERMARK_NAME).read_text())
        folders = body.get("folders")
        return Watermark(
            float(body["watermark"]),
            None if folders is None else {str(k): int(v) for k, v in folders.items()},
            str(body.get("boot_id", "")),
            float(body.get("boot_s", 0.0)),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return Watermark()


def write_watermark(folder: Path, mark: Watermark) -> None:
    """Keep ``mark`` in ``folder``: written beside, then renamed over the old one (never half a file); a write that
    fails (a full disk) removes what it wrote beside."""
    body = json.dumps(
        {
            "watermark": mark.at,
            "at": datetime.fromtimestamp(mark.at, UTC).isoformat(),
            "boot_id": mark.boot_id,
            "boot_s": mark.boot_s,
            "folders": mark.folders,
        }
    )
    temporary = folder / f"{WATERMARK_NAME}.{os.getpid()}.part"
    try:
        temporary.write_text(body)
        os.replace(temporary, folder / WATERMARK_NAME)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def _not_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _refusal(path: Path, stat: os.stat_result) -> str | None:
    """Why what lies at ``path`` can never be an arrival (quarantined as it is), or None for a regular file or a
    folder with a name the watch can read."""
    if S_ISLNK(stat.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"a symbolic link (to {target!r}): never followed, it may point anywhere"
    if S_ISDIR(stat.st_mode):
        return "the name is not UTF-8" if _not_utf8(path.name) else None  # the watch cannot even report it
    return None if S_ISREG(stat.st_mode) else "not a regular file (a device, pipe or socket)"


def _new_folder(mark: Watermark, relative: str, stat: os.stat_result, since: float) -> bool:
    """Whether the folder at ``relative`` came since ``mark`` (made, moved in, renamed): not in its folder map at
    that path. A watermark without a map (an older listener's) knows only a folder renamed in untouched since."""
    if mark.folders is None:
        return stat.st_ctime >= since and stat.st_mtime < since
    return mark.folders.get(relative) != stat.st_ino


def quarantine_name(name: bytes) -> str:
    """A valid, short file name for ``name`` whatever its bytes: its letters, digits, ``.``, ``_`` and ``-`` (others
    as ``_``, no leading dot, at most READABLE_NAME_CHARS) and 16 hex digits of its SHA-256."""
    readable = re.sub(rb"[^A-Za-z0-9._-]+", b"_", name).lstrip(b".")[:READABLE_NAME_CHARS].decode("ascii")
    return f"{readable}-{hashlib.sha256(name).hexdigest()[:16]}"


def _plain_segment(segment: bytes) -> bool:
    """Whether ``segment`` can stay as it is in a key (UTF-8, no control character or backslash)."""
    try:
        keys.safe_key(segment.decode("utf-8"))
    except (UnicodeDecodeError, keys.InvalidKey):
        return False
    return True


def quarantine_key(relative: bytes) -> str:
    """Where what lies at ``relative`` (bytes, under the store's root) is quarantined: under
    ``quarantine/landing/`` at the same folders (any whose name is no key by ``quarantine_name``), itself by
    ``quarantine_name``, so the name fits the file system's 255-byte limit whatever the original."""
    *folders, name = relative.split(b"/")
    kept = [folder.decode() if _plain_segment(folder) else quarantine_name(folder) for folder in folders]
    return LANDING_QUARANTINE_PREFIX + "/".join([*kept, quarantine_name(name)])


@dataclass(frozen=True)
class Listed:
    """A file a catch-up listing found, or something it found that must be quarantined (``refused``: why)."""

    path: Path
    stat: os.stat_result
    landed: float  # when it came or changed under the folder, on the fs clock (at the earliest)
    refused: str | None = None


def changed_files(
    folder: Path,
    mark: Watermark,
    now: float,
    take: Callable[[Path], bool] = lambda path: True,
    seen: dict[str, int] | None = None,
) -> Iterator[Listed]:
    """Everything under ``folder`` that changed or came in since ``mark`` (``now``: the fs clock): each regular
    file ``take`` accepts whose ctime is at or after the listing's start, every file under a folder ``mark`` does
    not know at its path (made, moved in or renamed since), and every symbolic link, special file or folder whose
    name is not UTF-8 (refused, never followed). Every folder is read and every file stat'ed: a file rewritten in
    place changes only its own ctime. ``seen`` gets every folder listed (path -> inode), the next watermark's map."""
    since = mark.since(now)
    stack: list[tuple[Path, str, bool]] = [(folder, "", since <= 0)]
    while stack:
        current, relative, new = stack.pop()
        try:
            entries = list(os.scandir(current))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            changed = new or stat.st_ctime >= since
            if S_ISREG(stat.st_mode):  # the common case first: one stat, no more, for a file that did not change
                if changed and take(path := Path(entry.path)):
                    yield Listed(path, stat, max(stat.st_ctime, since))
                continue
            path, inner = Path(entry.path), f"{relative}{entry.name}"
            refused = _refusal(path, stat)
            if refused is None:  # a folder
                if seen is not None:
                    seen[inner] = stat.st_ino
                stack.append((path, inner + "/", new or _new_folder(mark, inner, stat, since)))
            elif S_ISDIR(stat.st_mode) or (changed and not ignored_name(entry.name)):
                yield Listed(path, stat, max(stat.st_ctime, since), refused)  # a bad folder name: however old


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
        unchecked_settle_seconds: float = UNCHECKED_SETTLE_S,
        wall_clock: Callable[[], float] = time.time,
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
        self.unchecked_settle_seconds = unchecked_settle_seconds
        self._wall_clock = wall_clock  # for what people read (quarantine times); never compared with the fs's
        self._changed = threading.Condition()
        self._dirty: dict[str, bool] = {}  # keys the watch reported: key -> whether it saw a write
        self._looks: dict[str, _Look] = {}  # files seen and not offered yet
        self._offered: dict[str, str] = {}  # key -> event id offered and not acked or released
        self._offered_ctime: dict[str, float] = {}  # key -> ctime of the version offered, or the last listing's start
        self._acked: dict[str, str] = {}  # key -> event id acked (a rescan does not offer it again)
        self._acked_ctime: dict[str, float] = {}  # key -> its ctime when acked (forgotten once under the watermark)
        self._not_before: dict[str, float] = {}  # released keys: not offered again before this monotonic time
        self._receives: dict[str, int] = {}  # event id -> times offered
        self._refused: set[str] = set()  # names already logged as refused (logged once)
        self._odd: set[Path] = set()  # paths the watch reported whose name is no key: receive() looks at them
        self._unchecked: set[str] = set()  # keys logged as "cannot tell whether it is being written" (logged once)
        self._watermark = read_watermark(self.folder)  # files changed before it were all acked
        self._listed_from = 0.0  # the latest listing's start (fs clock): what is offered now is not listed before it
        self._scans: list[tuple[Watermark, set[str]]] = []  # (a listing's mark, its keys not acked yet): oldest first
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
        """Feed the keys inotify reports into ``_dirty`` (and names that are no key into ``_odd``) until closed; a
        watch that fails (the folder gone, no inotify left) is started again, and a listing then finds what it
        missed."""
        restarted, pause, told = False, WATCH_RESTART_S, set()
        while not self._stop.is_set():
            tree = None
            try:
                tree = TreeWatch(os.fsencode(self.folder))
                self._watching.set()
                if restarted:  # watching again: list what landed while nothing watched
                    with self._changed:
                        restarted, self._next_rescan = False, 0.0
                        self._changed.notify_all()
                while not self._stop.is_set():
                    changes, overflowed = tree.read(WATCH_READ_S)
                    pause = WATCH_RESTART_S
                    if changes or overflowed:
                        self._report(changes, overflowed)
            except Exception as error:  # noqa: BLE001 - watch again; the listing covers the gap
                # the same failure again is logged once and retried ever less often, never a warning every restart
                said = f"{type(error).__name__}: {error}"
                (LOG.debug if said in told else LOG.warning)(
                    "the file watch on %s stopped (%s); watching again and listing what it missed", self.folder, said
                )
                told.add(said)
                with self._changed:  # the listing runs now, not at the next rescan
                    self._next_rescan, restarted = 0.0, True
                    self._changed.notify_all()
                self._stop.wait(pause)
                pause = min(WATCH_RESTART_MAX_S, pause * 2)
            finally:
                if tree is not None:
                    tree.close()
                self._watching.set()

    def _report(self, changes: list[Change], overflowed: bool) -> None:
        """Hand what the watch saw to ``receive()``; an overflowed queue (changes lost) makes it list now."""
        with self._changed:
            for change in changes:
                key = self._key_of(Path(os.fsdecode(change.path)), file=None)
                if key is not None:
                    self._dirty[key] = self._dirty.get(key, False) or change.written
            if overflowed:
                self._next_rescan = 0.0
            self._changed.notify_all()

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
            if relative.startswith(self.prefix) and file is None:  # the watch: receive() looks at what it is
                self._odd.add(path)
            elif relative.startswith(self.prefix):
                self._quarantine(path, "the name is not UTF-8" if isinstance(error, UnicodeEncodeError) else str(error))
            return None
        return key if key.startswith(self.prefix) else None

    def _quarantine(self, path: Path, reason: str) -> None:
        """Move what lies at ``path`` (a file whose name is no valid key, a symbolic link itself, a folder whose
        name is not UTF-8 with all in it) to ``quarantine/landing/`` under a name that is always a valid one
        (``quarantine_key``), a ``~2``, ``~3`` … after it when that name is taken, beside a ``.reason.json`` with the
        original name; a failure is logged once. A crash in between leaves it where it was, to be moved by the next
        look (its reason file rewritten)."""
        relative = os.fsencode(path).removeprefix(os.fsencode(self.store.root) + b"/")
        first_key = quarantine_key(relative)
        target_key, copies = first_key, 1
        try:
            while os.path.lexists(self.store.path(target_key)):  # one listener per place: nobody takes it meanwhile
                copies += 1
                target_key = f"{first_key}~{copies}"
            target = self.store.path(keys.safe_key(target_key))
            target.parent.mkdir(parents=True, exist_ok=True)
            self.store.put_bytes(
                keys.quarantine_reason_key(target_key),
                json.dumps(
                    {
                        "name": relative.decode("utf-8", "backslashreplace"),
                        "name_hex": relative.hex(),  # the name's bytes exactly (a backslash in it reads the same)
                        "reason": reason,
                        "quarantined_at": datetime.fromtimestamp(self._wall_clock(), UTC).isoformat(),
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

    def _listing(
        self, folder: Path | None = None, mark: Watermark = Watermark(), now: float = 0.0, seen: dict | None = None
    ) -> Iterator[tuple[str, os.stat_result]]:
        """Every regular file under the prefix (or ``folder``) changed since ``mark`` (none: all), with its stat;
        what can never be an arrival (a link, a name that is no key) is quarantined on the way."""
        for listed in changed_files(folder or self.folder, mark, now, lambda path: not ignored_name(path.name), seen):
            if listed.refused is not None:
                self._quarantine(listed.path, listed.refused)
            elif (key := self._key_of(listed.path)) is not None:
                yield key, listed.stat

    def _rescan(self) -> None:
        """The catch-up listing from the watermark: note every file changed or come in since and not acked in its
        version; the listing's start (the fs clock) and folders become the next watermark once all it found are
        acked."""
        now = fs_now(self.folder, self._wall_clock)
        boot_id, boot_s = _boot()
        seen: dict[str, int] = {}
        outstanding = set()
        for key, stat in self._listing(mark=self._watermark, now=now, seen=seen):
            self._note(key, stat, aged=now - stat.st_mtime)
            if self._acked.get(key) != self._event_id(key, version_of(stat)):
                outstanding.add(key)
        mark = Watermark(now - WATERMARK_SLACK_S, seen, boot_id, boot_s)
        self._listed_from = mark.at
        self._scans.append((mark, outstanding))
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
        if advanced is None:  # (a later listing is newer even where the clock stepped back between)
            return
        self._watermark = advanced
        try:
            write_watermark(self.folder, advanced)
        except OSError as error:  # the next advance writes it; until then a restart lists a little more
            LOG.warning("could not write the watermark in %s: %s", self.folder, error)
        for key in [k for k, ctime in self._acked_ctime.items() if ctime < advanced.at]:  # never listed again
            self._acked.pop(key, None)
            self._acked_ctime.pop(key, None)

    # ------------------------------------------------------------------ deciding what is complete

    @staticmethod
    def _event_id(key: str, version: Version) -> str:
        """``{key}:{size}:{mtime ns}:{inode}:{ctime ns}``: one landing of one version."""
        return ":".join([key, *map(str, version)])

    def _note(self, key: str, stat: os.stat_result, written: bool = False, aged: float = 0.0) -> None:
        """Record a look at ``key`` (unless that version was acked); a new version restarts its settle time.
        ``aged``: how long the version had been unchanged when first seen, on the fs clock (a listing's files)."""
        version = version_of(stat)
        if self._acked.get(key) == self._event_id(key, version):
            return
        look = self._looks.get(key)
        if look is None or look.version != version:
            modified = written or bool(look and look.modified)
            self._looks[key] = _Look(
                stat.st_size, stat.st_mtime_ns, version, time.monotonic(), modified, max(0.0, aged)
            )
        elif written:
            look.modified = True

    def _complete(self, key: str, look: _Look, now: float) -> bool:
        """Open for writing nowhere, and renamed in (never written to since it appeared) or stable long enough;
        where the kernel cannot say whether it is open (another user's file), unchanged for the longer
        ``unchecked_settle_seconds``."""
        unchanged = now - look.since + look.aged
        if look.unchecked:
            return unchanged >= self.unchecked_settle_seconds
        if unchanged < self.settle_seconds and (look.modified or look.size == 0):
            return False
        writing = open_for_writing(self._path(key))
        if writing is None:  # a writer we cannot see may pause longer than settle_seconds: wait much longer
            look.unchecked = True
            if key not in self._unchecked:
                self._unchecked.add(key)
                LOG.warning(
                    "cannot tell whether %s is still being written (%s): it is taken once unchanged for %.0f s",
                    key,
                    self._owner(key),
                    self.unchecked_settle_seconds,
                )
            return unchanged >= self.unchecked_settle_seconds
        return writing is False

    def _owner(self, key: str) -> str:
        """Who owns ``key``'s file, in words (why the kernel refuses this process a lease on it)."""
        stat = self._stat(key)
        if stat is None:
            return "it is gone"
        return f"owner uid {stat.st_uid}, this listener runs as uid {os.geteuid()}: only the owner may take a lease"

    def _ready(self, max_items: int) -> list[Arrival]:
        """Look at reported and waiting files; the complete ones not in flight, as arrivals (at most ``max_items``)."""
        with self._changed:
            dirty, self._dirty = self._dirty, {}
            odd, self._odd = self._odd, set()
        for path in odd:
            self._refuse(path)
        for key, written in dirty.items():
            stat = self._stat(key)
            if stat is None:  # gone; a folder moved away is reported alone: what was under it went with it
                for gone in [key, *(k for k in self._looks if k.startswith(f"{key}/"))]:
                    self._looks.pop(gone, None)
                    self._settled(gone)
                continue
            path = self._path(key)
            if S_ISDIR(stat.st_mode):  # a new folder: files may have landed in it before the watch covered it
                for inner, inner_stat in self._listing(path):
                    self._note(inner, inner_stat)
            elif S_ISREG(stat.st_mode):
                if self._key_of(path) is not None:
                    self._note(key, stat, written)
            elif (refused := _refusal(path, stat)) is not None:  # a symbolic link, a pipe: never followed
                self._looks.pop(key, None)
                self._settled(key)
                self._quarantine(path, refused)
        now = time.monotonic()
        ready: list[Arrival] = []
        for key, look in list(self._looks.items()):
            if len(ready) >= max_items:
                break
            if self._acked.get(key) == self._event_id(key, look.version):
                del self._looks[key]  # noted by a listing before its ack came
                continue
            if key in self._offered or self._not_before.get(key, 0.0) > now or not self._complete(key, look, now):
                continue
            stat = self._stat(key)
            if stat is None or version_of(stat) != look.version:
                if stat is not None and S_ISREG(stat.st_mode):
                    self._note(key, stat)
                else:  # gone, or replaced by a link or a folder: the watch's report (or a listing) says which
                    del self._looks[key]
                    self._settled(key)
                    with self._changed:
                        self._dirty.setdefault(key, False)
                continue
            del self._looks[key]
            event_id = self._event_id(key, look.version)
            self._offered[key] = event_id
            self._offered_ctime[key] = max(stat.st_ctime, self._listed_from)
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

    def _refuse(self, path: Path) -> None:
        """Quarantine what the watch reported at ``path`` (a name that is no key) from its first folder whose name
        is not UTF-8 (with all in it); else a file of the watched suffixes, a link or a special file, and the files
        under a folder whose name is no key; gone already, nothing."""
        root = os.fsencode(self.store.root)
        segments = os.fsencode(path).removeprefix(root + b"/").split(b"/")
        for depth, segment in enumerate(segments[:-1]):
            if _not_utf8(os.fsdecode(segment)):  # a folder above it: the folder goes, with all in it
                path = Path(os.fsdecode(b"/".join([root, *segments[: depth + 1]])))
                break
        try:
            stat = os.stat(path, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return
        if S_ISREG(stat.st_mode):
            self._key_of(path)  # quarantines it unless another suffix's (not this listener's to judge)
        elif (refused := _refusal(path, stat)) is not None:
            self._quarantine(path, refused)
        elif S_ISDIR(stat.st_mode):  # a UTF-8 name that is no key: its files are quarantined one by one
            for _ in self._listing(path):
                pass

    def _path(self, key: str) -> Path:
        """The path of ``key`` itself, a link there not followed (the store's ``path`` resolves links)."""
        return self.store.root / key

    def _stat(self, key: str) -> os.stat_result | None:
        """``key``'s own stat (a link's, not its target's); None when gone or a folder on its way is a link."""
        path = self._path(key)
        try:
            if self.store.path(key.rsplit("/", 1)[0]) != path.parent:  # reached through a linked folder
                return None
            return os.stat(path, follow_symlinks=False)
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
            ctime = self._offered_ctime.pop(arrival.key, self._listed_from)
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
