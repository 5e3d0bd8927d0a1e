"""Records written per second with the seed 004 guards vs unguarded puts, in the same run.

    .venv/bin/python benchmarks/records.py           # ~1-3 min
    .venv/bin/python benchmarks/records.py --quick   # ~20 s smoke run

Pairs, each measured on fresh granule ids against the same in-memory DynamoDB Local:
- bulk: ``records.write_many`` (guarded UpdateItems in transactions of 100) vs plain boto3's ``batch_writer``
  (unguarded BatchWriteItem of 25);
- bulk running writes: of new granules (Cumulus's upsert inserts them: one item each), and over existing granules
  (the insert is refused, then the guarded update with its execution's ConditionCheck: two requests per record);
- bulk stale writes (every condition fails: cancelled transactions, reasons returned) vs the same puts;
- single: ``records.write`` one record per request vs plain boto3 ``put_item``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dynamodb_local, rate


def granule(i: int, tag: str, status: str = "completed", created: int = 2000) -> dict:
    return {
        "granuleId": f"{tag}-{i:06d}",
        "collectionId": "MOD09GQ___006",
        "status": status,
        "execution": f"arn:aws:states:us-east-1:1:execution:Ingest:{tag}-{i:06d}",
        "createdAt": created,
        "timestamp": 1,
        "updatedAt": 1,
        "files": [{"fileName": f"f{i}.hdf", "size": 100}],
        "productVolume": 100,
        "published": False,
        "error": {},
    }


def measure(fn, count: int) -> float:
    start = time.perf_counter()
    fn()
    return rate(count, time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~20 s smoke run")
    parser.add_argument("--bulk", type=int, default=None, help="records per bulk measurement")
    parser.add_argument("--single", type=int, default=None, help="records per single-request measurement")
    parser.add_argument("--repeat", type=int, default=None, help="rounds (ranges are reported)")
    args = parser.parse_args()
    bulk = args.bulk or (200 if args.quick else 2000)
    single = args.single or (40 if args.quick else 300)
    repeat = args.repeat or (1 if args.quick else 3)

    with dynamodb_local():
        os.environ["PIPELINES_USE_BLOCKS"] = "0"
        suffix = uuid.uuid4().hex[:6]
        os.environ["TABLE_GRANULES"] = f"bench-granules-{suffix}"
        os.environ["TABLE_EXECUTIONS"] = f"bench-executions-{suffix}"
        from _common import ensure_table  # dropped again at the end

        from tasks.core.registry import table_specs
        from tasks.records import rules as records
        from tasks.records.rules import GRANULE

        ensure_table(os.environ["TABLE_GRANULES"], table_specs()["granules"])
        ensure_table(os.environ["TABLE_EXECUTIONS"], table_specs()["executions"])
        table = os.environ["TABLE_GRANULES"]
        import boto3

        plain = boto3.resource("dynamodb").Table(table)  # the baseline: plain boto3, none of the project's code

        def batch_put(items: list[dict]) -> None:
            with plain.batch_writer() as writer:
                for item in items:
                    writer.put_item(Item=item)

        # warm DynamoDB Local's JIT on both paths first (untimed): the first requests are several times slower
        records.write_many(GRANULE, [granule(i, "warm-g") for i in range(100)], table)
        batch_put([granule(i, "warm-u") for i in range(100)])
        results: dict[str, list[float]] = {}

        def add(name: str, value: float) -> None:
            results.setdefault(name, []).append(value)

        for round_ in range(repeat):
            tag = f"r{round_}"
            g = [granule(i, f"{tag}g") for i in range(bulk)]
            u = [granule(i, f"{tag}u") for i in range(bulk)]
            add("bulk guarded (write_many)", measure(lambda g=g: records.write_many(GRANULE, g, table), bulk))
            add("bulk unguarded (batch_put)", measure(lambda u=u: batch_put(u), bulk))
            r = [granule(i, f"{tag}r", status="running") for i in range(bulk)]
            add("bulk guarded running, new (insert)", measure(lambda r=r: records.write_many(GRANULE, r, table), bulk))
            again = [dict(x, createdAt=3000) for x in r]
            add(
                "bulk guarded running, existing (+ check)",
                measure(lambda again=again: records.write_many(GRANULE, again, table), bulk),
            )
            old = [dict(x, createdAt=1000) for x in g]
            verdicts = []
            add(
                "bulk guarded, all stale",
                measure(
                    lambda verdicts=verdicts, old=old: verdicts.extend(records.write_many(GRANULE, old, table)), bulk
                ),
            )
            assert {v.verdict.value for v in verdicts} == {"stale"}, "stale writes must all be dropped"
            sg = [granule(i, f"{tag}sg") for i in range(single)]
            su = [granule(i, f"{tag}su") for i in range(single)]
            add("single guarded (write)", measure(lambda sg=sg: [records.write(GRANULE, x, table) for x in sg], single))
            add("single unguarded (put)", measure(lambda su=su: [plain.put_item(Item=x) for x in su], single))

        def span(name: str) -> str:
            values = results[name]
            return f"{min(values):8.0f} - {max(values):8.0f}" if len(values) > 1 else f"{values[0]:8.0f}"

        print(f"records/s (bulk {bulk}, single {single}, rounds {repeat}; min - max)")
        for name in results:
            print(f"  {name:42s} {span(name)}")

        def ratio(a: str, b: str) -> str:
            values = [x / y for x, y in zip(results[a], results[b])]
            return f"{min(values):.2f}" if len(values) == 1 else f"{min(values):.2f} - {max(values):.2f}"

        print(
            "ratio bulk guarded / unguarded:          "
            f"{ratio('bulk guarded (write_many)', 'bulk unguarded (batch_put)')}"
        )
        print(
            "ratio bulk running new / unguarded:      "
            f"{ratio('bulk guarded running, new (insert)', 'bulk unguarded (batch_put)')}"
        )
        print(
            "ratio bulk running existing / unguarded: "
            f"{ratio('bulk guarded running, existing (+ check)', 'bulk unguarded (batch_put)')}"
        )
        print(
            f"ratio bulk all-stale / unguarded:        {ratio('bulk guarded, all stale', 'bulk unguarded (batch_put)')}"
        )
        print(f"ratio single guarded / unguarded:        {ratio('single guarded (write)', 'single unguarded (put)')}")


if __name__ == "__main__":
    main()
