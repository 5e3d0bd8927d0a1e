"""Object storage behind one interface: ``file://`` folders locally, ``s3://`` buckets in AWS.

Keys are validated (``tasks.core.keys.safe_key``) so nothing is written outside the store's root. Local writes
are atomic and durable (temp file, fsync, rename), like an S3 PUT: a reader never sees half an object, and a full
disk removes the temp file and raises ``DiskFull`` (``tasks.core.disk``). S3 goes through boto3,
which reaches a local S3 endpoint through its own ``AWS_ENDPOINT_URL_S3``.

Large objects are streamed, never held whole in memory: files and streams go up to S3 in multipart uploads
(parts of ``OBJECT_STORE_MULTIPART_MB``, default 8 MiB) and come down in ranged parts straight to disk;
copies above the threshold are multipart server-side copies. A multipart upload is invisible until its last
part completes it, so a writer killed mid-upload leaves no half object (only parts that
``abort_incomplete_uploads`` or the bucket's AbortIncompleteMultipartUpload lifecycle rule removes). Locally a
killed writer leaves a hidden ``.part`` file, which ``list`` skips and ``abort_incomplete_uploads`` removes;
``delete_prefix`` removes both kinds of leftover under its prefix. Other hidden files and folders in a local
store are the folder's own bookkeeping (a landing listener's watermark, scratch space), never objects: ``list``
leaves them out.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, unquote, urlparse

import boto3

from tasks.core import disk, faults
from tasks.core.errors import PipelineError
from tasks.core.keys import InvalidKey, safe_key
from tasks.core.runtime import utc_now
from tasks.core.settings import ObjectStoreTuning
from tasks.core.state_store import BOTO_CONFIG

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LOCAL_ROOT = REPO_ROOT / ".data" / "objects"
log = logging.getLogger(__name__)
MIN_PART_MB = 5  # S3 refuses smaller parts (except the last)
STREAM_CHUNK = 1 << 20  # bytes per read when copying a stream


def multipart_bytes() -> int:
    """Multipart threshold and part size in bytes (``OBJECT_STORE_MULTIPART_MB``, at least S3's 5 MiB)."""
    megabytes = ObjectStoreTuning.read().multipart_mb
    return int(max(megabytes, MIN_PART_MB) * 1024 * 1024)


def _write_point(method: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a store method as a write: a crash point for the fault injector (``faults``, tests only)."""

    @functools.wraps(method)
    def write(self, key: str, *args: Any, **kwargs: Any) -> Any:
        """The write, as a crash point when the fault injector is armed."""
        if not faults.armed:
            return method(self, key, *args, **kwargs)
        number = faults.before("objects", method.__name__, key)
        result = method(self, key, *args, **kwargs)
        faults.after(number, method.__name__, key)
        return result

    return write


class ObjectNotFound(PipelineError, FileNotFoundError):
    """No object at that key."""


@dataclass(frozen=True)
class ListedObject:
    """One object as a listing reports it: its key in the store, size, URL and last change (ISO 8601, UTC)."""

    key: str
    size: int
    url: str
    last_modified: str


def _iso_utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


class ObjectStore:
    """Objects under one root URL; subclasses implement local folders and S3."""

    url: str

    @staticmethod
    def from_url(url: str | None, session: boto3.Session | None = None) -> ObjectStore:
        """``file:///path`` or a bare path -> LocalStore; ``s3://bucket/prefix`` -> S3Store; empty -> default folder."""
        if not url:
            return LocalStore(DEFAULT_LOCAL_ROOT)
        scheme, bucket, path = split_url(url)
        if scheme == "s3":
            return S3Store(bucket, path, session=session)
        if scheme in ("file", ""):
            return LocalStore(Path(path))
        raise ValueError(f"unsupported object store URL {url!r}: use file:// or s3://")

    def url_for(self, key: str) -> str:
        """The full URL of ``key`` in this store."""
        return f"{self.url.rstrip('/')}/{safe_key(key)}"

    def disk_folder(self) -> Path:
        """The local folder whose disk this store's writes fill: the temporary folder its local copies and a
        pipeline's scratch files use (a local store overrides it with its root)."""
        return Path(tempfile.gettempdir())

    # the interface
    def put_bytes(self, key: str, data: bytes) -> str:
        """Store ``data`` at ``key`` (replacing any object there); returns its URL."""

    def put_file(self, key: str, path: str | Path) -> str:
        """Store the file at ``path`` under ``key``; returns its URL."""

    def get_bytes(self, key: str) -> bytes:
        """Bytes of the object at ``key``; ObjectNotFound if absent."""

    def download(self, key: str, path: str | Path) -> Path:
        """Copy the object at ``key`` to the local ``path``; ObjectNotFound if absent."""

    def put_stream(self, key: str, stream: IO[bytes]) -> str:
        """Store what a binary stream yields under ``key``, read piece by piece; returns its URL."""

    def open(self, key: str) -> IO[bytes]:
        """A binary stream of the object at ``key`` (close it after use); ObjectNotFound if absent."""

    def exists(self, key: str) -> bool:
        """Whether an object exists at ``key``."""

    def size(self, key: str) -> int:
        """Size in bytes of the object at ``key``; ObjectNotFound if absent."""

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys of every object whose key starts with ``prefix``."""

    def list_objects(self, prefix: str = "") -> list[ListedObject]:
        """Every object under ``prefix`` with its size, from the listing itself (no request per object)."""

    def delete(self, key: str) -> bool:
        """Delete the object at ``key``; True if there was one."""

    def copy(self, src: str, dst: str) -> str:
        """Copy ``src`` to ``dst``; returns the new URL, ObjectNotFound if ``src`` is absent."""

    def presign_put(self, key: str, expires: int = 3600) -> str:
        """Where a client can upload ``key`` directly: a presigned URL, or a local path."""

    def arrow_filesystem(self):
        """A pyarrow filesystem that reaches this store."""

    def arrow_path(self, key: str) -> str:
        """The path of ``key`` in ``arrow_filesystem()``."""

    def abort_incomplete_uploads(self, older_than_s: float = 24 * 3600, prefix: str = "") -> int:
        """Remove writes under ``prefix`` left unfinished for longer than ``older_than_s`` (their writer died)."""
        raise NotImplementedError

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``, and every unfinished write there; returns how many objects."""
        safe_key(prefix)
        count = 0
        for key in list(self.list(prefix)):
            count += self.delete(key)
        self.abort_incomplete_uploads(older_than_s=0, prefix=prefix)
        return count

    def move(self, src: str, dst: str) -> str:
        """Copy then delete: the object is never absent from both places."""
        url = self.copy(src, dst)
        self.delete(src)
        return url

    @contextlib.contextmanager
    def local_copy(self, key: str, suffix: str = "") -> Iterator[Path]:
        """A local file with the object's bytes, for tools that need a path (ffmpeg); removed afterwards."""
        with tempfile.TemporaryDirectory(prefix="objstore-") as tmp:
            path = Path(tmp) / (Path(key).name or "object")
            if suffix and not path.name.endswith(suffix):
                path = path.with_name(path.name + suffix)
            self.download(key, path)
            yield path


class LocalStore(ObjectStore):
    """A folder addressed by ``file://`` URLs."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.url = self.root.as_uri()

    def url_for(self, key: str) -> str:
        """The ``file://`` URL of ``key``, percent-encoded as a file URL is (a name with ``#``, ``?`` or ``%``)."""
        return f"{self.url.rstrip('/')}/{quote(safe_key(key), safe='/')}"

    def disk_folder(self) -> Path:
        """The store's root: its objects fill the disk under it."""
        return self.root

    def path(self, key: str) -> Path:
        """The local file of ``key``; ValueError if it resolves outside the root."""
        path = (self.root / safe_key(key)).resolve()
        if self.root not in path.parents and path != self.root:  # belt and braces against symlinks
            raise ValueError(f"key {key!r} resolves outside {self.root}")
        return path

    def _atomic_write(self, key: str, writer) -> str:
        """Write through ``writer`` to a hidden ``.part`` beside the target, fsync it, then rename it in one step: a
        full disk (``DiskFull``) or any other failure removes the ``.part`` and publishes nothing."""
        target = self.path(key)
        with disk.full_disk_as_unavailable(self.url_for(key)):
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as handle:
                    writer(handle)
                    handle.flush()
                    os.fsync(handle.fileno())  # the bytes are on the disk before the name is
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            disk.sync_folder(target.parent)
        return self.url_for(key)

    @_write_point
    def put_bytes(self, key: str, data: bytes) -> str:
        """Write ``data`` to ``key`` atomically; returns its URL."""
        return self._atomic_write(key, lambda handle: handle.write(data))

    @_write_point
    def put_file(self, key: str, path: str | Path) -> str:
        """Copy the file at ``path`` to ``key`` atomically; returns its URL."""
        return self._copy_file(key, path)

    def _copy_file(self, key: str, path: str | Path) -> str:
        def write(handle):
            """Stream the local file into ``handle``."""
            with open(path, "rb") as source:
                shutil.copyfileobj(source, handle, STREAM_CHUNK)

        return self._atomic_write(key, write)

    @_write_point
    def put_stream(self, key: str, stream: IO[bytes]) -> str:
        """Copy a binary stream to ``key`` atomically, a piece at a time; returns its URL."""
        return self._atomic_write(key, lambda handle: shutil.copyfileobj(stream, handle, STREAM_CHUNK))

    def open(self, key: str) -> IO[bytes]:
        """The file at ``key`` opened for reading; ObjectNotFound if absent."""
        try:
            return open(self.path(key), "rb")
        except FileNotFoundError:
            raise ObjectNotFound(self.url_for(key)) from None

    def get_bytes(self, key: str) -> bytes:
        """Bytes of the file at ``key``; ObjectNotFound if absent."""
        try:
            return self.path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(self.url_for(key)) from None

    def download(self, key: str, path: str | Path) -> Path:
        """Copy the file at ``key`` to ``path``; ObjectNotFound if absent."""
        try:
            shutil.copyfile(self.path(key), path)
        except FileNotFoundError:
            raise ObjectNotFound(self.url_for(key)) from None
        return Path(path)

    def exists(self, key: str) -> bool:
        """Whether a file exists at ``key``."""
        return self.path(key).is_file()

    def size(self, key: str) -> int:
        """Size in bytes of the file at ``key``; ObjectNotFound if absent."""
        try:
            return self.path(key).stat().st_size
        except FileNotFoundError:
            raise ObjectNotFound(self.url_for(key)) from None

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys starting with ``prefix``, skipping unfinished ``.part`` writes."""
        for key, unfinished in self._walk(prefix):
            if not unfinished:
                yield key

    def list_objects(self, prefix: str = "") -> list[ListedObject]:
        """Files under ``prefix`` (no unfinished ``.part`` writes) with their size and mtime; one stat each."""
        found = []
        for key in self.list(prefix):
            try:
                stat = (self.root / key).stat()
            except FileNotFoundError:  # removed since the walk saw it
                continue
            modified = datetime.fromtimestamp(stat.st_mtime, UTC)
            found.append(ListedObject(key, stat.st_size, self.url_for(key), _iso_utc(modified)))
        return found

    def _walk(self, prefix: str) -> Iterator[tuple[str, bool]]:
        """Every file under ``prefix`` as (key, whether it is an unfinished ``.part`` write)."""
        base = self.root / safe_key(prefix) if prefix else self.root
        folder = base if prefix.endswith("/") or not prefix else base.parent
        if not folder.exists():
            return
        # a prefix ending inside a name (a manifest's parts): in the top folder only names starting with it can match,
        # so thousands of other files there cost a string check each, not a path each
        stem = "" if folder == base else base.name
        for dirpath, dirs, files in os.walk(folder):
            stem_here = stem if dirpath == os.fspath(folder) else ""
            dirs[:] = [
                name for name in dirs if not name.startswith(".") and name.startswith(stem_here)
            ]  # scratch folders (a concat's) hold no objects
            for name in sorted(files):
                if stem_here and not name.startswith((stem_here, "." + stem_here)):
                    continue
                key = Path(dirpath, name).relative_to(self.root).as_posix()
                unfinished = name.startswith(".") and name.endswith(".part")
                if name.startswith(".") and not unfinished:
                    continue  # the folder's own bookkeeping (a listener's watermark, a desktop's .DS_Store)
                # a temp file is `.{name}.{random}.part` beside its target: it belongs to the prefix its target does
                written = (
                    Path(dirpath, name[1 : -len(".part")]).relative_to(self.root).as_posix() if unfinished else key
                )
                if written.startswith(prefix):
                    yield key, unfinished

    def abort_incomplete_uploads(self, older_than_s: float = 24 * 3600, prefix: str = "") -> int:
        """Remove ``.part`` files under ``prefix`` older than ``older_than_s`` (left by a killed writer); how many."""
        cutoff = time.time() - older_than_s
        removed = 0
        for key, unfinished in list(self._walk(prefix)):
            if unfinished:
                with contextlib.suppress(FileNotFoundError):
                    if older_than_s <= 0 or (self.root / key).stat().st_mtime <= cutoff:
                        (self.root / key).unlink()
                        removed += 1
        return removed

    @_write_point
    def delete(self, key: str) -> bool:
        """Remove the file at ``key``; True if there was one."""
        try:
            self.path(key).unlink()
            return True
        except FileNotFoundError:
            return False

    @_write_point
    def copy(self, src: str, dst: str) -> str:
        """Copy ``src`` to ``dst`` atomically; returns the new URL, ObjectNotFound if ``src`` is absent."""
        return self._copy_file(dst, self.path(src)) if self.exists(src) else self._missing(src)

    def _missing(self, key: str):
        raise ObjectNotFound(self.url_for(key))

    def presign_put(self, key: str, expires: int = 3600) -> str:
        """Locally the upload target is a path to write to."""
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        return str(target)

    def arrow_filesystem(self):
        """pyarrow's local filesystem."""
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem()

    def arrow_path(self, key: str) -> str:
        """The absolute local path of ``key``."""
        return str(self.path(key))


class S3Store(ObjectStore):
    """A bucket and prefix addressed by ``s3://`` URLs."""

    def __init__(self, bucket: str, prefix: str = "", session: boto3.Session | None = None):
        if not bucket:
            raise ValueError("s3:// URL without a bucket")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self._session = session
        self._client = (session or boto3).client("s3", config=BOTO_CONFIG)
        self._transfer = self.transfer_config()

    @staticmethod
    def transfer_config():
        """boto3's transfer settings: multipart above ``multipart_bytes()``, in parts of that size, with memory
        bounded whatever the load: s3transfer's defaults let a slow disk queue 100 download pieces (25 MiB) and a
        slow network hold 10 parts of a stream going up."""
        from boto3.s3.transfer import TransferConfig

        size = multipart_bytes()
        config = TransferConfig(multipart_threshold=size, multipart_chunksize=size, max_concurrency=4, max_io_queue=16)
        # s3transfer's own settings, which boto3's TransferConfig (its subclass) does not take as arguments
        config.max_in_memory_upload_chunks = config.max_in_memory_download_chunks = 4
        return config

    def service_client(self, service: str):
        """A boto3 client of another AWS service (e.g. ``glue``) with this store's credentials."""
        return (self._session or boto3).client(service)

    def _key(self, key: str) -> str:
        safe_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _full(self, prefix: str) -> str:
        """The bucket-level prefix of a key prefix (the store's own prefix when empty)."""
        return self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")

    def _not_found(self, error) -> bool:
        return error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")

    @contextlib.contextmanager
    def _reading(self, key: str) -> Iterator[None]:
        """ObjectNotFound instead of botocore's 404/NoSuchKey for a read of ``key``."""
        from botocore.exceptions import ClientError

        try:
            yield
        except ClientError as error:
            if self._not_found(error):
                raise ObjectNotFound(self.url_for(key)) from None
            raise

    @_write_point
    def put_bytes(self, key: str, data: bytes) -> str:
        """PUT ``data`` at ``key`` (multipart above the threshold); returns its URL."""
        if len(data) >= self._transfer.multipart_threshold:
            self._client.upload_fileobj(io.BytesIO(data), self.bucket, self._key(key), Config=self._transfer)
        else:
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        return self.url_for(key)

    @_write_point
    def put_file(self, key: str, path: str | Path) -> str:
        """Upload the file at ``path`` to ``key``, streamed (multipart when large); returns its URL."""
        self._client.upload_file(str(path), self.bucket, self._key(key), Config=self._transfer)
        return self.url_for(key)

    @_write_point
    def put_stream(self, key: str, stream: IO[bytes]) -> str:
        """Upload a binary stream to ``key`` part by part (one part in memory per upload thread); returns its URL."""
        self._client.upload_fileobj(stream, self.bucket, self._key(key), Config=self._transfer)
        return self.url_for(key)

    def get_bytes(self, key: str) -> bytes:
        """Bytes of the object at ``key`` (small objects; ``open``/``download`` stream); ObjectNotFound if absent."""
        with self._reading(key):
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

    def open(self, key: str) -> IO[bytes]:
        """The object's body as a stream read from the network as it is consumed; ObjectNotFound if absent."""
        with self._reading(key):
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]

    def download(self, key: str, path: str | Path) -> Path:
        """Download the object at ``key`` to ``path`` in ranged parts written to disk; ObjectNotFound if absent."""
        with self._reading(key):
            self._client.download_file(self.bucket, self._key(key), str(path), Config=self._transfer)
        return Path(path)

    def _head(self, key: str):
        from botocore.exceptions import ClientError

        try:
            return self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as error:
            if self._not_found(error):
                return None
            raise

    def exists(self, key: str) -> bool:
        """Whether a HEAD request finds an object at ``key``."""
        return self._head(key) is not None

    def size(self, key: str) -> int:
        """ContentLength of the object at ``key``; ObjectNotFound if absent."""
        head = self._head(key)
        if head is None:
            raise ObjectNotFound(self.url_for(key))
        return int(head["ContentLength"])

    def _listing(self, prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """(key relative to the store's prefix, ListObjectsV2 entry) for every object under ``prefix``, page by page."""
        strip = len(f"{self.prefix}/") if self.prefix else 0
        for page in self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._full(prefix)
        ):
            for obj in page.get("Contents", []):
                yield obj["Key"][strip:], obj

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys (relative to the store's prefix) of every object under ``prefix``, page by page."""
        for key, _obj in self._listing(prefix):
            yield key

    def list_objects(self, prefix: str = "") -> list[ListedObject]:
        """Objects under ``prefix`` with the size and LastModified that ListObjectsV2 returns (never a HEAD);
        a key that could escape the store (``..``, empty segments) is skipped with a warning."""
        found = []
        for key, obj in self._listing(prefix):
            try:
                url = self.url_for(key)
            except InvalidKey as error:
                log.warning("listing %s: skipped s3://%s/%s (%s)", self.url, self.bucket, obj["Key"], error)
                continue
            found.append(ListedObject(key, int(obj["Size"]), url, _iso_utc(obj["LastModified"])))
        return found

    @_write_point
    def delete(self, key: str) -> bool:
        """Delete the object at ``key``; True if it existed before."""
        existed = self.exists(key)
        self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        return existed

    @_write_point
    def copy(self, src: str, dst: str) -> str:
        """Server-side copy of ``src`` to ``dst``; returns the new URL, ObjectNotFound if ``src`` is absent."""
        if not self.exists(src):
            raise ObjectNotFound(self.url_for(src))
        source = {"Bucket": self.bucket, "Key": self._key(src)}
        self._client.copy(source, self.bucket, self._key(dst), Config=self._transfer)  # multipart copy when large
        return self.url_for(dst)

    def presign_put(self, key: str, expires: int = 3600) -> str:
        """A presigned PUT URL for ``key``, valid for ``expires`` seconds."""
        return self._client.generate_presigned_url(
            "put_object", Params={"Bucket": self.bucket, "Key": self._key(key)}, ExpiresIn=expires
        )

    def arrow_filesystem(self):
        """pyarrow's S3 filesystem with this store's endpoint, credentials and region."""
        import pyarrow.fs

        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        kwargs = {}
        if endpoint:
            parsed = urlparse(endpoint)
            kwargs = {"endpoint_override": parsed.netloc or endpoint, "scheme": parsed.scheme or "https"}
        if self._session is not None:
            creds = self._session.get_credentials()
            if creds is not None:
                frozen = creds.get_frozen_credentials()
                kwargs.update(access_key=frozen.access_key, secret_key=frozen.secret_key, session_token=frozen.token)
            if self._session.region_name:
                kwargs["region"] = self._session.region_name
        return pyarrow.fs.S3FileSystem(**kwargs)

    def arrow_path(self, key: str) -> str:
        """``bucket/prefix/key``: the object's path in ``arrow_filesystem()``."""
        return f"{self.bucket}/{self._key(key)}"

    def incomplete_uploads(self, prefix: str = "") -> list[dict[str, Any]]:
        """Multipart uploads under ``prefix`` that were started and never completed (their writer died)."""
        found = []
        pages = self._client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=self._full(prefix)
        )
        for page in pages:
            found += page.get("Uploads", [])
        return found

    def abort_incomplete_uploads(self, older_than_s: float = 24 * 3600, prefix: str = "") -> int:
        """Abort uploads left incomplete for longer than ``older_than_s`` (their parts cost storage); how many."""
        strip = len(f"{self.prefix}/") if self.prefix else 0
        aborted = 0
        for upload in self.incomplete_uploads(prefix):
            if (utc_now() - upload["Initiated"]).total_seconds() >= older_than_s:
                aborted += self._abort(upload["Key"][strip:], upload["UploadId"])
        return aborted

    @_write_point
    def _abort(self, key: str, upload_id: str) -> bool:
        """Abort one incomplete multipart upload of ``key``."""
        self._client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(key), UploadId=upload_id)
        return True


def split_url(url: str) -> tuple[str, str, str]:
    """(scheme, bucket, path) of an object URL: an ``s3://`` key taken as written (S3 keys may hold ``#``, ``?``
    and ``%``, as the AWS CLI writes them), a ``file://`` path percent-decoded, a bare path as it is."""
    if url.startswith("s3://"):
        bucket, _, key = url[len("s3://") :].partition("/")
        return "s3", bucket, key
    parsed = urlparse(url)
    return (parsed.scheme, parsed.netloc, unquote(parsed.path)) if parsed.scheme else ("", "", url)


def open_url(url: str, session: boto3.Session | None = None) -> tuple[ObjectStore, str]:
    """The store holding an object URL and the object's key in it (for inputs that live anywhere)."""
    scheme, bucket, path = split_url(url)
    if scheme == "s3":
        return S3Store(bucket, "", session=session), path
    if scheme in ("file", ""):
        resolved = Path(path).resolve()
        return LocalStore(resolved.parent), resolved.name
    raise ValueError(f"unsupported URL {url!r}: use file:// or s3://")


def object_version(url: str, session: boto3.Session | None = None) -> tuple[int, str]:
    """(size, version) of the object at ``url``: S3's ETag, locally mtime and size; ObjectNotFound if absent."""
    store, key = open_url(url, session)
    if isinstance(store, S3Store):
        head = store._head(key)
        if head is None:
            raise ObjectNotFound(url)
        return int(head["ContentLength"]), str(head.get("ETag", "")).strip('"')
    try:
        stat = store.path(key).stat()
    except FileNotFoundError:
        raise ObjectNotFound(url) from None
    return stat.st_size, f"{stat.st_mtime_ns:x}-{stat.st_size:x}"


def copy_url(url: str, target: ObjectStore, key: str, session: boto3.Session | None = None) -> str:
    """Copy the object at ``url`` (any store) to ``key`` in ``target``, streamed, never whole in memory; its URL.

    S3 to S3 is a server-side copy; a local source is streamed into the target; S3 to a folder goes through a
    temporary file. ObjectNotFound if the source is absent."""
    source, src_key = open_url(url, session)
    if isinstance(source, LocalStore):
        path = source.path(src_key)
        if not path.is_file():
            raise ObjectNotFound(url)
        return target.put_file(key, path)
    if isinstance(target, S3Store) and isinstance(source, S3Store):
        if not source.exists(src_key):
            raise ObjectNotFound(url)
        number = faults.before("objects", "copy", key) if faults.armed else 0  # a crash point, like every write
        target._client.copy({"Bucket": source.bucket, "Key": source._key(src_key)}, target.bucket, target._key(key))
        if faults.armed:
            faults.after(number, "copy", key)
        return target.url_for(key)
    with source.local_copy(src_key) as path:
        return target.put_file(key, path)


@_write_point
def rename(store: ObjectStore, src: str, dst: str) -> str:
    """Move ``src`` to ``dst`` in one step where the store can (a local rename); S3 copies then deletes."""
    if isinstance(store, LocalStore):
        target = store.path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(store.path(src), target)
        except FileNotFoundError:
            raise ObjectNotFound(store.url_for(src)) from None
        disk.sync_folder(target.parent)
        return store.url_for(dst)
    return store.move(src, dst)
