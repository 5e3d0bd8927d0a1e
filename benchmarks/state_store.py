"""Conditional puts/s and claims/s (1 and 8 threads) against DynamoDB Local, as ratios to plain put_item.

    .venv/bin/python benchmarks/state_store.py [--items 600] [--rounds 3]

The baseline (plain boto3 unconditional put_item, same table, same thread count) is measured in the same run,
interleaved round by round, so machine noise hits both sides alike.
"""

from __future__ import annotations

import argparse
import uuid
from concurrent.futures import ThreadPoolExecutor

from _common import dynamodb_local, median, rate, timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.items, args.rounds = 200, 1

    with dynamodb_local():
        from _common import ensure_table  # dropped again at the end

        from tasks.core import state_store as store
        from tasks.core.registry import table_specs

        name = f"bench-{uuid.uuid4().hex[:6]}"
        ensure_table(name, table_specs()["etl_file_tracking"])
        results: dict[str, list[float]] = {}
        import boto3

        plain_table = boto3.resource("dynamodb").Table(name)  # the baseline: plain boto3, none of the project's code

        def record(label: str, seconds: float, count: int) -> None:
            results.setdefault(label, []).append(rate(count, seconds))

        def split(items, threads):
            return [items[i::threads] for i in range(threads)]

        def run_threads(threads, fn, items):
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(fn, split(items, threads)))

        for rnd in range(args.rounds):
            for threads in (1, 8):
                tag = f"{rnd}-{threads}"
                keys = [{"date_prefix": tag, "file_key": f"f{i:05d}"} for i in range(args.items)]
                plain = [{**k, "status": "pending#0", "rnd": "plain"} for k in keys]

                def plain_puts(chunk):
                    for item in chunk:
                        plain_table.put_item(Item=item)

                def conditional_puts(chunk):
                    for item in chunk:
                        store.create_if_absent(
                            name, {**item, "file_key": item["file_key"] + "c"}, ["date_prefix", "file_key"]
                        )

                def claims(chunk, tag=tag):
                    for item in chunk:  # one guarded claim per request (the contended race is in the tests)
                        store.transition(
                            name, {"date_prefix": tag, "file_key": item["file_key"]}, "pending#0", "manifested#0"
                        )

                def bulk_claims(chunk, tag=tag):
                    store.transition_many(
                        name,
                        [
                            ({"date_prefix": tag, "file_key": i["file_key"] + "c"}, "pending#0", "manifested#0", None)
                            for i in chunk
                        ],
                    )

                record(f"put_item x{threads}", timed(run_threads, threads, plain_puts, plain), args.items)
                record(f"create_if_absent x{threads}", timed(run_threads, threads, conditional_puts, plain), args.items)
                record(f"transition (claim) x{threads}", timed(run_threads, threads, claims, plain), args.items)
                record(
                    f"transition_many (claim) x{threads}", timed(run_threads, threads, bulk_claims, plain), args.items
                )

        print(f"{'operation':34} {'ops/s (median)':>15} {'ratio to put_item':>18}")
        for label, rates in results.items():
            threads = label.rsplit("x", 1)[1]
            baseline = median(results[f"put_item x{threads}"])
            print(f"{label:34} {median(rates):15.0f} {median(rates) / baseline:18.2f}")


if __name__ == "__main__":
    main()
