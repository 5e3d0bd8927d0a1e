"""Benchmarks cannot rot: every one has a ``--quick`` mode, and each quick run ends with exit code 0.

A benchmark exits non-zero on a wrong result (lost or duplicated data, a count that differs from its baseline's,
a crash), never on a slow one; the quick runs are `make test-sweep`'s (they start DynamoDB Local, Prefect servers
and local stacks of their own). GPU-only benchmarks exit 2 when no GPU is usable: skipped then.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))
GPU_ONLY = {"gpu_nvml_check.py", "video_gpu.py"}  # exit 2: no usable GPU
QUICK_TIMEOUT_S = {"soak.py": 1500, "video.py": 1200, "phspectra_fit.py": 900}
# benchmarks whose quick run a sweep test makes already, with assertions of its own (a whole stack each: minutes):
# server_load.py's measure() is tests/stack/test_server_load.py's
RUN_ELSEWHERE = {"server_load.py"}
# endpoints and tables of the test session's own stack: each benchmark starts and names its own
SESSION_ENV = re.compile(r"^(AWS_ENDPOINT_URL|PREFECT_API_URL$|TABLE_|OBJECT_STORE_BASE_URL$|PIPELINES_)")


def test_every_benchmark_has_a_quick_mode():
    missing = [name for name in BENCHMARKS if '"--quick"' not in (ROOT / "benchmarks" / name).read_text()]
    assert not missing, f"benchmarks without a --quick mode (make test-sweep runs each one's): {missing}"


@pytest.mark.sweep
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", [name for name in BENCHMARKS if name not in RUN_ELSEWHERE])
def test_quick_run_ends_without_a_wrong_result(name):
    env = {k: v for k, v in os.environ.items() if not SESSION_ENV.match(k)}
    timeout = QUICK_TIMEOUT_S.get(name, 600)
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
    if name in GPU_ONLY and result.returncode == 2:
        pytest.skip(f"no usable GPU: {tail.splitlines()[-1] if tail else ''}")
    assert result.returncode == 0, f"{name} --quick exited {result.returncode}:\n{tail}"
