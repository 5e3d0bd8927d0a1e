"""Crash-point sweeps: run a pipeline step in a child process that dies at write N, then let the product recover.

A sweep (see ``tests/test_crashpoints_*.py``):
1. ``count_writes`` runs the step once with the injector counting, which lists every write of a small run;
2. ``crash_points`` picks the points: all of them up to ``EXHAUSTIVE``, else a seeded sample that always keeps
   the first and last write of each kind;
3. for each point, ``run_child`` runs the step in a child process with ``PIPELINES_FAULT=N:kill:when``, and the
   test runs only what the product itself runs afterwards (maintenance flows, the documented re-run), then
   asserts the pipeline's invariants (docs/design.md, "Fault model").

The child is this file run as a script: ``python tests/helpers/crashpoints.py module:function JSON-kwargs``.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.core import faults

REPO_ROOT = Path(__file__).resolve().parents[2]
# up to this many writes every point is tried; above, a seeded sample of this size. By hand a sweep samples 3
# points per pipeline (the first and last write and one more); `make test-sweep` (CI runs it after `make test`)
# sets CRASHPOINTS_LIMIT=40: every write of every pipeline's run.
EXHAUSTIVE = int(os.environ.get("CRASHPOINTS_LIMIT", "3"))
SUMMARY: list[str] = []  # one line per sweep, printed at the end of the pytest run (tests/conftest.py)


@dataclass(frozen=True)
class Write:
    """One write of a counted run: its number, store (dynamodb/objects), operation and target."""

    number: int
    store: str
    operation: str
    target: str

    @property
    def kind(self) -> str:
        """What kind of write this is, for sampling: store, operation and table (or top-level key prefix)."""
        return faults.write_kind(self.store, self.operation, self.target)


def report(line: str) -> None:
    """A sweep's one-line summary (how many crash points it exercised), shown in pytest's closing summary."""
    SUMMARY.append(line.strip())
    print(line)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment (tables, endpoints, store) plus the Prefect API of the test server."""
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    if PREFECT_API_URL.value():
        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    env.pop("PIPELINES_FAULT", None)
    env.update(extra or {})
    return env


def run_child(
    call: str, kwargs: dict[str, Any], fault: str | None = None, log: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run ``module:function(**kwargs)`` in a child process, with the fault plan ``fault`` (e.g. ``7:kill:after``)."""
    extra = {}
    if fault:
        extra["PIPELINES_FAULT"] = fault
    if log:
        extra["PIPELINES_FAULT_LOG"] = str(log)
    return subprocess.run(
        child_command(call, kwargs),
        env=child_env(extra),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def child_command(call: str, kwargs: dict[str, Any]) -> list[str]:
    """The command line of a child that runs ``module:function(**kwargs)``."""
    return [sys.executable, __file__, call, json.dumps(kwargs)]


def start_child(call: str, kwargs: dict[str, Any], log: Path) -> subprocess.Popen:
    """Start ``module:function(**kwargs)`` in a child process (a listener, to be killed for real), output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            child_command(call, kwargs), env=child_env(), cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT
        )


def killed(result: subprocess.CompletedProcess) -> bool:
    """Whether the child died of the injected SIGKILL."""
    return result.returncode == -signal.SIGKILL


def count_writes(call: str, kwargs: dict[str, Any], log: Path) -> list[Write]:
    """Run the step once, counting: every write it makes, in order. The run must succeed."""
    log.unlink(missing_ok=True)
    result = run_child(call, kwargs, "count", log)
    assert result.returncode == 0, f"counting run failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    writes = []
    for line in log.read_text().splitlines() if log.exists() else []:
        number, store, operation, target = line.split("\t")
        writes.append(Write(int(number), store, operation, target))
    return writes


def report_crashed_runs() -> list[str]:
    """What a process worker does when its flow process dies without a final state: mark the run Crashed.

    Every flow run still Running or Pending on the test server is set Crashed (tests run one at a time)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        live = FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING])
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=live)))
        crashed = []
        for run in runs:
            try:
                client.set_flow_run_state(run.id, Crashed(message="flow process killed (crash-point test)"), force=True)
            except PrefectHTTPStatusError:  # an earlier test's run that holds a deployment concurrency lease: the
                continue  # 3.8 server fails releasing it (500); such a run is not this test's crash
            crashed.append(str(run.id))
    return crashed


def crash_points(writes: list[Write], limit: int = EXHAUSTIVE, seed: int = 0) -> list[int]:
    """Every write number when there are at most ``limit``; else ``limit`` of them: the run's first and last
    write, then the first and last of each kind, then a seeded sample of the rest."""
    numbers = [w.number for w in writes]
    if len(numbers) <= limit:
        return numbers
    rng = random.Random(seed)
    ends: list[int] = []
    by_kind: dict[str, list[int]] = {}
    for write in writes:
        by_kind.setdefault(write.kind, []).append(write.number)
    for kind_numbers in by_kind.values():
        ends.extend(n for n in (kind_numbers[0], kind_numbers[-1]) if n not in ends)
    chosen = {numbers[0], numbers[-1]}
    ends = [n for n in ends if n not in chosen]
    chosen.update(rng.sample(ends, min(len(ends), max(0, limit - len(chosen)))))
    rest = sorted(set(numbers) - chosen)
    chosen.update(rng.sample(rest, min(len(rest), max(0, limit - len(chosen)))))
    return sorted(chosen)


def _main(call: str, kwargs_json: str) -> None:
    module, function = call.split(":")
    result = getattr(importlib.import_module(module), function)(**json.loads(kwargs_json))
    print(json.dumps(result, default=str)[-2000:])


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    _main(sys.argv[1], sys.argv[2])
