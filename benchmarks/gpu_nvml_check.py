"""Print this machine's real NVML readings and the health verdict as JSON (seed 002 health check).

Runs without the rest of the project: it loads tasks/gpu_health.py by path (stdlib + nvidia-ml-py only).

    pip install nvidia-ml-py && python3 benchmarks/gpu_nvml_check.py [--xid-wait-ms 2000]

Exit code: 0 healthy, 1 unhealthy, 2 unknown (e.g. "no GPU").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

HEALTH = Path(__file__).resolve().parents[1] / "tasks" / "gpu_health.py"


def load_health():
    spec = importlib.util.spec_from_file_location("gpu_health", HEALTH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_health"] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xid-wait-ms", type=int, default=2000, help="how long to listen for XID critical events")
    args = parser.parse_args()
    health = load_health()
    result = health.nvml_check(args.xid_wait_ms)
    print(json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str))
    return {health.HEALTHY: 0, health.UNHEALTHY: 1}.get(result.status, 2)


if __name__ == "__main__":
    raise SystemExit(main())
