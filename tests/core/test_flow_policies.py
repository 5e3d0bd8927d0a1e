"""Every flow's and task's run settings, pinned: the shared helpers in flows/policies.py change none of them."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from prefect import Flow, Task, flow_engine
from prefect.utilities.importtools import load_script_as_module

import flows
from flows.policies import HEAVY_RETRIES, TRANSIENT_RETRIES, pipeline_flow, retry_policy
from tasks.core.redact import REDACTED_LOGGERS, RedactingFilter
from tests.helpers.house import flow_modules

FLOW_MODULES = flow_modules()  # wherever the flows package's folders lie: a new pipeline's is here too
NOTIFY = ("notify_on_failure",)

# flow name -> (class, timeout_seconds, on_failure, on_crashed, on_cancellation hook names)
FLOWS: dict[str, dict[str, tuple]] = {
    "etl": {
        "ndjson-ingest": ("Flow", None, NOTIFY, NOTIFY, ()),
        "ndjson-merge": ("Flow", 172800.0, ("_fail_timed_out_merge",), NOTIFY, ()),
        "ndjson-flush-orphans": ("Flow", 600.0, NOTIFY, NOTIFY, ()),
        "ndjson-merge-breaker": ("Flow", 600.0, (), NOTIFY, ()),
        "ndjson-listen": ("Flow", None, NOTIFY, NOTIFY, ()),
    },
    "gpu": {
        "gpu-healthcheck": ("Flow", None, (), (), ()),
        "gpu-job": ("Flow", None, (), NOTIFY, ("_stop_on_cancel",)),
        "gpu-sweep": ("Flow", 600.0, NOTIFY, NOTIFY, ()),
        "gpu-node-healthcheck": ("Flow", 600.0, NOTIFY, NOTIFY, ()),
    },
    "health": {"pipeline-health": ("Flow", 600.0, NOTIFY, NOTIFY, ())},
    "phspectra_catalog": {"phspectra-survey-catalog": ("Flow", None, NOTIFY, NOTIFY, ())},
    "phspectra_survey": {
        "phspectra-fit-chunks": ("Flow", None, (), (), ()),
        "phspectra-survey": ("Flow", None, NOTIFY, NOTIFY, ()),
        "phspectra-sweep-stuck": ("Flow", 600.0, NOTIFY, NOTIFY, ()),
        "phspectra-listen": ("Flow", None, NOTIFY, NOTIFY, ()),
    },
    "records": {
        "records-ingest": ("CheckedFlow", None, NOTIFY, NOTIFY, ()),
        "records-listen": ("Flow", None, NOTIFY, NOTIFY, ()),
        "records-replay-dla": ("CheckedFlow", 600.0, NOTIFY, NOTIFY, ()),
        "records-reconcile": ("CheckedFlow", 600.0, NOTIFY, NOTIFY, ()),
        "records-prefect-state": ("CheckedFlow", None, NOTIFY, NOTIFY, ()),
    },
    "retention": {"pipelines-retention": ("Flow", 600.0, NOTIFY, NOTIFY, ())},
    "video": {
        "video-reassemble": ("Flow", None, NOTIFY, NOTIFY, ()),
        "video-process": ("Flow", None, NOTIFY, NOTIFY, ()),
        "video-sweep-stuck": ("Flow", 600.0, NOTIFY, NOTIFY, ()),
        "video-delete-cleanup": ("Flow", 600.0, NOTIFY, NOTIFY, ()),
        "video-listen": ("Flow", None, NOTIFY, NOTIFY, ()),
    },
}

NONE = (0, 0, "_None", None, None)  # no retries, no cache
# task name -> (retries, retry_delay_seconds, cache policy class, timeout_seconds, retry_condition_fn name)
TASKS: dict[str, dict[str, tuple]] = {
    "etl": {
        "list-landing": (2, [2, 10], "_None", None, None),
        "validate-files": NONE,
        "quarantine-files": (2, [2, 10], "_None", None, None),
        "track-and-batch-files": (2, [2, 10], "_None", 180.0, None),
        "claim-and-create-manifests": (2, [2, 10], "_None", 180.0, None),
        "find-orphaned-dates": (2, [2, 10], "_None", None, None),
        "retry-catalog-registrations": (2, [2, 10], "_None", None, None),
        "release-dead-claims": (2, [2, 10], "_None", None, None),
        "find-pending-manifests": (2, [2, 10], "_None", None, None),
        "record-metric": (2, [2, 10], "_None", None, None),
        "write-run-report": NONE,
        "dask-merge": (3, [60, 120, 240], "_None", None, "_capacity_error"),
        "batch-status-update": (2, [5, 10], "_None", 180.0, None),
        "wait-for-space": (2, [2, 10], "_None", None, None),
        "notify-failure": NONE,
        "track-landed-files": NONE,
    },
    "gpu": {
        "start-gpu-task": NONE,
        "register-nodes": NONE,
        "stop-other-tasks": NONE,
        "reboot-unhealthy-nodes": NONE,
        "restart-job": NONE,
        "start-tasks": NONE,
    },
    "health": {
        "check-health": (2, [5, 30], "CompoundCachePolicy", None, None),
        "dashboard": (2, [5, 30], "CompoundCachePolicy", None, None),
        "publish-readings": (2, [5, 30], "CompoundCachePolicy", None, None),
    },
    "phspectra_catalog": {"survey-status": NONE, "build-survey-catalog": NONE},
    "phspectra_survey": {
        "split-cube": NONE,
        "fit-chunk": (2, [2, 10], "_None", None, None),
        "slow-lane-refit": (2, [5, 30], "_None", None, None),
        "aggregate-run": NONE,
        "find-expired-leases": NONE,
        "complete-split": NONE,
        "give-up-run": NONE,
    },
    "records": {
        "ingest-messages": (2, [2, 10], "CompoundCachePolicy", None, None),
        "replay-dead-letters": (1, [5], "CompoundCachePolicy", None, None),
        "reconcile-records": (2, [5, 30], "CompoundCachePolicy", None, None),
    },
    "retention": {"apply-retention": (2, [10, 60], "CompoundCachePolicy", None, None)},
    "video": {
        "create-job": NONE,
        "import-source": (2, [2, 10], "_None", None, None),
        "open-job": (2, [2, 10], "_None", None, "_retry_unless_bad_input"),
        "chunk-source": (2, [2, 10], "_None", 900.0, "_retry_unless_bad_input"),
        "infer-segment": (2, [2, 10], "_None", 900.0, "_retry_unless_bad_input"),
        "fail-job": NONE,
        "wait-for-space": (2, [2, 10], "_None", None, None),
        "reassemble": (2, [2, 10], "_None", 900.0, "_retry_unless_bad_input"),
        "recover-stuck-job": (2, [2, 10], "_None", None, "_retry_unless_bad_input"),
        "cleanup-deleted-job": (2, [2, 10], "_None", None, None),
    },
}


def _names(hooks: list[Any]) -> tuple[str, ...]:
    return tuple(hook.__name__ for hook in hooks)


def flow_settings(module: Any) -> dict[str, tuple]:
    """The module's own flows (not those it imports): name -> class, timeout and hook names."""
    flows = [obj for obj in vars(module).values() if isinstance(obj, Flow) and obj.fn.__module__ == module.__name__]
    return {
        f.name: (
            type(f).__name__,
            f.timeout_seconds,
            _names(f.on_failure_hooks),
            _names(f.on_crashed_hooks),
            _names(f.on_cancellation_hooks),
        )
        for f in flows
    }


def _module_tasks(module: Any) -> list[Task]:
    """Tasks bound at module level, also as fields of a module-level dataclass (gpu's ``TASKS`` steps)."""
    found = []
    for obj in vars(module).values():
        if isinstance(obj, Task):
            found.append(obj)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            found += [v for v in vars(obj).values() if isinstance(v, Task)]
    return found


def task_settings(module: Any) -> dict[str, tuple]:
    """The module's tasks: name -> retries, delays, cache policy class, timeout and retry condition's name."""
    return {
        t.name: (
            t.retries,
            t.retry_delay_seconds,
            type(t.cache_policy).__name__,
            t.timeout_seconds,
            getattr(t.retry_condition_fn, "__name__", None),
        )
        for t in _module_tasks(module)
    }


def test_every_pinned_flow_module_is_found():
    assert set(FLOWS) == set(TASKS) and set(FLOWS) <= set(FLOW_MODULES)


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_every_flow_keeps_its_name_timeout_and_hooks(name):
    module = importlib.import_module(f"flows.{name}")
    assert flow_settings(module) == FLOWS[name]
    assert all(obj.log_prints for obj in vars(module).values() if isinstance(obj, Flow))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_keeps_its_retries_delays_cache_and_timeout(name):
    module = importlib.import_module(f"flows.{name}")
    assert task_settings(module) == TASKS[name]


def test_the_retry_policies_give_one_delay_per_retry_as_lists():
    assert dict(TRANSIENT_RETRIES) == {"retries": 2, "retry_delay_seconds": [2, 10]}
    assert dict(HEAVY_RETRIES) == {"retries": 2, "retry_delay_seconds": [5, 30]}
    assert dict(retry_policy(5)) == {"retries": 1, "retry_delay_seconds": [5]}
    with pytest.raises(TypeError):
        TRANSIENT_RETRIES["retries"] = 5  # type: ignore[index]  # shared by many tasks: read-only


def test_pipeline_flow_takes_the_timeout_from_limits_unless_given_and_runs_extra_hooks_first():
    def own_hook(flow, flow_run, state) -> None:
        """A flow's own failure hook."""

    def body() -> None:
        """A flow body."""

    maintenance = pipeline_flow("pipeline-health", on_failure=[own_hook])(body)
    assert maintenance.timeout_seconds == 600.0 and maintenance.log_prints
    assert _names(maintenance.on_failure_hooks) == ("own_hook", "notify_on_failure")
    explicit = pipeline_flow("pipeline-health", alert="crashed", timeout_seconds=5)(body)
    assert explicit.timeout_seconds == 5.0 and _names(explicit.on_failure_hooks) == ()
    subflow = pipeline_flow("some-subflow", alert=None)(body)
    assert (subflow.timeout_seconds, subflow.on_failure_hooks, subflow.on_crashed_hooks) == (None, [], [])


@pytest.mark.parametrize("name", FLOW_MODULES)
def test_a_flow_module_loaded_by_path_as_a_worker_loads_it_runs_the_preamble(name, monkeypatch):
    """Prefect's worker imports ``flows/<name>.py`` by path under another module name, so a preamble in the
    package's import would not do: the heartbeat fix and the redacted run logs come with every flow declared."""

    def joining_heartbeats(engine, join_on_exit: bool = True):
        """Stands for Prefect's own heartbeat context (not yet fixed)."""

    monkeypatch.setattr(flow_engine, "_send_heartbeats", joining_heartbeats)
    for logger_name in REDACTED_LOGGERS:
        monkeypatch.setattr(logging.getLogger(logger_name), "filters", [])
    path = Path(flows.__file__).parent / f"{name}.py"
    before = set(sys.modules)
    try:
        module = load_script_as_module(str(path))
    finally:  # the copy loaded by path goes: its name is the file's, or Prefect's own for a name already taken
        for added in (set(sys.modules) - before) & {name} | {
            m for m in sys.modules if m.startswith("__prefect_loader_")
        }:
            sys.modules.pop(added)
    assert any(isinstance(obj, Flow) for obj in vars(module).values())
    assert getattr(flow_engine._send_heartbeats, "quick_exit", False)
    for logger_name in REDACTED_LOGGERS:
        assert any(isinstance(f, RedactingFilter) for f in logging.getLogger(logger_name).filters), logger_name


def test_flow_modules_declare_flows_only_through_pipeline_flow():
    """The preamble runs in ``pipeline_flow``: a flow declared with Prefect's own ``flow`` would load without it."""
    own = []
    for name in FLOW_MODULES:
        tree = ast.parse((Path(flows.__file__).parent / f"{name}.py").read_text())
        for node in ast.walk(tree):
            imported = isinstance(node, ast.ImportFrom) and node.module == "prefect"
            if imported and any(alias.name == "flow" for alias in node.names):
                own.append(f"{name}: from prefect import flow")
            if isinstance(node, ast.Attribute) and node.attr == "flow" and getattr(node.value, "id", "") == "prefect":
                own.append(f"{name}: prefect.flow")
    assert own == []
