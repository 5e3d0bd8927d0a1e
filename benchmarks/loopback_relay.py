"""What keeping DynamoDB Local to loopback and to signed requests costs: conditional puts/s through the namespace
relay with its SigV4 door, as a ratio to the same relay without the door and to the jar reached directly (1 and 8
threads, interleaved round by round, one run).

    .venv/bin/python benchmarks/loopback_relay.py [--items 400] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import median, rate, timed

from deployments import dynamodb_keys
from deployments import dynamodb_local as ddb

# the relay with its door open (every request forwarded unchecked): this benchmark's baseline, never the stack's
UNCHECKED_RELAY = (
    "import sys; sys.path.insert(0, sys.argv[1]); from deployments import loopback_ns; "
    "loopback_ns.Door.check = lambda *_: None; raise SystemExit(loopback_ns.main(sys.argv[2:]))"
)


def puts(endpoint: str, table: str, items: int, threads: int) -> float:
    """Conditional puts/s of ``items`` new items over ``threads`` threads against ``endpoint``."""
    import boto3
    from botocore.config import Config

    client = boto3.client("dynamodb", endpoint_url=endpoint, config=Config(max_pool_connections=32))
    tag = uuid.uuid4().hex[:8]

    def put(numbers: range) -> None:
        for n in numbers:
            client.put_item(
                TableName=table, Item={"k": {"S": f"{tag}-{n}"}}, ConditionExpression="attribute_not_exists(k)"
            )

    def run() -> None:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(put, [range(i, items, threads) for i in range(threads)]))

    return rate(items, timed(run))


@contextlib.contextmanager
def door_open():
    """``ddb.start(..., loopback_only=True)`` starts the relay with its door open while this lasts."""
    checked = ddb.command

    def unchecked(port, db_path=None, loopback_only=False):
        args = checked(port, db_path, loopback_only)
        relay = args.index(str(Path(ddb.__file__).with_name("loopback_ns.py")))
        return [args[0], "-c", UNCHECKED_RELAY, str(Path(ddb.__file__).parents[1]), *args[relay + 1 :]]

    ddb.command = unchecked
    try:
        yield
    finally:
        ddb.command = checked


def start_all(logs: Path) -> dict[str, tuple[str, object]]:
    """The jar three ways: direct, behind the relay with its door open, behind the relay with its SigV4 door."""
    started = {}
    try:
        started["direct"] = ddb.start(port := ddb.free_port(), None, logs / "direct.log"), port
        with door_open():
            started["unchecked"] = ddb.start(port := ddb.free_port(), None, logs / "open.log", loopback_only=True), port
        started["checked"] = ddb.start(port := ddb.free_port(), None, logs / "checked.log", loopback_only=True), port
    except BaseException:
        for process, _ in started.values():
            ddb.stop(process)
        raise
    return {label: (f"http://127.0.0.1:{port}", process) for label, (process, port) in started.items()}


def main() -> None:
    """Start the jar three ways, measure, print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="150 items, one round")
    parser.add_argument("--items", type=int, default=400, help="puts per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the median is shown)")
    args = parser.parse_args()
    items, rounds = (150, 1) if args.quick else (args.items, args.rounds)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    dynamodb_keys.use_fresh_key()  # the key the checked relay checks (the environment it starts in)
    logs = Path(tempfile.mkdtemp(prefix="relay-bench-"))
    try:
        started = start_all(logs)
    except ddb.CannotIsolate as error:
        print(f"no private network namespace here ({error}): nothing to compare")
        return
    try:
        import boto3

        endpoints = {label: endpoint for label, (endpoint, _) in started.items()}
        for endpoint in endpoints.values():
            boto3.client("dynamodb", endpoint_url=endpoint).create_table(
                TableName="relay",
                KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
        results: dict[tuple[str, int], list[float]] = {}
        for endpoint in endpoints.values():  # warm-up: JIT, connections
            puts(endpoint, "relay", 50, 1)
        for _ in range(rounds):
            for threads in (1, 8):
                for label, endpoint in endpoints.items():
                    results.setdefault((label, threads), []).append(puts(endpoint, "relay", items, threads))
        for threads in (1, 8):
            direct, unchecked, checked = (median(results[(label, threads)]) for label in endpoints)
            print(
                f"{threads} thread(s): direct {direct:7.1f} puts/s, relay without the door {unchecked:7.1f}, "
                f"relay with the SigV4 door {checked:7.1f}  RATIO door / no door = {checked / unchecked:.3f}  "
                f"(relay with door / direct = {checked / direct:.3f})",
                flush=True,
            )
    finally:
        for _, process in started.values():
            ddb.stop(process)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
