"""Sustained service: every landing place of `make up`'s stack fed at once, at given rates, for N minutes.

A whole local stack of its own (``deployments.local_stack up`` in a temporary data folder on free loopback ports:
DynamoDB Local, the Prefect server, the process worker, the listeners, every deployment and its schedules), then
feeders, each on its own thread, writing into the stack's object store the way users and upstream systems do:
- ETL: NDJSON files of ~150 KB (or, with ``--etl-mb 10``, the seed's ~10 MB ± 99% each: ``--etl-mb-spread``)
  under ``pipeline/input/{yesterday}/`` (renamed in whole) at ``--etl-rate`` files/s (the seed's average: 3.9/s);
  done = the file's tracking record ``completed`` (merged); the report gives MB/s offered and merged;
- video: a job created, then its 6 s clip at the upload target, every ``--video-every`` s; done = job completed;
- records: a message file of ``--records`` granules (one ``completed`` message each) every ``--records-every`` s;
  done = the granule's record written;
- phspectra: a small cube and its survey manifest every ``--cube-every`` s; done = the survey's run ended.
Each done time is the one its record carries (``completed_time``, ``completed_at``, the granule's ``timestamp``),
not the check's.
Optionally the ndjson listener, the worker, DynamoDB Local, PostgreSQL and the Prefect server (``--kill-listener-at
S``, ``--kill-worker-at``, ``--kill-dynamodb-at``, ``--kill-postgres-at``, ``--kill-server-at``) are SIGKILLed S
seconds into the feed; the stack's supervisor brings each back (``--recover-after R`` also runs ``local_stack up`` R
seconds after each kill, the recovery before the supervisor).

After the feed, the stack drains (``--drain`` s at most; the ETL's last partial batches are closed by one run of
the hourly ``ndjson-flush-orphans`` deployment). Printed: per pipeline arrival → done p50/p95 over the first and the
last quarter of the arrivals, the backlog (arrived, not done) over time, the stack's CPU seconds by program and per
merged MB (``stack_cpu_s``: a figure other work on a shared machine does not inflate), the ETL against pyarrow's own
``read_json`` + ``write_table`` on the same files (MB/s and CPU a MB, as ratios), lost (left undone while its
pipeline finished nothing for 2 minutes; left while it still finishes is slow, not lost), duplicated (an ETL file
in two manifests, merged rows beyond the files' lines) and failed counts, each stack process's memory (RSS) at the
start and the end, the Prefect database's growth, a user's API call (the latest runs, every 2 s) p50/p95 over the
first and the last quarter of the feed, and the server log's "database is locked" and ERROR lines. Exit code 1 on lost
or duplicated data (never on a slow run).

    .venv/bin/python benchmarks/soak.py --minutes 15 [--etl-rate 3.9] [--kill-listener-at 300] [--kill-worker-at 600]
        [--kill-dynamodb-at 120 --kill-postgres-at 240 --kill-server-at 360]
    .venv/bin/python benchmarks/soak.py --quick     # 1.5 minutes at low rates, no kills (make test-sweep)
    .venv/bin/python benchmarks/soak.py --minutes 15 --etl-mb 10 --etl-delete-merged   # the seed's 39 MB/s
    PREFECT_SERVER_DB=postgres .venv/bin/python benchmarks/soak.py ...   # the server on PostgreSQL
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import numbers
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.server_load import stack
from deployments.dynamodb_local import free_port

PIPELINES = ("etl", "video", "records", "phspectra")
STALLED_S = 120  # an item left undone while its pipeline finished nothing for this long is counted lost


class Ledger:
    """Arrivals and completions of one pipeline: item -> arrival time, done time, failure."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self.info: dict[str, dict] = {}

    def arrive(self, item: str, **info) -> None:
        with self.lock:
            self.arrived[item] = time.time()
            self.info[item] = info

    def waiting(self) -> list[str]:
        with self.lock:
            return [i for i in self.arrived if i not in self.done and i not in self.failed]

    def finish(self, item: str, at: float, failure: str | None = None) -> None:
        with self.lock:
            if failure is None:
                self.done.setdefault(item, at)
            else:
                self.failed.setdefault(item, failure)

    def latencies(self, part: slice) -> list[float]:
        with self.lock:
            ordered = sorted(self.arrived.items(), key=lambda kv: kv[1])
            chosen = ordered[part]
            return [self.done[i] - t for i, t in chosen if i in self.done]


def record_time(value: object, seen: float) -> float:
    """When a record says its outcome was written (ISO 8601, or epoch ms), else when the check saw it: a check every
    ``--tick`` s would otherwise add up to a tick to every latency."""
    try:
        if isinstance(value, numbers.Number):
            return min(float(value) / 1000, seen)
        at = datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return seen
    return min(at, seen)


class ApiProbe:
    """A user's API calls during the soak: every ``every_s`` the runs list the UI shows first, timed."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s, self.samples, self.errors = every_s, [], 0
        self.stop = threading.Event()
        self.began = time.monotonic()

    def run(self) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.sorting import FlowRunSort

        with get_client(sync_client=True) as client:
            while not self.stop.wait(self.every_s):
                t0 = time.monotonic()
                try:
                    client.read_flow_runs(limit=25, sort=FlowRunSort.START_TIME_DESC)
                except Exception:  # noqa: BLE001 - an API call that fails is counted, not fatal
                    self.errors += 1
                    continue
                self.samples.append((t0 - self.began, time.monotonic() - t0))

    def figures(self, feed_s: float) -> str:
        first = [s for t, s in self.samples if t < feed_s / 4]
        last = [s for t, s in self.samples if 3 * feed_s / 4 <= t < feed_s]
        every = [s for _, s in self.samples]
        return (
            f"API (latest 25 runs, every {self.every_s:g} s): first quarter p50 {percentile(first, 0.5):.3f} s "
            f"p95 {percentile(first, 0.95):.3f} s | last quarter p50 {percentile(last, 0.5):.3f} s "
            f"p95 {percentile(last, 0.95):.3f} s | max {max(every, default=float('nan')):.3f} s, "
            f"{len(every)} calls, {self.errors} failed"
        )


def server_errors(data: Path) -> str:
    """'database is locked' and ERROR lines in the stack's Prefect server log."""
    log = data / "logs" / "prefect-server.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return (
        f"server log: {text.count('database is locked')} 'database is locked', "
        f"{sum(' ERROR ' in line or '| ERROR' in line for line in text.splitlines())} ERROR lines"
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def etl_stages(ledger: Ledger, date: str) -> str:
    """Where the last quarter's ETL files spent their wait: arrival -> tracked (listener, micro-batch, ingest) ->
    manifested (the manifest filling) -> merge started (the run's start or its staying look) -> completed (the merge),
    p50/p95 of each, from the records' own times."""
    from tasks.core import config, state_store
    from tasks.etl import ingest as etl
    from tasks.etl import keys as etl_keys

    n = len(ledger.arrived)
    with ledger.lock:
        ordered = sorted(ledger.arrived.items(), key=lambda kv: kv[1])[n - max(1, n // 4) :]
        rows = [(t, ledger.info[i], ledger.done[i]) for i, t in ordered if "tracked" in ledger.info.get(i, {})]
    names = sorted({info["manifest"] for _, info, _ in rows if info["manifest"]})
    started: dict[str, float] = {}
    for i in range(0, len(names), 100):
        keys_ = [etl.tracking_key(date, etl_keys.manifest_record_key(m)) for m in names[i : i + 100]]
        for item in state_store.get_many(config.table_name(etl.TRACKING), keys_):
            name = etl_keys.manifest_name_from_record_key(item["file_key"])
            started[name] = record_time(item.get("processing_at"), float("inf"))
    spans: dict[str, list[float]] = collections.defaultdict(list)
    for arrived, info, done in rows:
        start = started.get(info["manifest"], float("nan"))
        for stage, a, b in (
            ("arrival->tracked", arrived, info["tracked"]),
            ("tracked->manifested", info["tracked"], info["manifested"]),
            ("manifested->merge start", info["manifested"], start),
            ("merge start->completed", start, done),
        ):
            if not math.isnan(a - b):
                spans[stage].append(b - a)
    began = min(ledger.arrived.values(), default=0.0)
    waits = sorted(
        ((info["manifested"] - info["tracked"], arrived - began, info["manifest"]) for arrived, info, _ in rows)
    )
    longest = ", ".join(f"{w:.1f} s (arrived at {t:.0f} s, {m})" for w, t, m in waits[-5:][::-1])
    return (
        "ETL stages, last quarter (p50/p95): "
        + " | ".join(f"{stage} {percentile(v, 0.5):.2f}/{percentile(v, 0.95):.2f} s" for stage, v in spans.items())
        + f"\n  longest tracked -> manifested: {longest}"
    )


def quarter_figures(ledger: Ledger) -> str:
    n = len(ledger.arrived)
    quarter = max(1, n // 4)
    first, last = ledger.latencies(slice(0, quarter)), ledger.latencies(slice(n - quarter, n))
    return (
        f"start p50 {percentile(first, 0.5):6.1f} s p95 {percentile(first, 0.95):6.1f} s "
        f"({len(first)}/{quarter} done) | "
        f"end p50 {percentile(last, 0.5):6.1f} s p95 {percentile(last, 0.95):6.1f} s ({len(last)}/{quarter} done)"
    )


# --------------------------------------------------------------------------- feeders


class EtlFiles:
    """The ETL feeder's files: each ``lines`` lines (``--etl-lines``), or, with ``--etl-mb``, a size drawn from
    ``mb`` ± ``spread`` (a seeded draw per file, kept within the sizes the stack accepts), cut from a pool of
    pre-generated line blocks so that writing tens of MB/s costs a memory copy, not JSON encoding."""

    BLOCKS, BLOCK_BYTES = 8, 1 << 20  # the pool: 8 different blocks of ~1 MiB of whole lines

    def __init__(self, lines: int, mb: float = 0.0, spread: float = 0.99, bounds: tuple[float, float] | None = None):
        from deployments.samples import etl as etl_sample

        rng = random.Random(1)
        self.mb, self.spread, self.sizes = mb, spread, random.Random(40)
        if not mb:
            self.fixed = ("\n".join(etl_sample._records(rng, lines)) + "\n").encode()
            return
        low, high = mb * (1 - spread) * 2**20, mb * (1 + spread) * 2**20
        if bounds:  # the stack quarantines a file outside expected size ± tolerance: stay inside
            low, high = max(low, bounds[0]), min(high, bounds[1])
        self.low, self.high = math.ceil(low), math.floor(high)
        self.blocks: list[bytes] = []
        self.line_ends: list[list[int]] = []  # each block's cumulative byte offsets after each line
        for _ in range(self.BLOCKS):
            records = etl_sample._records(rng, self.BLOCK_BYTES // 100)
            ends, total = [], 0
            for record in records:
                total += len(record) + 1
                if total > self.BLOCK_BYTES:
                    break
                ends.append(total)
            self.blocks.append(("\n".join(records[: len(ends)]) + "\n").encode())
            self.line_ends.append(ends)

    def make(self, n: int) -> tuple[bytes, int]:
        """File ``n``'s bytes and its line count (deterministic in ``n``'s order of calls)."""
        import bisect

        if not self.mb:
            return self.fixed, self.fixed.count(b"\n")
        target = self.sizes.randint(self.low, self.high)
        pieces, lines, size, b = [], 0, 0, n % self.BLOCKS
        while size + len(self.blocks[b]) <= target:
            pieces.append(self.blocks[b])
            lines, size, b = lines + len(self.line_ends[b]), size + len(self.blocks[b]), (b + 1) % self.BLOCKS
        ends = self.line_ends[b]
        cut = bisect.bisect_right(ends, target - size)  # whole lines up to the target
        if size + (ends[cut - 1] if cut else 0) < self.low:  # one more line, never below the accepted size
            cut += 1
        if cut:
            pieces.append(memoryview(self.blocks[b])[: ends[cut - 1]])
            lines += cut
        return b"".join(pieces), lines


class Feeders:
    """The four feeders and the checks of what they fed, on the stack whose environment this process has."""

    def __init__(self, work: Path, args) -> None:
        from tasks.core.config import object_store

        self.work, self.args = work, args
        self.store = object_store()
        self.ledgers = {name: Ledger() for name in PIPELINES}
        self.stop = threading.Event()
        self.date = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")  # the flush closes it
        self.tag = datetime.now(UTC).strftime("%H%M%S")
        self.etl_bounds = etl_size_bounds()
        self.etl_files = EtlFiles(args.etl_lines, args.etl_mb, args.etl_mb_spread, self.etl_bounds)
        self.etl_busy_s, self.etl_bytes = 0.0, 0  # the ETL feeder's own time writing, and what it wrote

    def paced(self, every_s: float, feed) -> None:
        """Call ``feed(n)`` every ``every_s`` seconds (catching up after a slow call, never bunching) until stopped."""
        n, began = 0, time.monotonic()
        while not self.stop.is_set():
            try:
                feed(n)
            except Exception as error:  # noqa: BLE001 - a feeder that cannot write is a finding, not a crash
                print(f"feeder error: {type(error).__name__}: {error}", flush=True)
            n += 1
            self.stop.wait(max(0.0, began + n * every_s - time.monotonic()))

    def feed_etl(self, n: int) -> None:
        from tasks.etl import keys as etl_keys

        start = time.perf_counter()
        name = f"soak-{self.tag}-{n:07d}.ndjson"
        data, lines = self.etl_files.make(n)
        self.store.put_bytes(etl_keys.input_key(self.date, name), data)  # renamed in whole, as an upload lands
        self.ledgers["etl"].arrive(name, lines=lines, size=len(data))
        self.etl_busy_s += time.perf_counter() - start
        self.etl_bytes += len(data)

    def feed_video(self, n: int) -> None:
        from deployments.samples import video as video_sample

        job = video_sample.drop(self.work / f"video-{n:04d}", self.store)
        self.ledgers["video"].arrive(job["job_id"])

    def feed_records(self, n: int) -> None:
        from deployments.samples.records import _message
        from tasks.records import keys as records_keys

        granules = [f"SOAK{self.tag}.A{n:05d}.h{g:02d}v00.006" for g in range(self.args.records)]
        bodies = [
            json.dumps(_message("completed", f"soak-{self.tag}-{n}-{g}", 1_700_000_000_000 + n, [granule]))
            for g, granule in enumerate(granules)
        ]
        self.store.put_bytes(
            f"{records_keys.RECORDS_INCOMING_PREFIX}soak-{self.tag}-{n:05d}.ndjson", ("\n".join(bodies) + "\n").encode()
        )
        for granule in granules:
            self.ledgers["records"].arrive(granule)

    def feed_cube(self, n: int) -> None:
        from deployments.samples.phspectra import synthetic_cube, write_fits
        from tasks.phspectra import keys as phspectra_keys

        survey = f"soak-{self.tag}-{n:04d}"
        cube = write_fits(synthetic_cube(seed=n), self.work / f"cube-{n:04d}.fits")
        cube_key = f"surveys/cubes/{survey}-cube.fits"
        self.store.put_file(cube_key, cube)
        manifest = {"survey": survey, "cubes": [cube_key], "chunk_size": 12, "fit_params": {"beta": 3.5}}
        self.store.put_bytes(
            f"{phspectra_keys.SURVEY_INCOMING_PREFIX}{survey}/{survey}.json", json.dumps(manifest).encode()
        )
        self.ledgers["phspectra"].arrive(survey)

    def start(self) -> list[threading.Thread]:
        a = self.args
        plan = [
            (1 / a.etl_rate, self.feed_etl),
            (a.video_every, self.feed_video),
            (a.records_every, self.feed_records),
            (a.cube_every, self.feed_cube),
        ]
        threads = [
            threading.Thread(target=self.paced, args=p, daemon=True) for p in plan if p[0] > 0 and p[0] != float("inf")
        ]
        for thread in threads:
            thread.start()
        return threads

    # ----------------------------------------------------------------------- checks

    def check(self) -> None:
        """Mark what is done (or failed) since the last check, each with the time it was seen."""
        from tasks.core import config, state_store
        from tasks.etl import ingest as etl
        from tasks.etl import keys as etl_keys
        from tasks.phspectra import survey as ph
        from tasks.video import jobs as video

        now = time.time()
        etl_ledger = self.ledgers["etl"]
        waiting = etl_ledger.waiting()
        if waiting:
            found = state_store.get_many(
                config.table_name(etl.TRACKING), [{"date_prefix": self.date, "file_key": f} for f in waiting]
            )
            for item in found:
                status = etl.base_status(item)
                if status == etl.COMPLETED:
                    etl_ledger.finish(item["file_key"], record_time(item.get("completed_time"), now))
                    etl_ledger.info[item["file_key"]].update(
                        tracked=record_time(item.get("created_at"), now),
                        manifested=record_time(item.get("manifested_at"), now),
                        manifest=str(item.get("manifest_path", "")).rsplit("/", 1)[-1],
                    )
                    if self.args.etl_delete_merged:  # the disk holds the backlog only (39 MB/s fills it)
                        self.store.delete(etl_keys.input_key(self.date, item["file_key"]))
                elif status in (etl.FAILED, etl.QUARANTINED):
                    etl_ledger.finish(item["file_key"], now, f"{status}: {item.get('error_message', '')}")
        for job_id in self.ledgers["video"].waiting():
            job = video.get_job(job_id)
            if job["status"] == video.COMPLETED:
                self.ledgers["video"].finish(job_id, record_time(job.get("completed_at"), now))
            elif job["status"] == video.FAILED:
                self.ledgers["video"].finish(job_id, now, str(job.get("failure_reason")))
        waiting = self.ledgers["records"].waiting()
        if waiting:
            for item in state_store.get_many(config.table_name("granules"), [{"granuleId": g} for g in waiting]):
                self.ledgers["records"].finish(item["granuleId"], record_time(item.get("timestamp"), now))
        for survey in self.ledgers["phspectra"].waiting():
            run = ph.latest_run(survey)
            if run and run["status"] == ph.RUN_COMPLETED:
                self.ledgers["phspectra"].finish(survey, record_time(run.get("completed_at"), now))
            elif run and run["status"] == ph.RUN_FAILED:
                self.ledgers["phspectra"].finish(survey, now, str(run.get("error")))

    def etl_duplicates(self) -> tuple[int, int, int]:
        """(files listed in two manifests, merged rows, rows the merged files hold) for this soak's files."""
        import pyarrow.parquet as pq

        from tasks.etl import keys as etl_keys

        mine = set(self.ledgers["etl"].arrived)
        listed = collections.Counter()
        for path in self.store.path(etl_keys.manifest_key(self.date, "x")).parent.glob("*.json"):
            for url in json.loads(path.read_text())["fileLocations"][0]["URIPrefixes"]:
                name = url.rsplit("/", 1)[-1]
                if name in mine:
                    listed[name] += 1
        rows = 0
        for part in self.store.path(etl_keys.merged_output_prefix(self.date) + "x").parent.glob("*.parquet"):
            rows += pq.read_metadata(part).num_rows
        ledger = self.ledgers["etl"]
        expected = sum(ledger.info[name]["lines"] for name in ledger.done)  # each file's own line count
        return sum(n - 1 for n in listed.values() if n > 1), rows, expected

    def etl_rates(self, feed_s: float) -> str:
        """The ETL's MB/s offered (over the feed) and merged (from the first arrival to the last merge), and what the
        feeder could write on its own (its bytes over its own busy time): the feed is not its own bottleneck."""
        ledger = self.ledgers["etl"]
        merged = sum(ledger.info[name]["size"] for name in ledger.done) / 2**20
        span = max(ledger.done.values(), default=0) - min(ledger.arrived.values(), default=0)
        return (
            f"ETL MB/s: offered {self.etl_bytes / 2**20 / feed_s:.1f} ({self.etl_bytes / 2**20:.0f} MB in "
            f"{len(ledger.arrived)} files, {self.etl_bytes / 2**20 / max(len(ledger.arrived), 1):.1f} MB each); merged "
            f"{merged / span if span > 0 else float('nan'):.1f} ({merged:.0f} MB); the feeder alone: "
            f"{self.etl_bytes / 2**20 / self.etl_busy_s if self.etl_busy_s else float('nan'):.0f} MB/s "
            f"({self.etl_busy_s:.1f} s of writing)"
        )


def etl_size_bounds() -> tuple[float, float] | None:
    """The file sizes the stack's ETL accepts (expected ± tolerance, bytes); None when its settings cannot be read."""
    try:
        from tasks.etl.ingest import settings

        return settings().size_bounds_bytes()
    except Exception as error:  # noqa: BLE001 - the draw is then only the --etl-mb spread
        print(f"(the ETL's size bounds not read: {type(error).__name__}: {error})", flush=True)
        return None


# --------------------------------------------------------------------------- the stack's processes


def stack_processes(data: Path) -> dict[str, int]:
    """Name -> pid of the stack's processes: its supervisor's programs, each running listener's flow-run process."""
    from deployments.supervisor import Supervisor, socket_for

    names = {"worker": "worker (prefect worker)", "engine": "engine fork server"}
    found = {
        names.get(info["name"], info["name"]): info["pid"]
        for info in Supervisor(data, socket_for(data)).statuses()
        if info["statename"] == "RUNNING" and info["pid"]
    }
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType

    from deployments import local_stack

    runs = _fork_server_runs(found.get("engine fork server"))
    try:
        with get_client(sync_client=True) as client:
            for name, (_deployment, listener_runs) in local_stack._listener_runs(client, [StateType.RUNNING]).items():
                for run in listener_runs:
                    caller = local_stack._run_pid(run.infrastructure_pid)
                    if caller:  # the worker watches a small `run` caller; the run itself is a fork of the server
                        found[name] = runs.pop(_stdout(caller), caller)
    except Exception as error:  # noqa: BLE001 - a server too busy to answer: the listeners go unmeasured
        print(f"(listener pids not read: {type(error).__name__}: {error})")
    for n, pid in enumerate(sorted(runs.values())):
        found[f"other flow run {n + 1}"] = pid
    return found


def _stdout(pid: int) -> str | None:
    """What a process's standard output is (``pipe:[inode]``): a run shares its caller's."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None


def _fork_server_runs(server: int | None) -> dict[str | None, int]:
    """The engine fork server's run processes (its children), by their standard output."""
    import psutil

    if server is None:
        return {}
    try:
        children = psutil.Process(server).children()
    except psutil.Error:
        return {}
    return {_stdout(c.pid): c.pid for c in children}


def memory(data: Path) -> dict[str, float]:
    """MB of resident memory of each stack process (with its children for the server and DynamoDB)."""
    import psutil

    result: dict[str, float] = {}
    others = 0
    for name, pid in stack_processes(data).items():
        try:
            process = psutil.Process(pid)
            family = [process] + (
                process.children(recursive=True) if name in ("prefect-server", "dynamodb", "postgres") else []
            )
            mb = sum(p.memory_info().rss for p in family) / 2**20
        except psutil.Error:
            mb = float("nan")
        if name.startswith("other flow run"):  # short-lived runs: summed, with their count
            others += 1
            result["other flow runs (sum)"] = result.get("other flow runs (sum)", 0.0) + mb
        else:
            result[name] = mb
    result["other flow runs (count)"] = others
    return result


def database_mb(data: Path) -> float:
    """MB of the Prefect server's database files (SQLite's file and WAL, or PostgreSQL's folder)."""
    paths = list((data / "prefect").glob("prefect.db*")) + list((data / "postgres").rglob("*"))
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


def stack_cpu_s(data: Path) -> dict[str, float]:
    """CPU seconds (user + system) each supervisor program has used so far with every process under it: the live
    ones and those their parents already reaped (a flow run forked by the engine counts under ``engine``). A figure
    that a shared machine's other work does not inflate, unlike a latency."""
    import psutil

    from deployments.supervisor import Supervisor, socket_for

    used: dict[str, float] = {}
    for info in Supervisor(data, socket_for(data)).statuses():
        if info["statename"] != "RUNNING" or not info["pid"]:
            continue
        try:
            top = psutil.Process(info["pid"])
            family = [top, *top.children(recursive=True)]
        except psutil.Error:
            continue
        total = 0.0
        for process in family:
            try:
                times = process.cpu_times()
            except psutil.Error:  # ended meanwhile: its parent's reaped-children time holds it
                continue
            total += times.user + times.system + times.children_user + times.children_system
        used[info["name"]] = total
    return used


def cpu_figures(start: dict[str, float], end: dict[str, float], merged_mb: float) -> str:
    """The stack's CPU seconds between two ``stack_cpu_s`` readings, by program, and per merged MB."""
    spent = {name: max(0.0, end[name] - start.get(name, 0.0)) for name in end}  # a restarted program: from 0
    total = sum(spent.values())
    per_mb = f"{total * 1000 / merged_mb:.0f} ms" if merged_mb else "n/a"
    parts = ", ".join(f"{name} {seconds:.0f}" for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]))
    return f"stack CPU over the feed and drain: {total:.0f} s ({parts}); {per_mb} a merged MB"


def pyarrow_baseline(args, work: Path, bounds: tuple[float, float] | None, files: int = 4) -> tuple[float, float]:
    """pyarrow's own ``read_json`` + ``write_table`` (one Parquet file each) on the feed's first ``files`` ETL files
    (the same bytes, drawn again), in this process: its MB/s and its CPU ms a MB."""
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    maker = EtlFiles(args.etl_lines, args.etl_mb, args.etl_mb_spread, bounds)
    folder = work / "pyarrow-baseline"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n in range(files):
        path = folder / f"{n}.ndjson"
        path.write_bytes(maker.make(n)[0])
        paths.append(path)
    mb = sum(path.stat().st_size for path in paths) / 2**20
    wall, cpu = time.perf_counter(), time.process_time()
    for path in paths:
        pq.write_table(pajson.read_json(path), path.with_suffix(".parquet"))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    shutil.rmtree(folder, ignore_errors=True)
    return mb / wall, cpu * 1000 / mb


KILLABLE = {  # --kill-X-at -> the stack process it SIGKILLs
    "listener": "ndjson-listen/local",
    "worker": "worker (prefect worker)",
    "dynamodb": "dynamodb",
    "postgres": "postgres",
    "server": "prefect-server",
}


def kill(data: Path, what: str) -> str:
    """SIGKILL one of the stack's processes (``KILLABLE``: DynamoDB Local's jar inside its relay); what was killed."""
    import psutil

    name = KILLABLE[what]
    pid = stack_processes(data).get(name)
    if pid is None:
        return f"no {name} process found to kill"
    if name == "dynamodb":
        with contextlib.suppress(psutil.Error, IndexError):
            pid = psutil.Process(pid).children()[0].pid  # the jar, not the relay in front of it
    os.kill(pid, signal.SIGKILL)
    return f"SIGKILLed {name} (pid {pid})"


def recover(env: dict[str, str], began: float) -> None:
    """`local_stack up` on the stack (the documented recovery after a kill), timed."""
    t = time.monotonic()
    print(f"-- {t - began:.0f} s: `local_stack up` (the documented recovery) starts", flush=True)
    try:
        stack("up", env)
        print(f"-- {time.monotonic() - began:.0f} s: `local_stack up` done in {time.monotonic() - t:.0f} s", flush=True)
    except Exception as error:  # noqa: BLE001 - a recovery that fails is a finding
        print(f"-- `local_stack up` failed: {error}", flush=True)


def flush_orphans() -> str:
    """One run of the hourly flush (closes the earlier day's partial batches), as its schedule would start it."""
    from prefect.deployments import run_deployment

    run = run_deployment("ndjson-flush-orphans/local", timeout=0)
    return str(run.id)


# --------------------------------------------------------------------------- main


STOP_EARLY = threading.Event()


def stop_early(signum: int, frame) -> None:  # signal handler signature
    """SIGINT/SIGTERM: end the feed now and report what is done (no drain); a second one tears the stack down at once
    (``main``'s ``finally`` stops it either way: a stopped soak leaves no stack running)."""
    if STOP_EARLY.is_set():
        raise SystemExit(128 + signum)
    STOP_EARLY.set()
    print(f"-- signal {signum}: stopping the feed; the report follows (again: stop now)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15)
    parser.add_argument("--etl-rate", type=float, default=3.9, help="ETL files per second (the seed's average: 3.9)")
    parser.add_argument("--etl-lines", type=int, default=1200, help="lines per ETL file (1200: ~150 KB)")
    parser.add_argument(
        "--etl-mb",
        type=float,
        default=0,
        help="ETL files of MB ± --etl-mb-spread each, drawn per file (the seed's: 10), instead of --etl-lines",
    )
    parser.add_argument("--etl-mb-spread", type=float, default=0.99, help="the seed's tolerance: 0.99 (± 99%%)")
    parser.add_argument(
        "--etl-delete-merged",
        action="store_true",
        help="delete each ETL file once merged (at 39 MB/s the inputs would fill the disk: it holds the backlog only)",
    )
    parser.add_argument("--video-every", type=float, default=90)
    parser.add_argument("--records-every", type=float, default=30)
    parser.add_argument("--records", type=int, default=20, help="granules per records message file")
    parser.add_argument("--cube-every", type=float, default=180)
    parser.add_argument(
        "--kill-listener-at", type=float, default=0, help="SIGKILL the ndjson listener S s into the feed"
    )
    for what in KILLABLE:
        if what != "listener":
            parser.add_argument(f"--kill-{what}-at", type=float, default=0, help=f"SIGKILL {KILLABLE[what]} S s in")
    parser.add_argument(
        "--recover-after",
        type=float,
        default=0,
        help="seconds after a kill to run `local_stack up` (0, the default: the stack's supervisor alone)",
    )
    parser.add_argument("--drain", type=float, default=600, help="seconds to wait after the feed for the backlog")
    parser.add_argument("--memory-every", type=float, default=600.0, help="seconds between memory samples")
    parser.add_argument("--tick", type=float, default=15, help="seconds between backlog samples")
    parser.add_argument(
        "--api-budget",
        action="store_true",
        help="count every Prefect API request, log line and event through a proxy (benchmarks/api_budget.py)",
    )
    parser.add_argument(
        "--idle", type=float, default=120, help="with --api-budget: seconds of idle count before the feed"
    )
    parser.add_argument("--quick", action="store_true", help="1.5 minutes, ETL 1 file/s, a video, records, a cube")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.etl_rate, args.video_every, args.records_every, args.cube_every = 1.5, 1.0, 60, 30, 60
        args.records, args.drain, args.tick = 5, 420, 10

    root = Path(tempfile.mkdtemp(prefix="soak-"))
    if os.geteuid() == 0:  # PostgreSQL runs as `postgres`: it must be able to reach its folder
        root.chmod(0o755)
    data = root / "stack"
    env = {
        **os.environ,
        "PIPELINES_DATA_DIR": str(data),
        "DYNAMODB_LOCAL_PORT": str(free_port()),
        "PREFECT_SERVER_PORT": str(free_port()),
        "PREFECT_POSTGRES_PORT": str(free_port()),
    }
    for name in ("AWS_ENDPOINT_URL_DYNAMODB", "PREFECT_API_URL", "OBJECT_STORE_BASE_URL"):
        env.pop(name, None)
    database = os.environ.get("PREFECT_SERVER_DB") or "make up's default (PostgreSQL where installed)"
    sizes = f"{args.etl_mb:g} MB ± {args.etl_mb_spread:.0%}" if args.etl_mb else f"{args.etl_lines} lines"
    print(
        f"soak: {args.minutes:g} min; ETL {args.etl_rate:g} files/s of {sizes}, a video every "
        f"{args.video_every:g} s, {args.records} records every {args.records_every:g} s, a cube every "
        f"{args.cube_every:g} s; Prefect server on {database}; machine: {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at start",
        flush=True,
    )
    proxy = start_budget_proxy(data, env) if args.api_budget else None
    t0 = time.monotonic()
    failed_exit = 0
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop_early)
    try:
        stack("up", env)
        chosen = data / "run" / "prefect-server.database"  # what `up` started the server on
        print(
            f"(stack up in {time.monotonic() - t0:.0f} s in {data}, not counted; Prefect server on "
            f"{chosen.read_text().strip() if chosen.exists() else 'unknown'})",
            flush=True,
        )
        for line in (data / "local.env").read_text().splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            os.environ[name] = value
        os.environ.update(
            {
                k: env[k]
                for k in ("PIPELINES_DATA_DIR", "DYNAMODB_LOCAL_PORT", "PREFECT_SERVER_PORT", "PREFECT_POSTGRES_PORT")
            }
        )
        failed_exit = run_soak(args, root, data, env, proxy)
    finally:
        print(stack("down", env).strip(), flush=True)
        if proxy:
            proxy.stop()
        shutil.rmtree(root, ignore_errors=True)
    return failed_exit


def start_budget_proxy(data: Path, env: dict[str, str]):
    """The counting proxy (benchmarks/api_budget.py) on a port of its own in front of the stack's server, with the
    stack's certificate: the stack's clients get its port (``PIPELINES_API_CLIENT_PORT``), the server keeps its own."""
    from benchmarks.api_budget import BudgetProxy
    from deployments import stack_tls

    data.mkdir(parents=True, exist_ok=True)
    cert, key = stack_tls.certificate_files(data / "secrets")
    proxy = BudgetProxy(0, int(env["PREFECT_SERVER_PORT"]), cert, key).start()
    env["PIPELINES_API_CLIENT_PORT"] = str(proxy.listen_port)
    return proxy


def budget_report(proxy, windows: dict, landed: dict[str, int]) -> str:
    """``api_budget.report`` over the feed window, with the idle window's per minute."""
    from benchmarks import api_budget

    (idle_a, idle_b, idle_s), (feed_a, feed_b, feed_s) = windows["idle"], windows["feed"]
    names = api_budget.run_names(proxy.run_ids, f"https://127.0.0.1:{proxy.upstream_port}/api")
    return api_budget.report(
        api_budget.between(feed_a, feed_b),
        feed_s / 60,
        landed,
        names,
        api_budget.between(idle_a, idle_b),
        idle_s / 60,
    )


def run_soak(args, root: Path, data: Path, env: dict[str, str], proxy=None) -> int:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: os.environ["PREFECT_API_URL"]}):
        feeders = Feeders(root, args)
        deadline = (
            time.monotonic() + 180
        )  # the listeners' runs start after `up` returns: the start figures wait for them
        while sum(name.endswith("-listen/local") for name in stack_processes(data)) < 4 and time.monotonic() < deadline:
            time.sleep(3)
        budget: dict = {}
        if proxy:  # the stack's background alone first: what it costs with nothing landing
            idle_from, t = proxy.counts.snapshot(), time.monotonic()
            print(f"-- counting the idle stack for {args.idle:g} s", flush=True)
            time.sleep(args.idle)
            budget["idle"] = (idle_from, proxy.counts.snapshot(), time.monotonic() - t)
        memory_start, db_start, cpu_start = memory(data), database_mb(data), stack_cpu_s(data)
        feed_s = args.minutes * 60
        kills = sorted((at, what) for what in KILLABLE if (at := getattr(args, f"kill_{what}_at")))
        recoveries: list[float] = []
        began = time.monotonic()
        feed_from = proxy.counts.snapshot() if proxy else None
        threads = feeders.start()
        probe = ApiProbe()
        threading.Thread(target=probe.run, daemon=True).start()
        print(
            f"\n{'t (s)':>6} " + " ".join(f"{p + ' backlog':>17}" for p in PIPELINES) + f" {'load':>5} {'db MB':>7}",
            flush=True,
        )
        backlog = []
        memory_samples = [(0.0, memory_start)]  # whether memory levels off: a sample every --memory-every s
        next_tick, flushed, stopped = began, False, False
        while True:
            now = time.monotonic() - began
            if not stopped and (now >= feed_s or STOP_EARLY.is_set()):
                feeders.stop.set()
                probe.stop.set()
                for thread in threads:
                    thread.join(60)
                if proxy:
                    budget["feed"] = (feed_from, proxy.counts.snapshot(), time.monotonic() - began)
                stopped = True
                drain = "no drain (stopped early)" if STOP_EARLY.is_set() else f"draining (at most {args.drain:g} s)"
                print(f"-- feed stopped at {now:.0f} s; {drain}", flush=True)
            while kills and now >= kills[0][0]:
                print(f"-- {now:.0f} s: {kill(data, kills.pop(0)[1])}", flush=True)
                if args.recover_after:
                    recoveries.append(now + args.recover_after)
            while recoveries and now >= recoveries[0]:
                recoveries.pop(0)
                threading.Thread(target=recover, args=(env, began), daemon=True).start()  # the samples go on meanwhile
            if now >= memory_samples[-1][0] + args.memory_every:
                memory_samples.append((now, memory(data)))
            try:
                feeders.check()
            except Exception as error:  # noqa: BLE001 - a busy stack answering late is a figure, not a crash
                print(f"(check failed: {type(error).__name__}: {error})", flush=True)
            counts = {
                p: (len(ledger.arrived), len(ledger.done), len(ledger.failed)) for p, ledger in feeders.ledgers.items()
            }
            backlog.append((now, {p: a - d - f for p, (a, d, f) in counts.items()}))
            print(
                f"{now:6.0f} "
                + " ".join(f"{f'{a - d - f} ({d}/{a})':>17}" for p, (a, d, f) in counts.items())
                + f" {os.getloadavg()[0]:5.1f} {database_mb(data):7.1f}",
                flush=True,
            )
            if stopped and not flushed and not STOP_EARLY.is_set() and feeders.ledgers["etl"].arrived:
                print(f"-- the hourly ndjson-flush-orphans, started now: run {flush_orphans()}", flush=True)
                flushed = True
            drained = all(b == 0 for b in backlog[-1][1].values())
            if stopped and (drained or now > feed_s + args.drain or STOP_EARLY.is_set()):
                break
            next_tick = max(next_tick + args.tick, time.monotonic())  # a slow check skips samples, never bunches them
            time.sleep(max(0.0, next_tick - time.monotonic()))
        memory_end, db_end, cpu_end = memory(data), database_mb(data), stack_cpu_s(data)
        memory_samples.append((time.monotonic() - began, memory_end))
        doubles, rows, expected_rows = feeders.etl_duplicates() if feeders.ledgers["etl"].arrived else (0, 0, 0)

    print(f"\n{'pipeline':10} {'arrived':>7} {'done':>6} {'failed':>6} {'left':>5} {'lost':>5}  arrival -> done")
    lost_total, end = 0, time.time()
    for name, ledger in feeders.ledgers.items():
        left = len(ledger.arrived) - len(ledger.done) - len(ledger.failed)
        # left undone while nothing of its pipeline finished for STALLED_S: lost; still finishing: slow, not lost
        last = max(list(ledger.done.values()) + [max(ledger.arrived.values(), default=end)], default=end)
        lost = left if left and end - last > STALLED_S else 0
        lost_total += lost
        print(
            f"{name:10} {len(ledger.arrived):7} {len(ledger.done):6} {len(ledger.failed):6} {left:5} {lost:5}  "
            f"{quarter_figures(ledger)}"
        )
        if left and not lost:
            print(
                f"    {left} still in the backlog at the end, finishing ({end - last:.0f} s since the last one "
                "done): slow, not lost"
            )
        for item, reason in list(ledger.failed.items())[:3]:
            print(f"    failed {item}: {reason[:160]}")
    if feeders.ledgers["etl"].done:
        print(etl_stages(feeders.ledgers["etl"], feeders.date))
    etl_backlog = backlog[-1][1]["etl"] if backlog else 0
    extra_rows = max(0, rows - expected_rows) if not etl_backlog else 0  # a manifest mid-merge is not a duplicate
    print(
        f"ETL duplicates: {doubles} files in two manifests; merged rows {rows} for {expected_rows} lines in the files "
        f"merged ({extra_rows if not etl_backlog else 'not checked: a backlog is left'} beyond)"
    )
    etl = feeders.ledgers["etl"]
    if etl.done:
        span = max(etl.done.values()) - min(etl.arrived.values())
        print(
            f"ETL throughput: {len(etl.done)} files merged in {span:.0f} s from the first arrival = "
            f"{len(etl.done) / span:.2f} files/s (offered {args.etl_rate:g}/s)"
        )
    if etl.arrived:
        print(feeders.etl_rates(feed_s))
        merged_mb = sum(etl.info[name]["size"] for name in etl.done) / 2**20
        span = max(etl.done.values(), default=0) - min(etl.arrived.values(), default=0)
        baseline_mbs, baseline_cpu = pyarrow_baseline(args, root, feeders.etl_bounds)
        cpu_s = sum(max(0.0, cpu_end[name] - cpu_start.get(name, 0.0)) for name in cpu_end)
        print(
            f"ETL against pyarrow's own read_json + write_table on the same files (this process, after the drain): "
            f"{baseline_mbs:.1f} MB/s, {baseline_cpu:.0f} ms of CPU a MB; RATIO merged MB/s / pyarrow MB/s "
            f"{(merged_mb / span if span > 0 else 0) / baseline_mbs:.2f}; RATIO the stack's CPU a merged MB / "
            f"pyarrow's {(cpu_s * 1000 / merged_mb if merged_mb else float('nan')) / baseline_cpu:.1f}"
        )
    print(cpu_figures(cpu_start, cpu_end, sum(etl.info[name]["size"] for name in etl.done) / 2**20))
    print("\nmemory (RSS MB) at t (min) " + "".join(f"{t / 60:7.0f}" for t, _ in memory_samples))
    for name in sorted({name for _, sample in memory_samples for name in sample}):
        print(f"  {name:26}" + "".join(f"{sample.get(name, float('nan')):7.0f}" for _, sample in memory_samples))
    landed = sum(len(ledger.arrived) for ledger in feeders.ledgers.values())
    print(
        f"Prefect database: {db_start:.1f} -> {db_end:.1f} MB (+{db_end - db_start:.1f} MB for {landed} items landed, "
        f"{(db_end - db_start) * 1024 / max(landed, 1):.1f} KB each)"
    )
    print(probe.figures(feed_s))
    print(server_errors(data))
    if proxy and "feed" in budget:
        landed = {name: len(ledger.arrived) for name, ledger in feeders.ledgers.items()}
        print(budget_report(proxy, budget, landed))
    print(f"load average at the end: {os.getloadavg()} on {os.cpu_count()} cores (shared machine: other work counts)")
    wrong = lost_total or doubles or extra_rows
    print("RESULT: " + ("FAILED: lost or duplicated data" if wrong else "nothing lost or duplicated"))
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
