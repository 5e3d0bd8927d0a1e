"""Sustained landing of NDJSON files through the local listener (watch source + ETL handler) on DynamoDB Local.

A writer lands files under ``pipeline/input/{date}/`` at a steady rate (written beside, renamed in, as the
object store writes); a listener process (``listen`` over ``LocalWatchSource`` and ``handle_landed``, merges
left to the flush) tracks and batches them, and is SIGKILLed ``--kills`` times at random moments and started
again. Checks: every file tracked exactly once (0 lost), no file in two manifests (0 double claims).
Figures: p50/p95 from a file's arrival (its rename) to its tracking record, and to its manifest record; the
listener's rate against calling ``track_and_batch`` directly on the same files (the baseline, same run); the
goal verdict (sustained >= 50 files/s arrival → tracking, p95 < 5 s, nothing lost or duplicated).
Prefect events are not sent here (no server): the listener's ``emit_event`` calls return at once.

    .venv/bin/python benchmarks/landing.py                 # 50 files/s for 60 s (goal: >= 50 files/s, p95 < 5 s)
    .venv/bin/python benchmarks/landing.py --kills 2       # the same with 2 SIGKILLs (the catch-up after each)
    .venv/bin/python benchmarks/landing.py --quick         # 50 files/s for 10 s, 1 kill
    .venv/bin/python benchmarks/landing.py --files-per-second 100 --seconds 30 --kills 0   # any rate and length
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["PIPELINES_USE_BLOCKS"] = "0"  # settings from defaults + env, no Prefect API needed
os.environ["PREFECT_API_KEY"] = "benchmark-sends-no-events"  # with no API URL: emit_event sends nothing
os.environ.update(ETL_EXPECTED_FILE_SIZE_MB="0.001", ETL_SIZE_TOLERANCE_PERCENT="99")

from benchmarks._common import dynamodb_local, ensure_table

DAY = "2026-01-05"
GOAL_FILES_PER_S, GOAL_P95_S = 50, 5.0  # sustained files/s from arrival to tracked, and that path's p95 seconds
INPUT = "pipeline/input/"


def use_tables(suffix: str) -> None:
    """Fresh ETL tables (deleted when the benchmark ends), named through TABLE_* for every process."""
    from tasks.core import state_store
    from tasks.core.registry import default_table_names, table_specs

    for logical, physical in default_table_names("bench").items():
        if logical.startswith("etl_"):
            os.environ[f"TABLE_{logical.upper()}"] = f"{physical}-{suffix}"
            ensure_table(f"{physical}-{suffix}", table_specs()[logical])
    state_store.reset_clients()


def listener(root: str, batch_size: int, batch_seconds: float, ready: str) -> None:
    """The listener process: pump the watch source into the ETL handler until killed (``ready`` made once watching)."""
    from tasks.etl import ingest as etl
    from tasks.etl.landing import handle_landed
    from tasks.landing.listener import listen
    from tasks.landing.watch import LocalWatchSource

    config = etl.settings()

    def launch(made: list) -> list[dict]:
        """Merges are the flush's job here: the listener only makes manifests."""
        return etl.launch_merges(made, lambda ref: None)

    source = LocalWatchSource(root, INPUT)
    Path(ready).touch()
    listen(
        source, lambda batch: handle_landed(batch, config, launch), batch_size=batch_size, batch_seconds=batch_seconds
    )


def start_listener(root: Path, args, wait: bool) -> subprocess.Popen:
    """A listener process; with ``wait``, returns once it watches."""
    ready = root / f"listener-ready-{uuid.uuid4().hex[:6]}"  # outside the watched prefix
    process = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--listener",
            root.as_uri(),
            "--ready",
            str(ready),
            "--batch-size",
            str(args.batch_size),
            "--batch-seconds",
            str(args.batch_seconds),
        ],
        stderr=subprocess.DEVNULL,
    )
    while wait and not ready.exists():
        if process.poll() is not None:
            raise SystemExit("the listener process exited at start")
        time.sleep(0.1)
    return process


def land(root: Path, i: int) -> tuple[str, float]:
    """One file renamed into place; (its name, when it arrived)."""
    from tasks.core.object_store import LocalStore

    name = f"land-{i:06d}.ndjson"
    LocalStore(root).put_bytes(f"{INPUT}{DAY}/{name}", (json.dumps({"id": i, "pad": "x" * 40}) + "\n").encode())
    return name, time.time()


def records() -> list[dict]:
    from tasks.core import state_store
    from tasks.core.config import table_name
    from tasks.etl import keys

    return [i for i in state_store.scan_all(table_name("etl_file_tracking")) if not keys.is_meta_record(i["file_key"])]


def manifest_lists() -> list[str]:
    """File names listed by every recorded manifest (a JSON whose writer was killed before its record is not one)."""
    from tasks.core import state_store
    from tasks.core.config import table_name
    from tasks.core.object_store import open_url

    listed = []
    for item in state_store.scan_all(table_name("etl_file_tracking")):
        if item["file_key"].startswith("MANIFEST#"):
            store, key = open_url(item["manifest_path"])
            listed += [u.rsplit("/", 1)[1] for u in json.loads(store.get_bytes(key))["fileLocations"][0]["URIPrefixes"]]
    return listed


def percentiles(values: list[float]) -> str:
    values = sorted(values)
    if not values:
        return "n/a"

    def pick(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return f"p50 {pick(0.5) * 1000:7.0f} ms, p95 {pick(0.95) * 1000:7.0f} ms, max {values[-1] * 1000:7.0f} ms"


def sustained(root: Path, args) -> dict:
    """Land files at the rate for the duration while the listener runs (killed and restarted); wait for all."""
    count = int(args.files_per_second * args.seconds)
    kill_at = sorted(random.uniform(0.1, 0.9) * args.seconds for _ in range(args.kills))
    process = start_listener(root, args, wait=True)
    arrived: dict[str, float] = {}
    restarts: list[tuple[float, Path]] = []  # (killed at, the new process's ready file): latency there is downtime
    start = time.monotonic()
    kills = 0
    for i in range(count):
        delay = start + i / args.files_per_second - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        name, at = land(root, i)
        arrived[name] = at
        if kill_at and time.monotonic() - start >= kill_at[0]:
            kill_at.pop(0)
            process.send_signal(signal.SIGKILL)
            process.wait()
            kills += 1
            process = start_listener(root, args, wait=False)  # landing goes on while it starts
            restarts.append((time.time(), Path(process.args[process.args.index("--ready") + 1])))
    written = time.monotonic() - start
    deadline = time.monotonic() + args.drain_timeout
    while len(found := records()) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    drained = time.time()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    found = records()  # again, now that nothing changes them (a last batch may have claimed more)

    def stamp(item: dict, field: str) -> float:
        return datetime.fromisoformat(item[field]).timestamp()

    ends = [ready.stat().st_mtime if ready.exists() else None for _, ready in restarts]  # None: killed before ready
    down = [(at, next((end for end in ends[n:] if end is not None), drained)) for n, (at, _) in enumerate(restarts)]
    steady = [i for i in found if not any(a <= arrived[i["file_key"]] <= b for a, b in down)]
    tracked = [stamp(i, "created_at") - arrived[i["file_key"]] for i in steady]
    manifested = [stamp(i, "manifested_at") - arrived[i["file_key"]] for i in steady if i.get("manifested_at")]
    steady_keys = {i["file_key"] for i in steady}
    during = [stamp(i, "created_at") - arrived[i["file_key"]] for i in found if i["file_key"] not in steady_keys]
    first = min(arrived.values())
    created = sorted(stamp(i, "created_at") for i in found) or [drained]
    return {
        "count": count,
        "written_s": written,
        "kills": kills,
        "found": found,
        "tracked": tracked,
        "manifested": manifested,
        "during": during,
        "down": [b - a for a, b in down],
        "rate": len(found) / max(1e-9, created[-1] - first),  # first arrival → last record: one latency more
        "tracking_rate": (len(created) - 1) / max(1e-9, created[-1] - created[0]),
    }  # records made per second


def direct(root: Path, names: list[str], batch_size: int) -> float:
    """The baseline: the ingest's own calls on the same files, no listener (fresh tables); files/s."""
    from tasks.core.object_store import LocalStore
    from tasks.etl import ingest as etl

    config = etl.settings()
    store = LocalStore(root)
    urls = [store.url_for(f"{INPUT}{DAY}/{name}") for name in names]
    start = time.perf_counter()
    for b in range(0, len(urls), batch_size):
        checks = etl.validate_files(urls[b : b + batch_size], config)
        tracked = etl.track_and_batch([c for c in checks if c.valid], config)
        for date_prefix in tracked["dates"]:
            etl.create_manifests(
                date_prefix, config.max_files_per_manifest, config, prefer=tracked["new_files"].get(date_prefix, [])
            )
    return len(urls) / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files-per-second", type=float, default=50)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument(
        "--kills", type=int, help="SIGKILLs of the listener at random moments (default 0: the sustained run; quick 1)"
    )
    parser.add_argument("--quick", action="store_true", help="10 s instead of 60")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--batch-seconds", type=float, default=1.0)
    parser.add_argument("--max-files-per-manifest", type=int, default=10)
    parser.add_argument("--drain-timeout", type=float, default=120)
    parser.add_argument("--listener", help=argparse.SUPPRESS)
    parser.add_argument("--ready", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.listener:
        listener(args.listener, args.batch_size, args.batch_seconds, args.ready)
        return 0
    if args.quick:
        args.seconds = min(args.seconds, 10)
    args.kills = args.kills if args.kills is not None else (1 if args.quick else 0)
    os.environ["ETL_MAX_FILES_PER_MANIFEST"] = str(args.max_files_per_manifest)
    work = Path(tempfile.mkdtemp(prefix="landing-bench-"))
    os.environ["OBJECT_STORE_BASE_URL"] = work.as_uri()
    from tasks.etl import ingest as etl

    try:
        with dynamodb_local() as endpoint:
            use_tables(uuid.uuid4().hex[:8])
            print(
                f"{args.files_per_second:.0f} files/s for {args.seconds:.0f} s, listener batches of "
                f"{args.batch_size} or "
                f"{args.batch_seconds} s, {args.kills} SIGKILL(s) of the listener, DynamoDB at {endpoint}"
            )
            result = sustained(work, args)
            names = sorted(i["file_key"] for i in result["found"])
            listed = manifest_lists()
            lost = result["count"] - len(set(names))
            doubles = len(listed) - len(set(listed)) + len(names) - len(set(names))
            statuses = {i["file_key"]: etl.base_status(i) for i in result["found"]}
            wrong = sum(1 for n, s in statuses.items() if (s == "manifested") != (n in set(listed)))
            print(
                f"  written in {result['written_s']:.1f} s; {len(names)} of {result['count']} tracked, "
                f"{result['kills']} kill(s); "
                f"lost {lost}, double claims {doubles}, manifest/record disagreements {wrong}"
            )
            print(f"  arrival -> tracking record: {percentiles(result['tracked'])} (listener up)")
            print(
                f"  arrival -> manifest record: {percentiles(result['manifested'])} ({len(result['manifested'])} "
                "files batched)"
            )
            if result["down"]:
                print(
                    f"  {len(result['during'])} files landed while a killed listener restarted "
                    f"({', '.join(f'{d:.1f} s' for d in result['down'])} down): arrival -> tracking record "
                    f"{percentiles(result['during'])}"
                )
            use_tables(uuid.uuid4().hex[:8])
            baseline = direct(work, [f"land-{i:06d}.ndjson" for i in range(result["count"])], args.batch_size)
            print(f"  baseline: track_and_batch called directly on the same files: {baseline:.0f} files/s")
            print(
                f"RATIO listener/direct = {result['rate'] / baseline:.2f}; listener {result['rate']:.0f} files/s "
                "sustained "
                f"(offered {args.files_per_second:.0f}/s: it cannot go faster than files land), direct "
                f"{baseline:.0f} files/s"
            )
            p95 = (
                sorted(result["tracked"])[int(0.95 * (len(result["tracked"]) - 1))]
                if result["tracked"]
                else float("inf")
            )
            met = result["tracking_rate"] >= GOAL_FILES_PER_S and p95 < GOAL_P95_S and not (lost or doubles)
            print(
                f"GOAL sustained >= {GOAL_FILES_PER_S} files/s arrival -> tracking, p95 < {GOAL_P95_S} s, nothing "
                "lost or "
                f"duplicated: {'met' if met else 'NOT met'} ({result['tracking_rate']:.1f} files/s tracked from the "
                "first "
                f"record to the last, {result['rate']:.1f} from the first arrival; p95 {p95:.2f} s, lost {lost}, "
                f"duplicated {doubles})"
            )
            return 1 if lost or doubles or wrong else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
