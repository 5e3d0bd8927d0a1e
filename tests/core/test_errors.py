"""The pipelines' errors form one hierarchy (tasks/core/errors.py): every class the code defines descends from
PipelineError, sits in at most one family, keeps the builtin base its callers catch, and callers catch a family."""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
from pathlib import Path

import pytest

from tasks.core.errors import LostRace, PipelineError, RefusedInput, Unavailable
from tests.helpers import house

FAMILIES = (RefusedInput, LostRace, Unavailable)

# each class by its module -> (its family or None for the root alone, the builtin base its callers catch)
EXPECTED = {
    "deployments.dynamodb_local.StackError": (None, RuntimeError),
    "deployments.dynamodb_local.CannotIsolate": (None, RuntimeError),
    "flows.records.UnservableParameters": (RefusedInput, ValueError),
    "tasks.core.faults.InjectedFault": (None, RuntimeError),
    "tasks.core.keys.InvalidKey": (RefusedInput, ValueError),
    "tasks.core.notify.DeliveryError": (Unavailable, RuntimeError),
    "tasks.core.object_store.ObjectNotFound": (None, FileNotFoundError),
    "tasks.core.private_folder.NotPrivate": (None, PermissionError),
    "tasks.core.migrations.LayoutMismatch": (None, RuntimeError),
    "tasks.core.state_store.IndexNotReady": (Unavailable, RuntimeError),
    "tasks.core.seal.LaunchKeyMissing": (Unavailable, RuntimeError),
    "tasks.core.seal.SealBroken": (RefusedInput, ValueError),
    "tasks.core.tables.SchemaMismatch": (None, RuntimeError),
    "tasks.etl.ingest.MergesHeld": (Unavailable, RuntimeError),
    "tasks.gpu.backends.BackendError": (Unavailable, RuntimeError),
    "tasks.gpu.backends.CommandRefused": (RefusedInput, ValueError),
    "tasks.gpu.jobs.NotEnoughNodes": (Unavailable, RuntimeError),
    "tasks.landing.sqs.PoisonMessage": (RefusedInput, ValueError),
    "tasks.phspectra.landing.InvalidManifest": (RefusedInput, ValueError),
    "tasks.phspectra.worker.SpectrumTimeout": (None, Exception),
    "tasks.phspectra.worker.WorkerDied": (Unavailable, RuntimeError),
    "tasks.phspectra.worker.FitStopped": (LostRace, RuntimeError),
    "tasks.records.cmr.CmrFileError": (RefusedInput, ValueError),
    "tasks.records.messages.MessageError": (RefusedInput, ValueError),
    "tasks.records.rules.Unwritable": (RefusedInput, ValueError),
    "tasks.video.ffmpeg.InvalidMedia": (RefusedInput, ValueError),
    "tasks.video.ffmpeg.FfmpegError": (None, RuntimeError),
    "tasks.video.ffmpeg.FfmpegRefused": (RefusedInput, RuntimeError),
    "tasks.video.inference.InferenceError": (None, RuntimeError),
    "tasks.video.inference.InferenceRefused": (RefusedInput, RuntimeError),
    "tasks.video.inference.GpuUnavailable": (Unavailable, RuntimeError),
    "tasks.video.inference._RedirectRefused": (None, Exception),
    "tasks.video.jobs.JobFailed": (None, RuntimeError),
    "tasks.video.jobs.SourceRefused": (RefusedInput, ValueError),
}


def defined_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class a module of ours defines at its top level, by ``module.Class``, found by importing them."""
    found = {}
    for name in sorted(house.modules()):
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name:
                found[f"{name}.{attr}"] = value
    return found


def test_every_exception_class_of_ours_descends_from_pipeline_error():
    found = defined_exceptions()
    unrooted = sorted(name for name, cls in found.items() if not issubclass(cls, PipelineError))
    assert not unrooted, f"{unrooted}: base them on a family of tasks/core/errors.py (or PipelineError)"
    assert set(EXPECTED) <= set(found)  # the discovery sees every class the table names


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_class_sits_in_its_family_and_keeps_its_builtin_base(name):
    module, _, attr = name.rpartition(".")
    cls = getattr(importlib.import_module(module), attr)
    family, builtin = EXPECTED[name]
    assert issubclass(cls, PipelineError) and issubclass(cls, builtin)
    assert [f for f in FAMILIES if issubclass(cls, f)] == ([family] if family else [])


def test_a_refused_input_is_a_value_error_and_the_families_are_apart():
    assert issubclass(RefusedInput, ValueError)
    assert not any(issubclass(a, b) for a in FAMILIES for b in FAMILIES if a is not b)


def test_the_errors_module_imports_nothing_of_the_project():
    source = Path(importlib.import_module("tasks.core.errors").__file__).read_text()
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert set(imported) <= {"__future__"}


class OddUpload(RefusedInput):
    """A refusal no landing handler names: caught as the family."""


def test_a_landing_handler_sets_aside_any_refused_input_and_offers_again_what_failed_otherwise(caplog):
    from tasks.landing.pipelines import handle_each
    from tasks.landing.sources import Arrival

    arrivals = [Arrival(f"file:///landing/{n}", n, 1, "2026-01-01T00:00:00+00:00", n) for n in ("ok", "odd", "down")]

    def start(arrival: Arrival) -> tuple[str, list[str]]:
        if arrival.key == "odd":
            raise OddUpload("no frames in the upload")
        if arrival.key == "down":
            raise ConnectionError("DynamoDB did not answer")
        return "started", []

    with caplog.at_level(logging.WARNING):
        outcome = handle_each(arrivals, "video", start)
    assert outcome.done == arrivals[:2]  # the refused one is done: a redelivery cannot change it
    assert outcome.retry == [(arrivals[2], "ConnectionError: DynamoDB did not answer")]
    assert "ignored file:///landing/odd: no frames in the upload" in caplog.text


def test_the_video_tasks_never_retry_a_refused_input_and_retry_a_transient_ffmpeg_or_backend_failure():
    from flows.video import FINAL_ERRORS
    from tasks.core.keys import InvalidKey
    from tasks.video import ffmpeg, inference, jobs

    final = [InvalidKey, ffmpeg.InvalidMedia, ffmpeg.FfmpegRefused, inference.InferenceRefused, jobs.SourceRefused]
    assert all(isinstance(cls("x"), FINAL_ERRORS) for cls in final)
    assert not any(isinstance(cls("x"), FINAL_ERRORS) for cls in (ffmpeg.FfmpegError, inference.InferenceError))
