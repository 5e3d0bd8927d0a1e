"""Object storage behind one interface: ``file://`` folders locally, ``s3://`` buckets in AWS.

Keys are validated (``tasks.keys.safe_key``) so nothing is written outside the store's root. Local writes
are atomic (temp file + rename), like an S3 PUT: a reader never sees half an object. S3 goes through boto3,
which reaches a local S3 endpoint through its own ``AWS_ENDPOINT_URL_S3``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

import boto3

from tasks.keys import safe_key
from tasks.state_store import BOTO_CONFIG

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOCAL_ROOT = REPO_ROOT / ".data" / "objects"


class ObjectNotFound(FileNotFoundError):
    """No object at that key."""


class ObjectStore:
    """Objects under one root URL; subclasses implement local folders and S3."""

    url: str

    @staticmethod
    def from_url(url: str | None, session: boto3.Session | None = None) -> "ObjectStore":
        """``file:///path`` or a bare path -> LocalStore; ``s3://bucket/prefix`` -> S3Store; empty -> the default folder."""
        if not url:
            return LocalStore(DEFAULT_LOCAL_ROOT)
        parsed = urlparse(url)
        if parsed.scheme == "s3":
            return S3Store(parsed.netloc, parsed.path.lstrip("/"), session=session)
        if parsed.scheme in ("file", ""):
            return LocalStore(Path(unquote(parsed.path)) if parsed.scheme else Path(url))
        raise ValueError(f"unsupported object store URL {url!r}: use file:// or s3://")

    def url_for(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{safe_key(key)}"

    # the interface
    def put_bytes(self, key: str, data: bytes) -> str: ...
    def put_file(self, key: str, path: str | Path) -> str: ...
    def get_bytes(self, key: str) -> bytes: ...
    def download(self, key: str, path: str | Path) -> Path: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int: ...
    def list(self, prefix: str = "") -> Iterator[str]: ...
    def delete(self, key: str) -> bool: ...
    def copy(self, src: str, dst: str) -> str: ...
    def presign_put(self, key: str, expires: int = 3600) -> str: ...
    def arrow_filesystem(self): ...
    def arrow_path(self, key: str) -> str: ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many."""
        safe_key(prefix)
        count = 0
        for key in list(self.list(prefix)):
            count += self.delete(key)
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

    def path(self, key: str) -> Path:
        path = (self.root / safe_key(key)).resolve()
        if self.root not in path.parents and path != self.root:  # belt and braces against symlinks
            raise ValueError(f"key {key!r} resolves outside {self.root}")
        return path

    def _atomic_write(self, key: str, writer) -> str:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as handle:
                writer(handle)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return self.url_for(key)

    def put_bytes(self, key: str, data: bytes) -> str:
        return self._atomic_write(key, lambda handle: handle.write(data))

    def put_file(self, key: str, path: str | Path) -> str:
        def write(handle):
            with open(path, "rb") as source:
                shutil.copyfileobj(source, handle, 1 << 20)

        return self._atomic_write(key, write)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self.path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(self.url_for(key)) from None

    def download(self, key: str, path: str | Path) -> Path:
        try:
            shutil.copyfile(self.path(key), path)
        except FileNotFoundError:
            raise ObjectNotFound(self.url_for(key)) from None
        return Path(path)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def size(self, key: str) -> int:
        try:
            return self.path(key).stat().st_size
        except FileNotFoundError:
            raise ObjectNotFound(self.url_for(key)) from None

    def list(self, prefix: str = "") -> Iterator[str]:
        base = self.root / prefix if prefix else self.root
        folder = base if prefix.endswith("/") or not prefix else base.parent
        if not folder.exists():
            return
        for dirpath, _dirs, files in os.walk(folder):
            for name in sorted(files):
                if name.startswith(".") and name.endswith(".part"):
                    continue  # an unfinished write
                key = Path(dirpath, name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    yield key

    def delete(self, key: str) -> bool:
        try:
            self.path(key).unlink()
            return True
        except FileNotFoundError:
            return False

    def copy(self, src: str, dst: str) -> str:
        return self.put_file(dst, self.path(src)) if self.exists(src) else self._missing(src)

    def _missing(self, key: str):
        raise ObjectNotFound(self.url_for(key))

    def presign_put(self, key: str, expires: int = 3600) -> str:
        """Locally the upload target is a path to write to."""
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        return str(target)

    def arrow_filesystem(self):
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem()

    def arrow_path(self, key: str) -> str:
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

    def _key(self, key: str) -> str:
        safe_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _not_found(self, error) -> bool:
        return error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")

    def put_bytes(self, key: str, data: bytes) -> str:
        self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        return self.url_for(key)

    def put_file(self, key: str, path: str | Path) -> str:
        self._client.upload_file(str(path), self.bucket, self._key(key))
        return self.url_for(key)

    def get_bytes(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as error:
            if self._not_found(error):
                raise ObjectNotFound(self.url_for(key)) from None
            raise

    def download(self, key: str, path: str | Path) -> Path:
        from botocore.exceptions import ClientError

        try:
            self._client.download_file(self.bucket, self._key(key), str(path))
        except ClientError as error:
            if self._not_found(error):
                raise ObjectNotFound(self.url_for(key)) from None
            raise
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
        return self._head(key) is not None

    def size(self, key: str) -> int:
        head = self._head(key)
        if head is None:
            raise ObjectNotFound(self.url_for(key))
        return int(head["ContentLength"])

    def list(self, prefix: str = "") -> Iterator[str]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(f"{self.prefix}/") if self.prefix else 0
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
            for obj in page.get("Contents", []):
                yield obj["Key"][strip:]

    def delete(self, key: str) -> bool:
        existed = self.exists(key)
        self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        return existed

    def copy(self, src: str, dst: str) -> str:
        if not self.exists(src):
            raise ObjectNotFound(self.url_for(src))
        self._client.copy({"Bucket": self.bucket, "Key": self._key(src)}, self.bucket, self._key(dst))
        return self.url_for(dst)

    def presign_put(self, key: str, expires: int = 3600) -> str:
        return self._client.generate_presigned_url(
            "put_object", Params={"Bucket": self.bucket, "Key": self._key(key)}, ExpiresIn=expires
        )

    def arrow_filesystem(self):
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
        return f"{self.bucket}/{self._key(key)}"


def open_url(url: str, session: boto3.Session | None = None) -> tuple[ObjectStore, str]:
    """The store holding an object URL and the object's key in it (for inputs that live anywhere)."""
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        return S3Store(parsed.netloc, "", session=session), parsed.path.lstrip("/")
    if parsed.scheme in ("file", ""):
        path = Path(unquote(parsed.path) if parsed.scheme else url).resolve()
        return LocalStore(path.parent), path.name
    raise ValueError(f"unsupported URL {url!r}: use file:// or s3://")
