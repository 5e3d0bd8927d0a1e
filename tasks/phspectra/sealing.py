"""Which fields of a PHSpectra RUN item decide what the stack opens and writes, sealed by the split that created it
(``tasks.core.seal``).

The cube it reads, the store its chunks and fits are written to (and the catalog reads them from), how it is cut
and fitted: a RUN item whose sealed fields are not what its split wrote (an item written straight into the runs
table, or changed since) is never resumed, swept or catalogued.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.core import seal
from tasks.core.seal import SealBroken
from tasks.core.state_store import to_plain

PURPOSE = "phspectra-run"
SEALED = ("survey", "cube_url", "output_url", "chunk_size", "params")


def sealed_fields(run: Mapping[str, Any]) -> dict[str, Any]:
    """The run's fields that decide what is opened and written (an absent one counts as None)."""
    return {name: to_plain(run.get(name)) for name in SEALED}


def seal_run(run: Mapping[str, Any]) -> dict[str, str]:
    """The seal attributes the split stores with the new RUN item; LaunchKeyMissing without a launch key."""
    return seal.seal(PURPOSE, run["PK"], sealed_fields(run))


def check_run(run: Mapping[str, Any]) -> None:
    """SealBroken unless the RUN item is as its split sealed it."""
    seal.verify(PURPOSE, run["PK"], sealed_fields(run), run)


def broken(run: Mapping[str, Any]) -> str | None:
    """None when the RUN item is as its split sealed it, else why it is refused."""
    try:
        check_run(run)
    except SealBroken as error:
        return str(error)
    return None
