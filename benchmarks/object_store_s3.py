"""S3 object-store transfers: multipart streamed uploads/downloads vs reading the object whole, in the same run.

    .venv/bin/python benchmarks/object_store_s3.py           # 128 MiB object, ~1 min
    .venv/bin/python benchmarks/object_store_s3.py --quick   # 32 MiB, ~15 s

Against moto's S3 server on loopback (the S3 API of the tests; its speed is not AWS's, so the throughput
ratio says little about AWS, the memory ratio says everything): ``S3Store.put_file`` / ``download`` (multipart,
parts of OBJECT_STORE_MULTIPART_MB) vs the baseline ``put_object(Body=whole bytes)`` /
``get_object()["Body"].read()``. Peak memory is what Python allocated (tracemalloc) in a separate pass.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import rate

MiB = 1024 * 1024


def measure(call) -> tuple[float, int]:
    """(seconds of one call, peak bytes Python allocated in a second call)."""
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    try:
        call()
        return seconds, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    """Run the four transfers and print MB/s, peak memory and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mib", type=int, default=0, help="object size in MiB (default 128, --quick 32)")
    args = parser.parse_args()
    size = (args.mib or (32 if args.quick else 128)) * MiB
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "local"),
        ("AWS_SECRET_ACCESS_KEY", "local"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)

    from tasks.core.object_store import ObjectStore, multipart_bytes
    from tests.helpers.s3 import moto_server, new_bucket

    with tempfile.TemporaryDirectory() as tmp, moto_server(Path(tmp) / "moto.log") as endpoint:
        os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
        source = Path(tmp) / "object.bin"
        with open(source, "wb") as handle:
            for _ in range(size // MiB):
                handle.write(os.urandom(64) * (MiB // 64))
        store = ObjectStore.from_url(f"s3://{new_bucket(endpoint)}/bench")
        client, bucket = store._client, store.bucket

        results = {
            "upload, multipart streamed (put_file)": measure(lambda: store.put_file("a.bin", source)),
            "upload, whole bytes (put_object)": measure(
                lambda: client.put_object(Bucket=bucket, Key="bench/b.bin", Body=source.read_bytes())
            ),
            "download, ranged parts to disk (download)": measure(lambda: store.download("a.bin", Path(tmp) / "a.out")),
            "download, whole bytes (get_object.read)": measure(
                lambda: (Path(tmp) / "b.out").write_bytes(
                    client.get_object(Bucket=bucket, Key="bench/b.bin")["Body"].read()
                )
            ),
        }
        for copy in ("a.out", "b.out"):  # a transfer that is fast but wrong fails the benchmark
            if (Path(tmp) / copy).read_bytes() != source.read_bytes():
                raise SystemExit(f"FAILED: the downloaded {copy} differs from the uploaded object")
    print(f"object {size // MiB} MiB, parts of {multipart_bytes() // MiB} MiB, moto S3 on loopback")
    for name, (seconds, peak) in results.items():
        print(f"  {name:45} {rate(size / MiB, seconds):8.1f} MiB/s   peak Python memory {peak / MiB:8.1f} MiB")
    (up, up_mem), (up0, up0_mem), (down, down_mem), (down0, down0_mem) = results.values()
    print(f"upload:   speed x{up0 / up:.2f} of the baseline, memory x{up_mem / up0_mem:.3f} of the baseline")
    print(f"download: speed x{down0 / down:.2f} of the baseline, memory x{down_mem / down0_mem:.3f} of the baseline")


if __name__ == "__main__":
    main()
