"""The upgrade test's feed, a process of its own on the stack's environment (tests/stack/test_upgrade_in_place.py): the
soak's feeders (ETL files, a video now and then, records messages, cubes) for ``--feed-s`` seconds, then the hourly
flush, then the checks until every item is done or ``--drain-s`` has passed; one JSON result on ``--out``.

The stack's `up` rotates its keys mid-feed: each check reads the stack's local.env again (DynamoDB's key; the
previous one stays valid for its grace period, and a stack from before signed requests had none), and the flush is a
process of its own started with the environment of the moment.

    python -m tests.helpers.upgrade_feed --data DATA --work WORK --feed-s 100 --drain-s 200 --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# what a stack's local.env leaves out when it is older than the stack's own key (v0.1.0's Makefile exported these)
UNSIGNED_DEFAULTS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": "us-east-1"}


def stack_env(data: Path) -> dict[str, str]:
    """The stack's local.env as a mapping (``export NAME=value`` lines)."""
    import shlex

    env = {}
    for line in (data / "local.env").read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0] if value else ""
    return env


def load_env(data: Path) -> None:
    """This process's environment from the stack's local.env, its clients made again."""
    import boto3

    from blocks.base import clear_cache
    from tasks.core import state_store

    os.environ.update({**UNSIGNED_DEFAULTS, **stack_env(data)})
    boto3.DEFAULT_SESSION = None  # its credentials were read from the environment once: read them again
    clear_cache()
    state_store.reset_clients()


def run_in_stack(data: Path, code: str, check: bool = False) -> subprocess.CompletedProcess:
    """Python ``code`` in a process of its own on the stack's environment of the moment (its keys rotate)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **UNSIGNED_DEFAULTS, **stack_env(data)},
        capture_output=True,
        text=True,
        timeout=300,
        check=check,
    )


def flush(data: Path) -> str:
    """One run of the hourly ``ndjson-flush-orphans`` (the feed's last partial batch), with the env of the moment."""
    code = (
        "from prefect.deployments import run_deployment\n"
        "print(run_deployment('ndjson-flush-orphans/local', timeout=0).id)"
    )
    try:
        result = run_in_stack(data, code)
    except subprocess.TimeoutExpired:
        return "not started in 300 s"
    return result.stdout.strip() or result.stderr[-500:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--feed-s", type=float, default=100)
    parser.add_argument("--drain-s", type=float, default=200)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    load_env(args.data)
    from benchmarks.soak import Feeders

    rates = argparse.Namespace(
        etl_rate=1.0,
        etl_lines=1200,  # ~150 KB: inside the expected size ± tolerance (a smaller file is quarantined)
        etl_mb=0.0,
        etl_mb_spread=0.99,
        etl_delete_merged=False,
        video_every=60.0,
        records_every=20.0,
        records=5,
        cube_every=80.0,
    )
    feeders = Feeders(args.work, rates)
    env_stamp = (args.data / "local.env").stat().st_mtime
    threads = feeders.start()
    began = time.time()
    flushed = None
    while True:
        try:
            if (args.data / "local.env").stat().st_mtime != env_stamp:  # an `up` rotated the keys
                env_stamp = (args.data / "local.env").stat().st_mtime
                load_env(args.data)
        except (OSError, ValueError, IndexError) as error:  # written at this instant: read it at the next check
            print(f"local.env not read: {type(error).__name__}: {error}", flush=True)
        if not feeders.stop.is_set() and time.time() - began >= args.feed_s:
            feeders.stop.set()
            for thread in threads:
                thread.join(60)
            print(f"feed stopped after {time.time() - began:.0f} s", flush=True)
        if feeders.stop.is_set() and flushed is None:  # until it starts: the server may be restarting
            started = flush(args.data)
            flushed = started if len(started) == 36 else None  # a flow run's id, else the error's tail
            print(f"flush run: {started}", flush=True)
        try:
            feeders.check()
        except Exception as error:  # noqa: BLE001 - a stack mid-swap answers late: the next check reads it
            print(f"check failed: {type(error).__name__}: {error}", flush=True)
        progress = {name: len(ledger.done) for name, ledger in feeders.ledgers.items()}
        (args.out.parent / "progress.json").write_text(json.dumps(progress))  # the test swaps once work is done
        waiting = sum(len(ledger.waiting()) for ledger in feeders.ledgers.values())
        if flushed is not None and (not waiting or time.time() - began > args.feed_s + args.drain_s):
            break
        time.sleep(3)
    doubles, rows, expected_rows = feeders.etl_duplicates()
    result = {
        name: {"arrived": ledger.arrived, "done": ledger.done, "failed": ledger.failed}
        for name, ledger in feeders.ledgers.items()
    }
    result["etl_duplicates"] = {"files_in_two_manifests": doubles, "rows": rows, "expected_rows": expected_rows}
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
