"""The pipelines' errors, in one small hierarchy: callers catch a family, not a list of classes.

    PipelineError                      every error the project raises on purpose
    ├── RefusedInput (ValueError)      bad input: the same input fails again, so it is refused with its reason
    ├── LostRace                       another writer won the record: the work is someone else's now
    └── Unavailable                    what the work needs failed or is not there now: the input may be fine
        └── DiskFull (OSError)         a disk had no space left (ENOSPC): the write is undone, the work waits

A pipeline's own class names what went wrong and keeps the builtin base its callers catch (``ValueError``,
``RuntimeError``, ``FileNotFoundError``, ``PermissionError``) beside its family. A lost race at a conditional write
is a result (``state_store.Outcome.STALE`` / ``EXISTS``), not an exception; ``LostRace`` is for work that learns it
lost mid-way and must stop. This module imports nothing of the project's, so every floor may import it.
"""

from __future__ import annotations


class PipelineError(Exception):
    """An error the project raises on purpose; its class says which family it belongs to."""


class RefusedInput(PipelineError, ValueError):
    """Input that can never be used as it is: quarantined, a FAILED record with the reason, or dead-lettered; never
    retried (a retry or a redelivery of the same input fails the same way)."""


class LostRace(PipelineError):
    """Another writer took the record (a claim lost, a stale record): stop without failing it, its owner carries on."""


class Unavailable(PipelineError):
    """What the work needs (a service, a backend, a process, free capacity) failed or is not there now: the input may
    be fine, so the work waits, or is retried or run again later."""


class DiskFull(Unavailable, OSError):
    """A disk had no space left for a write (ENOSPC): the partial write is removed and the work waits for space;
    never a reason to refuse the input (``tasks.core.disk``)."""
