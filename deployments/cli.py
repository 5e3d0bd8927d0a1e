"""`pipelines` — the operations CLI. Each pipeline adds a subcommand group in ``deployments/ops/<name>.py``.

Output is JSON lines or tables on stdout; errors are one clear line on stderr and exit code 2.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from decimal import Decimal

import deployments.ops as ops
from tasks.core.release import VERSION


def _default(value):
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


def emit(value) -> None:
    """Print a result as indented JSON (Decimals as numbers)."""
    print(json.dumps(value, indent=2, default=_default, sort_keys=True))


def build_parser() -> ops.Parser:
    """The ``pipelines`` parser, with each ``deployments/ops`` module's subcommand group."""
    parser = ops.Parser(prog="pipelines", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"pipelines {VERSION}")
    groups = parser.add_subparsers(dest="group", required=True)
    for module in pkgutil.iter_modules(ops.__path__):
        importlib.import_module(f"{ops.__name__}.{module.name}").register(groups)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand and print its result as JSON; on an error, one line on stderr and exit code 2."""
    args = build_parser().parse_args(argv)
    try:
        result = args.handler(args)
    except (ValueError, LookupError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if result is not None:
        emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
