"""`pipelines backup DEST` and `pipelines restore SRC`: a consistent backup of the local stack, and a stack rebuilt
from it in a fresh data folder (another machine), ready for `make up`.

A backup folder (0700) holds:
- ``dynamodb/<table>/``: each table as DynamoDB's Export to S3 writes it in DYNAMODB_JSON (``manifest-summary.json``,
  ``manifest-files.json``, ``data/*.json.gz`` of lines ``{"Item": {...}}``), beside ``table.json`` (its key schema,
  indexes and TTL: what ImportTable is given separately);
- ``prefect/``: the Prefect server's database (``prefect.dump``, pg_dump's custom format, or ``prefect.db``, a copy
  by SQLite's online backup API);
- ``objects/``: the object store's tree (a ``file://`` store), or ``objects.jsonl``, a manifest of an ``s3://`` one
  (key, size, ETag, version id: the bucket is versioned, the objects stay there);
- ``landing.json``: per watched folder, the files its listener had not acked when the backup began;
- ``backup.json``: what was backed up, when, sizes and times.

Consistency mid-feed: a scan of a live table is no snapshot, so the tables come from a snapshot of DynamoDB Local's
SQLite file (SQLite's online backup API: one point in time), exported by a temporary DynamoDB Local of its own on
the copy; the feed never stops. The order keeps the parts consistent as a crash would: the listeners' watermarks
are read first, then the tables, the Prefect database, and last the objects. An object newer than its record is what
a crash between the object's write and the record's leaves (the re-run finds the output and skips it); a record
newer than its object (lost output) cannot happen. A file that landed after the watermark was read is offered again
after the restore; its tracking record, when the snapshot has one, makes that harmless.

Secrets are not copied: `make up` makes the Prefect API's auth string and DynamoDB Local's key afresh, and the
launch key too (a row sealed under the old one is refused after a restore: carry it with PIPELINES_LAUNCH_KEY).
The Prefect database holds the blocks as they are stored, so the folder is private (0700, files 0600).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from tasks.core.errors import RefusedInput

EXPORT_VERSION = "2020-06-30"  # the export format's version AWS writes in manifest-summary.json
ITEMS_PER_FILE = 10_000
DYNAMODB_FILE = "shared-local-instance.db"  # DynamoDB Local's one database under -sharedDb
WATERMARK_NAME = ".landing-watermark"


# ----------------------------------------------------------------------------------------- DYNAMODB_JSON format


def to_export(item: dict) -> dict:
    """A low-level client's item (attribute values typed, binaries as bytes) as an export line's ``Item``: binaries
    in base64, the rest as they are."""
    return {name: _encode(value) for name, value in item.items()}


def _encode(value: dict) -> dict:
    ((kind, inner),) = value.items()
    if kind == "B":
        return {"B": base64.b64encode(inner).decode()}
    if kind == "BS":
        return {"BS": [base64.b64encode(b).decode() for b in inner]}
    if kind == "L":
        return {"L": [_encode(v) for v in inner]}
    if kind == "M":
        return {"M": {k: _encode(v) for k, v in inner.items()}}
    return value


def from_export(item: dict) -> dict:
    """An export line's ``Item`` as a low-level client takes it (binaries as bytes)."""
    return {name: _decode(value) for name, value in item.items()}


def _decode(value: dict) -> dict:
    ((kind, inner),) = value.items()
    if kind == "B":
        return {"B": base64.b64decode(inner)}
    if kind == "BS":
        return {"BS": [base64.b64decode(b) for b in inner]}
    if kind == "L":
        return {"L": [_decode(v) for v in inner]}
    if kind == "M":
        return {"M": {k: _decode(v) for k, v in inner.items()}}
    return value


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def export_table(client, table: str, folder: Path) -> int:
    """Every item of ``table`` (read through ``client``) into ``folder`` as Export to S3 writes a FULL_EXPORT in
    DYNAMODB_JSON, with ``table.json`` (its schema); the item count."""
    started = time.time()
    description = client.describe_table(TableName=table)["Table"]
    ttl = client.describe_time_to_live(TableName=table).get("TimeToLiveDescription", {})
    (folder / "data").mkdir(parents=True, exist_ok=True)
    files, count, size = [], 0, 0
    for page in _pages(client, table):
        name = f"data/{uuid.uuid4().hex}.json.gz"
        body = "".join(json.dumps({"Item": to_export(item)}) + "\n" for item in page).encode()
        packed = gzip.compress(body, mtime=0)
        (folder / name).write_bytes(packed)
        digest = hashlib.md5(packed, usedforsecurity=False)
        files.append(
            {
                "itemCount": len(page),
                "md5Checksum": base64.b64encode(digest.digest()).decode(),
                "etag": digest.hexdigest(),
                "dataFileS3Key": name,
            }
        )
        count, size = count + len(page), size + len(body)
    (folder / "manifest-files.json").write_text("".join(json.dumps(f) + "\n" for f in files))
    export_id = f"{int(started * 1000):014d}-{uuid.uuid4().hex[:8]}"
    summary = {
        "version": EXPORT_VERSION,
        "exportArn": f"{description['TableArn']}/export/{export_id}",
        "startTime": _iso(started),
        "endTime": _iso(time.time()),
        "tableArn": description["TableArn"],
        "tableId": description.get("TableId", ""),
        "exportTime": _iso(started),
        "s3Bucket": "",
        "s3Prefix": None,
        "s3SseAlgorithm": "AES256",
        "s3SseKmsKeyId": None,
        "manifestFilesS3Key": "manifest-files.json",
        "billedSizeBytes": size,
        "itemCount": count,
        "outputFormat": "DYNAMODB_JSON",
        "exportType": "FULL_EXPORT",
    }
    (folder / "manifest-summary.json").write_text(json.dumps(summary, indent=2))
    (folder / "table.json").write_text(json.dumps(_schema(description, ttl), indent=2))
    return count


def _pages(client, table: str) -> Iterator[list[dict]]:
    """``table``'s items in lists of at most ITEMS_PER_FILE (one list, maybe empty, for an empty table)."""
    page: list[dict] = []
    for response in client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        page.extend(response["Items"])
        while len(page) >= ITEMS_PER_FILE:
            yield page[:ITEMS_PER_FILE]
            page = page[ITEMS_PER_FILE:]
    yield page


def _schema(description: dict, ttl: dict) -> dict:
    """What CreateTable needs to make ``description``'s table again (on demand), and its TTL attribute."""
    schema = {
        "TableName": description["TableName"],
        "KeySchema": description["KeySchema"],
        "AttributeDefinitions": description["AttributeDefinitions"],
        "BillingMode": "PAY_PER_REQUEST",
    }
    indexes = [
        {"IndexName": i["IndexName"], "KeySchema": i["KeySchema"], "Projection": i["Projection"]}
        for i in description.get("GlobalSecondaryIndexes", ())
    ]
    if indexes:
        schema["GlobalSecondaryIndexes"] = indexes
    local = [
        {"IndexName": i["IndexName"], "KeySchema": i["KeySchema"], "Projection": i["Projection"]}
        for i in description.get("LocalSecondaryIndexes", ())
    ]
    if local:
        schema["LocalSecondaryIndexes"] = local
    return {"create": schema, "ttl_attribute": ttl.get("AttributeName") if ttl.get("TimeToLiveStatus") else None}


def exported_items(folder: Path) -> Iterator[dict]:
    """The items of one table's export folder (as a low-level client takes them), checked against its manifests."""
    summary = json.loads((folder / "manifest-summary.json").read_text())
    if summary.get("outputFormat") != "DYNAMODB_JSON":
        raise RefusedInput(f"{folder}: an export in {summary.get('outputFormat')!r}, not DYNAMODB_JSON")
    for line in (folder / summary["manifestFilesS3Key"]).read_text().splitlines():
        entry = json.loads(line)
        packed = (folder / entry["dataFileS3Key"]).read_bytes()
        if hashlib.md5(packed, usedforsecurity=False).hexdigest() != entry["etag"]:
            raise RefusedInput(f"{folder / entry['dataFileS3Key']}: its checksum differs from the manifest's")
        for text in gzip.decompress(packed).decode().splitlines():
            yield from_export(json.loads(text)["Item"])


def moved_store(item: dict, old: str, new: str) -> dict:
    """A low-level item with every string under the object store's old base URL ``old`` (a tracking record's
    ``file_path``, a manifest's ``parts``) under ``new`` instead: the records of a store restored elsewhere point
    into it, where the pipelines take only their own store's paths."""

    def moved(value: dict) -> dict:
        ((kind, inner),) = value.items()
        if kind == "S" and (inner == old or inner.startswith(old + "/")):
            return {"S": new + inner[len(old) :]}
        if kind == "L":
            return {"L": [moved(v) for v in inner]}
        if kind == "M":
            return {"M": {k: moved(v) for k, v in inner.items()}}
        if kind == "SS":
            return {"SS": [moved({"S": v})["S"] for v in inner]}
        return value

    return {name: moved(value) for name, value in item.items()}


def import_table(client, folder: Path, store_moves: tuple[str, str] | None = None) -> int:
    """Make the table of an export ``folder`` (schema and TTL from ``table.json``) and write its items, their object
    store URLs moved (``store_moves``: old and new base URL) when the store now lives elsewhere; the count."""
    schema = json.loads((folder / "table.json").read_text())
    name = schema["create"]["TableName"]
    client.create_table(**schema["create"])
    client.get_waiter("table_exists").wait(TableName=name)
    if schema["ttl_attribute"]:
        client.update_time_to_live(
            TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": schema["ttl_attribute"]}
        )
    count, batch = 0, []
    for item in exported_items(folder):
        if store_moves:
            item = moved_store(item, *store_moves)
        batch.append({"PutRequest": {"Item": item}})
        if len(batch) == 25:
            count += _write_batch(client, name, batch)
            batch = []
    return count + (_write_batch(client, name, batch) if batch else 0)


def _write_batch(client, table: str, batch: list[dict]) -> int:
    pending, delay = batch, 0.05
    while pending:
        left = client.batch_write_item(RequestItems={table: pending}).get("UnprocessedItems", {})
        pending = left.get(table, [])
        if pending:  # retried as the state store's batch writes are
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
    return len(batch)


# ----------------------------------------------------------------------------------------- a DynamoDB Local of its own


@contextlib.contextmanager
def private_dynamodb(db_folder: Path, log: Path) -> Iterator:
    """A DynamoDB Local of this process's own on ``db_folder`` (a free port, loopback only where the machine allows
    it, a fresh key); a low-level client of it."""
    import boto3
    from botocore.config import Config

    from deployments import dynamodb_keys, dynamodb_local

    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    saved = {name: os.environ.get(name) for name in names}
    key = dynamodb_keys.use_fresh_key()  # the relay checks the key of the environment it starts in
    port = dynamodb_local.free_port()
    process = dynamodb_local.start_private(port, db_folder, log)
    try:
        yield boto3.client(
            "dynamodb",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id=key.access_key_id,
            aws_secret_access_key=key.secret_access_key,
            config=Config(retries={"mode": "adaptive", "max_attempts": 10}),
        )
    finally:
        dynamodb_local.stop(process)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def sqlite_snapshot(source: Path, target: Path) -> None:
    """A copy of the SQLite database ``source`` at one point in time, taken while others write it (the online
    backup API: it starts again when a writer changes a page it copied)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=60)) as live:
        with contextlib.closing(sqlite3.connect(target)) as copy:
            live.backup(copy)


# ----------------------------------------------------------------------------------------- the object store


def _fs_now(root: Path) -> float:
    """The file system's clock under ``root`` (the clock its ctimes are read from), read where a listener reads it
    (a watched folder's clock file) so nothing new is left in the store."""
    from tasks.landing import watch

    folders = watched_folders(root)
    return watch.fs_now(folders[0]) if folders else time.time()


def watched_folders(root: Path) -> list[Path]:
    """The folders under ``root`` a local listener keeps a watermark in."""
    return sorted(path.parent for path in root.rglob(WATERMARK_NAME))


def read_marks(root: Path) -> dict[str, tuple]:
    """Each watched folder (relative to ``root``) -> (its watermark, the file system's clock now): read before the
    tables' snapshot, so every file under a watermark has its record in the snapshot."""
    from tasks.landing import watch

    return {str(f.relative_to(root)): (watch.read_watermark(f), watch.fs_now(f)) for f in watched_folders(root)}


def unacked_files(root: Path, marks: dict[str, tuple]) -> dict[str, list[str]]:
    """Each watched folder -> the files (relative to it) its listener would offer after a restart from the watermark
    read before the snapshot: the ones not acked then, and every one that came since."""
    from tasks.landing import watch

    return {
        folder: sorted(
            str(listed.path.relative_to(root / folder))
            for listed in watch.changed_files(root / folder, mark, now, lambda p: not watch.ignored_name(p.name))
            if listed.refused is None
        )
        for folder, (mark, now) in marks.items()
    }


def copy_tree(source: Path, target: Path, as_of: float | None = None, whole: tuple[Path, ...] = ()) -> tuple[int, int]:
    """Copy ``source``'s tree to ``target`` (files, folders, their times); (files, bytes). With ``as_of`` (the file
    system's clock at the tables' snapshot), a file put or renamed into place since (its ctime) is left out, except
    under the ``whole`` folders (the landing places and the quarantine: arrivals, which their listeners and records
    sort out): a pipeline's output published after the snapshot belongs to records the snapshot does not hold, and
    the restored stack makes it again. Never hard links: a link changes the live file's ctime, and the live listener
    would take every file as new at its next rescan."""
    files = size = 0
    for folder, subfolders, names in os.walk(source):
        relative = Path(folder).relative_to(source)
        (target / relative).mkdir(parents=True, exist_ok=True)
        entire = as_of is None or any(Path(folder).is_relative_to(w) for w in whole)
        for name in names:
            origin = Path(folder) / name
            if origin.is_symlink() or not origin.is_file() or name.endswith((".part", ".tmp")):
                continue  # half-written objects and what the listener quarantines anyway
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile: not in the backup
                if entire or origin.stat().st_ctime < as_of:  # else after the point in time the tables hold
                    shutil.copy2(origin, target / relative / name)
                    files, size = files + 1, size + (target / relative / name).stat().st_size
        subfolders.sort()
    return files, size


def s3_manifest(store, path: Path) -> tuple[int, int]:
    """Every current object version of an S3 store as lines of key, size, ETag, version id; (objects, bytes)."""
    count = size = 0
    paginator = store._client.get_paginator("list_object_versions")
    with path.open("w") as out:
        for page in paginator.paginate(Bucket=store.bucket, Prefix=f"{store.prefix}/" if store.prefix else ""):
            for version in page.get("Versions", ()):
                if not version.get("IsLatest"):
                    continue
                entry = {
                    "key": version["Key"],
                    "size": version["Size"],
                    "etag": version["ETag"].strip('"'),
                    "version_id": version.get("VersionId"),
                    "last_modified": version["LastModified"].isoformat(),
                }
                out.write(json.dumps(entry) + "\n")
                count, size = count + 1, size + version["Size"]
    return count, size


def restore_watermarks(root: Path, unacked: dict[str, list[str]]) -> int:
    """In a restored tree (every file's ctime new, every folder's inode new): each watched folder's watermark taken
    now, with its folders as they are, then the files not acked at the backup touched, so its listener offers those
    and no other; how many were touched."""
    from tasks.landing import watch

    touched = 0
    time.sleep(watch.WATERMARK_SLACK_S + 0.1)  # the copies lie before the slack the listener allows its watermark
    for folder, keys in unacked.items():
        watched = root / folder
        watched.mkdir(parents=True, exist_ok=True)
        folders = {
            str(Path(path).relative_to(watched)): os.stat(path).st_ino
            for path, _, _ in os.walk(watched)
            if Path(path) != watched
        }
        boot_id, boot_s = watch._boot()
        watch.write_watermark(watched, watch.Watermark(watch.fs_now(watched), folders, boot_id, boot_s))
        for key in keys:
            path = watched / key
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same times, a new ctime: offered
                touched += 1
    return touched


# ----------------------------------------------------------------------------------------- the stack


def _private_new(folder: Path) -> Path:
    if folder.exists() and any(folder.iterdir()):
        raise RefusedInput(f"{folder} is not empty: give a new folder for the backup")
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def backup(dest: Path) -> dict:
    """A consistent backup of the running local stack (this data folder's) into the new folder ``dest``."""
    from deployments import local_stack as stack
    from deployments import postgres_local
    from tasks.core.object_store import LocalStore, ObjectStore

    dest, began = _private_new(Path(dest).resolve()), time.monotonic()
    store = ObjectStore.from_url(stack.local_env()["OBJECT_STORE_BASE_URL"])
    root = store.root if isinstance(store, LocalStore) else None
    marks = read_marks(root) if root else {}
    timings, sizes = {}, {}

    live = stack.DATA / "dynamodb" / DYNAMODB_FILE
    if not live.exists():
        raise RefusedInput(f"no DynamoDB Local data at {live}: is PIPELINES_DATA_DIR the stack's data folder?")
    as_of = _fs_now(root) if root else None
    with tempfile.TemporaryDirectory(prefix="backup-dynamodb-", dir=dest) as work:
        sqlite_snapshot(live, Path(work) / DYNAMODB_FILE)
        timings["dynamodb_snapshot_s"] = round(time.monotonic() - began, 2)
        counts = {}
        with private_dynamodb(Path(work), Path(work) / "dynamodb.log") as client:
            for table in client.get_paginator("list_tables").paginate().build_full_result()["TableNames"]:
                counts[table] = export_table(client, table, dest / "dynamodb" / table)
    timings["dynamodb_s"] = round(time.monotonic() - began, 2)
    sizes["dynamodb_live"] = live.stat().st_size

    database = stack.server_db()
    (dest / "prefect").mkdir()
    if database in ("postgres", "postgresql"):
        dump = dest / "prefect" / "prefect.dump"
        subprocess.run(
            [
                str(postgres_local.bindir() / "pg_dump"),
                *("-h", str((stack.DATA / "postgres").resolve()), "-p", str(stack.POSTGRES_PORT)),
                *("-U", postgres_local.USER, "-Fc", "-f", str(dump), postgres_local.DATABASE),
            ],
            check=True,
            capture_output=True,
        )
        database = "postgres"
    else:
        sqlite_snapshot(stack.DATA / "prefect" / "prefect.db", dest / "prefect" / "prefect.db")
        database = "sqlite"
    timings["prefect_s"] = round(time.monotonic() - began - timings["dynamodb_s"], 2)

    mark = time.monotonic()
    if root:
        whole = (*watched_folders(root), root / "quarantine")
        files, sizes["objects"] = copy_tree(root, dest / "objects", as_of, whole)
        unacked = unacked_files(root, marks)
        (dest / "landing.json").write_text(json.dumps(unacked, indent=2))
    else:
        files, sizes["objects"] = s3_manifest(store, dest / "objects.jsonl")
        unacked = {}
    timings["objects_s"] = round(time.monotonic() - mark, 2)
    timings["total_s"] = round(time.monotonic() - began, 2)
    sizes["backup"] = _du(dest)
    summary = {
        "format": 1,
        "taken_at": datetime.now(UTC).isoformat(),
        "data_folder": str(stack.DATA),
        "object_store": "file" if root else store.url,
        "object_store_url": store.url,
        "prefect_database": database,
        "tables": counts,
        "objects": files,
        "unacked_files": sum(len(v) for v in unacked.values()),
        "bytes": sizes,
        "seconds": timings,
    }
    (dest / "backup.json").write_text(json.dumps(summary, indent=2))
    for path in dest.rglob("*"):
        path.chmod(0o700 if path.is_dir() else 0o600)
    return summary


def _refuse_unless_fresh(data: Path, objects: Path | None) -> None:
    taken = [p for p in (data / "dynamodb", data / "postgres", data / "prefect" / "prefect.db") if p.exists()]
    if objects and objects.exists() and any(objects.iterdir()):
        taken.append(objects)
    if taken:
        raise RefusedInput(
            f"the data folder {data} already holds a stack ({', '.join(map(str, taken))}): restore into a new one "
            "(PIPELINES_DATA_DIR=/new/folder pipelines restore SRC)"
        )


def restore(src: Path) -> dict:
    """Rebuild this data folder's stack (a new, empty one) from the backup ``src``; then `make up` starts it."""
    from deployments import dynamodb_local, postgres_local
    from deployments import local_stack as stack
    from tasks.core.object_store import LocalStore, ObjectStore
    from tasks.core.private_folder import private_logs

    src, began = Path(src).resolve(), time.monotonic()
    summary = json.loads((src / "backup.json").read_text())
    store = ObjectStore.from_url(stack.local_env()["OBJECT_STORE_BASE_URL"])
    root = store.root if isinstance(store, LocalStore) else None
    _refuse_unless_fresh(stack.DATA, root)
    database = stack.server_db()
    if summary["prefect_database"] != ("postgres" if database in ("postgres", "postgresql") else "sqlite"):
        raise RefusedInput(
            f"the backup's Prefect database is {summary['prefect_database']}, this stack's would be {database}: "
            f"PREFECT_SERVER_DB={summary['prefect_database']} pipelines restore (and make up) to keep it"
        )
    stack.DATA.mkdir(parents=True, exist_ok=True)
    logs = private_logs(stack.LOGS)
    result: dict = {"tables": {}}

    if root and (src / "objects").exists():
        result["objects"] = copy_tree(src / "objects", root)[0]
        result["offered_again"] = restore_watermarks(root, json.loads((src / "landing.json").read_text()))
    elif not root:
        result["objects"] = f"kept in {store.url} (versioned): see objects.jsonl for what the backup saw"

    old_url = summary.get("object_store_url", "").rstrip("/")
    moves = (old_url, store.url.rstrip("/")) if old_url and old_url != store.url.rstrip("/") else None
    with private_dynamodb(stack.DATA / "dynamodb", logs / "restore-dynamodb.log") as client:
        for folder in sorted((src / "dynamodb").iterdir()):
            result["tables"][folder.name] = import_table(client, folder, moves)
    if moves:
        result["object_store_moved"] = f"{moves[0]} -> {moves[1]}"

    if summary["prefect_database"] == "postgres":
        port = dynamodb_local.free_port()
        process = postgres_local.start(port, stack.DATA / "postgres", logs / "restore-postgres.log")
        try:
            dump = src / "prefect" / "prefect.dump"  # read by pg_restore, this process's user: it stays private
            restored = subprocess.run(
                [
                    str(postgres_local.bindir() / "pg_restore"),
                    *("-h", str((stack.DATA / "postgres").resolve()), "-p", str(port), "-U", postgres_local.USER),
                    *("--no-owner", "--exit-on-error", "-d", postgres_local.DATABASE, str(dump)),
                ],
                capture_output=True,
                text=True,
            )
            if restored.returncode != 0:
                raise RefusedInput(f"pg_restore failed: {restored.stderr.strip()[-2000:]}")
        finally:
            postgres_local.stop(stack.DATA / "postgres")
            process.wait(60)
    else:
        (stack.DATA / "prefect").mkdir(parents=True, exist_ok=True)
        sqlite_snapshot(src / "prefect" / "prefect.db", stack.DATA / "prefect" / "prefect.db")
    result["seconds"] = round(time.monotonic() - began, 2)
    result["next"] = "make up (new secrets: the API auth string, DynamoDB Local's key and the launch key)"
    return result
