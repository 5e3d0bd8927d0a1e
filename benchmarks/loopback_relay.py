"""What keeping DynamoDB Local to loopback costs: conditional puts/s through the namespace relay, as a ratio to the
same jar reached directly (1 and 8 threads, interleaved round by round).

    .venv/bin/python benchmarks/loopback_relay.py [--items 400] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import median, rate, timed

from deployments import dynamodb_local as ddb


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


def main() -> None:
    """Start the jar both ways, measure, print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="150 items, one round")
    parser.add_argument("--items", type=int, default=400, help="puts per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the median is shown)")
    args = parser.parse_args()
    items, rounds = (150, 1) if args.quick else (args.items, args.rounds)
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "local"),
        ("AWS_SECRET_ACCESS_KEY", "local"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)
    logs = Path(tempfile.mkdtemp(prefix="relay-bench-"))
    direct_port, relay_port = ddb.free_port(), ddb.free_port()
    processes = [ddb.start(direct_port, None, logs / "direct.log")]  # the baseline: the jar reached directly
    try:
        processes.append(ddb.start(relay_port, None, logs / "relay.log", loopback_only=True))
    except ddb.CannotIsolate as error:
        ddb.stop(processes[0])
        print(f"no private network namespace here ({error}): nothing to compare")
        return
    try:
        import boto3

        endpoints = {"direct": f"http://127.0.0.1:{direct_port}", "relay": f"http://127.0.0.1:{relay_port}"}
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
            direct, relay = median(results[("direct", threads)]), median(results[("relay", threads)])
            print(
                f"{threads} thread(s): direct {direct:7.1f} puts/s, through the loopback relay {relay:7.1f} puts/s  "
                f"RATIO relay / direct = {relay / direct:.3f}"
            )
    finally:
        for process in processes:
            ddb.stop(process)


if __name__ == "__main__":
    main()
