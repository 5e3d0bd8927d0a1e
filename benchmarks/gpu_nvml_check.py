"""Print this machine's real NVML readings and the health verdict as JSON (seed 002 health check).

Needs the project's tasks/gpu/health.py (stdlib + nvidia-ml-py) beside it.

    pip install nvidia-ml-py && python3 benchmarks/gpu_nvml_check.py [--xid-wait-ms 2000] [--quick]

Exit code: 0 healthy, 1 unhealthy, 2 unknown (e.g. "no GPU").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_health():
    """The GPU health checks (tasks/gpu/health.py: stdlib + nvidia-ml-py, and the project's clock helper)."""
    from tasks.gpu import health

    return health


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xid-wait-ms", type=int, default=2000, help="how long to listen for XID critical events")
    parser.add_argument("--quick", action="store_true", help="listen for XID events 200 ms")
    args = parser.parse_args()
    if args.quick:
        args.xid_wait_ms = 200
    health = load_health()
    result = health.nvml_check(args.xid_wait_ms)
    print(json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str))
    return {health.HEALTHY: 0, health.UNHEALTHY: 1}.get(result.status, 2)


if __name__ == "__main__":
    raise SystemExit(main())
