"""Local stack, work pools and deployment helpers.

A pipeline's own parts here are modules named after it, found by its registered name: ``deployments/ops/<name>.py``
(its CLI group, and ``local_setup()`` for `make up` where it needs one) and ``deployments/samples/<name>.py`` (its
`make demo` sample).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from types import ModuleType

# this folder under another sys.path entry joins the package: a pipeline's modules kept elsewhere (docs/design.md)
__path__ = pkgutil.extend_path(__path__, __name__)


def pipeline_module(package: str, pipeline: str) -> ModuleType | None:
    """Pipeline ``pipeline``'s module in ``package`` (``deployments.ops``, ``deployments.samples``); None if none."""
    name = f"{package}.{pipeline}"
    return importlib.import_module(name) if importlib.util.find_spec(name) is not None else None
